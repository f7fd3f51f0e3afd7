"""Run one test again in a fresh interpreter: for a test whose mechanism needs a process the suite has not touched
(a fork after autograd's threads started refuses to run; resident memory that earlier tests freed hides a leak)."""

from __future__ import annotations

import os
import subprocess
import sys

FRESH = "FASTLAB_TEST_IN_FRESH_PROCESS"


def ran_in_fresh_process(nodeid: str, timeout: float = 600) -> bool:
    """False inside the fresh interpreter (run the test's body there); True after running `nodeid` in one and
    asserting it passed (the calling test then returns)."""
    if os.environ.get(FRESH) == "1":
        return False
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", nodeid],
                       env={**os.environ, FRESH: "1"}, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{nodeid} failed in a fresh process:\n{r.stdout[-8000:]}\n{r.stderr[-3000:]}"
    return True
