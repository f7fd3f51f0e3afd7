"""Why a run's process ended without a result, in words: its exit code or signal, and who sent the signal where the
machine can tell: the kernel's out-of-memory killer (read from the memory cgroup's oom_kill count, which rises when
it kills), a kill from outside fastlab, or a crash in native code."""

from __future__ import annotations

import signal
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
CRASH_SIGNALS = {"SIGSEGV", "SIGBUS", "SIGABRT", "SIGILL", "SIGFPE"}
OUTSIDE_SIGNALS = {"SIGKILL", "SIGTERM", "SIGHUP", "SIGINT", "SIGQUIT"}


def _candidates() -> list[Path]:
    """The files that may hold this process's memory cgroup's oom_kill count: cgroup v2's memory.events, v1's
    memory.oom_control; each under the path /proc/self/cgroup names, and at the root (a container's own view)."""
    try:
        lines = PROC_CGROUP.read_text().splitlines()
    except OSError:
        return []
    found: list[Path] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        if controllers == "":
            found += [CGROUP_ROOT / rel.lstrip("/") / "memory.events", CGROUP_ROOT / "memory.events"]
        elif "memory" in controllers.split(","):
            found += [CGROUP_ROOT / "memory" / rel.lstrip("/") / "memory.oom_control",
                      CGROUP_ROOT / "memory" / "memory.oom_control"]
    return found


def oom_kills() -> int | None:
    """How many processes the kernel's out-of-memory killer has killed in this process's memory cgroup; None where
    no count can be read (macOS, Windows, no memory cgroup)."""
    for path in _candidates():
        try:
            text = path.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
    return None


def describe_exit(code: int | None, oom_kills_before: int | None = None, killed_here: bool = False) -> str:
    """A process's end in words. oom_kills_before: oom_kills() when it started (None: not read), so a SIGKILL the
    out-of-memory killer sent is named as such; killed_here: fastlab itself ended it (its caller says why)."""
    if code is None:
        return "still running when given up"
    if code >= 0:
        return f"exit code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        return f"killed by signal {-code}"
    said = f"killed by {name}"
    if killed_here:
        return said
    if name == "SIGKILL" and oom_kills_before is not None:
        now = oom_kills()
        if now is not None and now > oom_kills_before:
            return (f"{said} from the kernel's out-of-memory killer: this machine's (or container's) memory ran out; "
                    "a smaller batch_size, fewer eval_images or fewer num_workers need less")
    if name in CRASH_SIGNALS:
        return f"{said}: a crash in native code (torch, a driver or a library)"
    if name in OUTSIDE_SIGNALS:
        who = ("a person's kill, a job scheduler or the system shutting down" if name != "SIGKILL" or
               oom_kills_before is not None else "the out-of-memory killer, a person's kill or a job scheduler: "
               "this machine does not say which")
        return f"{said} from outside fastlab ({who})"
    return said
