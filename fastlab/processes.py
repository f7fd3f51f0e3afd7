"""A command in its own process group, with a time limit and a stop event: what fastlab.distributed runs torchrun
with, so that a timeout, a Stop button, Ctrl-C or the caller's own end (a kernel shut down, SIGTERM, SIGHUP) never
leaves a worker process behind."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

_PR_SET_PDEATHSIG = 1  # prctl(2): the signal the kernel sends a process when the thread that started it ends


def _ends_with_caller() -> None:
    """In the command's process before it starts (Linux): SIGTERM from the kernel when its caller ends, which
    torchrun passes on to its workers; elsewhere the command outlives a killed caller."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def run_with_timeout(cmd: Sequence[str], log_path: Path, timeout_s: float, *, env: dict[str, str] | None = None,
                     stop: threading.Event | None = None) -> tuple[int | None, bool, bool]:
    """Run cmd with its output in log_path; kill its whole process group past timeout_s or when stop is set.

    Returns (exit code, timed out, stopped). The command runs in a new session, so killing the group also
    ends the worker processes torchrun started, not just torchrun.
    """
    deadline = time.monotonic() + timeout_s
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                preexec_fn=_ends_with_caller if sys.platform.startswith("linux") else None)
        try:
            while True:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    return proc.wait(timeout=0.2), False, False
                stopped = stop is not None and stop.is_set()
                if stopped or time.monotonic() > deadline:
                    _kill_group(proc)
                    return proc.returncode, not stopped, stopped
        except BaseException:  # KeyboardInterrupt in a notebook: never leave the workers behind
            _kill_group(proc)
            raise


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the process group (torchrun forwards it to its workers), then SIGKILL what is left."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5.0)
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun may be gone while a worker lingers
    except ProcessLookupError:  # the whole group is gone
        pass
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5.0)
