"""A command in its own process group, with a time limit and a stop event: what fastlab.distributed runs torchrun
with, so that a timeout, a Stop button or Ctrl-C never leaves a worker process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path


def run_with_timeout(cmd: Sequence[str], log_path: Path, timeout_s: float, *, env: dict[str, str] | None = None,
                     stop: threading.Event | None = None) -> tuple[int | None, bool, bool]:
    """Run cmd with its output in log_path; kill its whole process group past timeout_s or when stop is set.

    Returns (exit code, timed out, stopped). The command runs in a new session, so killing the group also
    ends the worker processes torchrun started, not just torchrun.
    """
    deadline = time.monotonic() + timeout_s
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            while True:
                try:
                    return proc.wait(timeout=0.2), False, False
                except subprocess.TimeoutExpired:
                    pass
                if stop is not None and stop.is_set():
                    _kill_group(proc)
                    return proc.returncode, False, True
                if time.monotonic() > deadline:
                    _kill_group(proc)
                    return proc.returncode, True, False
        except BaseException:  # KeyboardInterrupt in a notebook: never leave the workers behind
            _kill_group(proc)
            raise


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the process group (torchrun forwards it to its workers), then SIGKILL what is left."""
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=grace)
            # torchrun may be gone while a worker lingers: sweep the group once more
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue
        return
