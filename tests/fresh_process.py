"""pytest in a fresh interpreter: the one way the suite runs tests in a process it has not touched, for a notebook in
a setting the suite's own process cannot take (another profile, spawn, a spent budget: notebook_tools.run_under_nbval)
or a test whose mechanism needs a clean process (a fork after autograd's threads started refuses to run; resident
memory that earlier tests freed hides a leak: ran_in_fresh_process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

FRESH = "FASTLAB_TEST_IN_FRESH_PROCESS"
ROOT = Path(__file__).resolve().parents[1]


def run_pytest(args: list[str], env: dict[str, str] | None = None, site: Path | None = None,
               timeout: float = 600) -> subprocess.CompletedProcess:
    """pytest on `args` from the repository's root in a fresh interpreter, with `env` over this process's environment
    and `site`'s sitecustomize first on PYTHONPATH (for it and every process it starts)."""
    path = os.pathsep.join([*([str(site)] if site else []), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args], cwd=ROOT,
                          env={**os.environ, **(env or {}), "PYTHONPATH": path}, capture_output=True, text=True,
                          timeout=timeout)


def ran_in_fresh_process(nodeid: str, timeout: float = 600) -> bool:
    """False inside the fresh interpreter (run the test's body there); True after running `nodeid` in one and
    asserting it passed (the calling test then returns)."""
    if os.environ.get(FRESH) == "1":
        return False
    r = run_pytest([nodeid], {FRESH: "1"}, timeout=timeout)
    assert r.returncode == 0, f"{nodeid} failed in a fresh process:\n{r.stdout[-8000:]}\n{r.stderr[-3000:]}"
    return True
