"""Why a run's process ended, named when the machine can tell (fastlab.exits): the kernel's out-of-memory killer
from the memory cgroup's oom_kill count, a kill from outside, a crash. Constructed cgroup files: the mechanism."""

from __future__ import annotations

import signal

import pytest

from fastlab import exits


def cgroup_tree(tmp_path, monkeypatch, version: int, kills: int):
    proc = tmp_path / "cgroup"
    root = tmp_path / "fs"
    if version == 2:
        proc.write_text("0::/job/run\n")
        (root / "job" / "run").mkdir(parents=True)
        events = root / "job" / "run" / "memory.events"
        events.write_text(f"low 0\nhigh 0\nmax 3\noom 1\noom_kill {kills}\noom_group_kill 0\n")
    else:
        proc.write_text("9:pids:/\n4:memory:/host/path/not/mounted\n0::/\n")
        (root / "memory").mkdir(parents=True)
        events = root / "memory" / "memory.oom_control"  # a container's view: its cgroup is the mount's root
        events.write_text(f"oom_kill_disable 0\nunder_oom 0\noom_kill {kills}\n")
    monkeypatch.setattr(exits, "PROC_CGROUP", proc)
    monkeypatch.setattr(exits, "CGROUP_ROOT", root)
    return events


@pytest.mark.parametrize("version", [1, 2])
def test_a_sigkill_from_the_out_of_memory_killer_is_named(tmp_path, monkeypatch, version):
    events = cgroup_tree(tmp_path, monkeypatch, version, kills=2)
    before = exits.oom_kills()
    assert before == 2
    events.write_text(events.read_text().replace("oom_kill 2", "oom_kill 3"))  # the kernel killed the run
    said = exits.describe_exit(-signal.SIGKILL, before)
    assert said.startswith("killed by SIGKILL from the kernel's out-of-memory killer") and "batch_size" in said


def test_a_sigkill_without_an_oom_kill_is_from_outside(tmp_path, monkeypatch):
    cgroup_tree(tmp_path, monkeypatch, 2, kills=0)
    said = exits.describe_exit(-signal.SIGKILL, exits.oom_kills())
    assert said == ("killed by SIGKILL from outside fastlab (a person's kill, a job scheduler or the system shutting "
                    "down)")


def test_without_a_memory_cgroup_a_sigkill_says_what_it_cannot_tell(tmp_path, monkeypatch):
    monkeypatch.setattr(exits, "PROC_CGROUP", tmp_path / "absent")
    assert exits.oom_kills() is None
    said = exits.describe_exit(-signal.SIGKILL, exits.oom_kills())
    assert "this machine does not say which" in said and "out-of-memory killer" in said


def test_crashes_and_other_ends_in_words():
    assert exits.describe_exit(-signal.SIGSEGV).startswith("killed by SIGSEGV: a crash in native code")
    assert exits.describe_exit(-signal.SIGTERM) == ("killed by SIGTERM from outside fastlab (a person's kill, a job "
                                                    "scheduler or the system shutting down)")
    assert exits.describe_exit(-signal.SIGKILL, 0, killed_here=True) == "killed by SIGKILL"
    assert exits.describe_exit(1) == "exit code 1" and exits.describe_exit(None) == "still running when given up"
    assert exits.describe_exit(-200) == "killed by signal 200"
