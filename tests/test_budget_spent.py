"""Every notebook runs whole with its time budget already spent: each registered comparison's runs are refused.

On a loaded machine a notebook's budget (fastlab.budget) can run out before its last comparison, whose runs then do
not start (status time_limited, extras budget="not started"); every cell that formats a comparison's figures must
still run, saying what did not run and why. tests/budget_site/sitecustomize.py gives every notebook a budget of 0 s
on a profile of fixed steps (smoke, gpu-dry: nothing else changes) in every process started with that folder on
PYTHONPATH, and logs each refusal to FASTLAB_BUDGET_LOG, so the test also sees that the runs really were refused.

The pass runs under smoke in make test, and under gpu-dry too (the gpu profile's ResNet-18, device loader and paths at
a quarter of smoke's batch) in `make test-gpu-dry` (FASTLAB_GPU_DRY_NOTEBOOKS=1): with the comparisons refused, what is left of a
notebook under gpu-dry is its cells' own runs on ResNet-18, and on a loaded 2-core CPU 09's alone took 21 minutes,
past what CI's time leaves.

The `# NBVAL_CHECK_OUTPUT` cells stay checked: each prints validation errors of a config or a lesson's arguments,
never a run's figure, so a refused run must not change them (if one did, that would be the defect to see).
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest
from notebook_tools import run_under_nbval

import fastlab.exercise  # noqa: F401  (declares each notebook's exercise a part of its budget)
import fastlab.lessons
from fastlab.budget import parts_of
from fastlab.comparisons import REGISTERED

ROOT = Path(__file__).resolve().parents[1]
BUDGET_SITE = Path(__file__).resolve().parent / "budget_site"
NOTEBOOKS = sorted(p.name for p in (ROOT / "notebooks").glob("[01]*.ipynb"))


def spent_env(log: Path) -> dict[str, str]:
    """This process's environment on the smoke profile with every notebook's budget spent, refusals logged to `log`."""
    path = os.pathsep.join([str(BUDGET_SITE), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, "PYTHONPATH": path, "FASTLAB_PROFILE": "smoke", "FASTLAB_BUDGET_LOG": str(log)}


def refused(log: Path) -> list[tuple[str, str, str]]:
    """(comparison, run's label, reason) of each refusal the log recorded, and ("(own run)", label, reason) of each cell's
    own run cut short."""
    lines = log.read_text().splitlines() if log.exists() else []
    return [tuple(line.split("\t", 2)) for line in lines]


def called_by(notebook: str) -> set[str]:
    """The registered comparisons (every lesson imported: each registers its own) whose function a code cell of
    `notebook` calls by name; a comparison a lesson's function calls for it is not seen here."""
    for module in pkgutil.iter_modules(fastlab.lessons.__path__):
        importlib.import_module(f"fastlab.lessons.{module.name}")
    cells = json.loads((ROOT / "notebooks" / notebook).read_text())["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    return {name for name, fn in REGISTERED.items() if re.search(rf"\b{fn.__name__}\(", code)}


def test_the_notebooks_call_registered_comparisons():
    """The check below can fail: most notebooks call a registered comparison whose runs must be refused."""
    assert len([n for n in NOTEBOOKS if called_by(n)]) >= 10


def test_the_budget_site_refuses_a_comparisons_runs_and_logs_them(tmp_path):
    """Under tests/budget_site a registered comparison's run is refused and logged; a single run is cut short, and
    logged."""
    log = tmp_path / "refused.log"
    script = ("from fastlab import budget, config, train\n"
              "from fastlab.tools.timings import begin_notebook\n"
              "begin_notebook('00_start_here.ipynb')\n"
              "cfg = config.config_for('smoke')\n"
              "with budget.within('00_start_here:probe', None):\n"
              "    r = train.run(cfg, label='refused', progress=False)\n"
              "print(r.status, r.budget_cut)\n"
              "print(train.run(cfg, label='single', progress=False).status)\n")
    r = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=spent_env(log), capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines()[-1] == "ok" and "time_limited not started\n" in r.stdout, r.stdout
    assert [(c, label) for c, label, _ in refused(log)] == [("00_start_here:probe", "refused"), ("(own run)", "single")]
    assert "budget: 'single' is cut to a short run" in r.stdout


@pytest.mark.slow  # each notebook runs whole under nbval: 2-5 min each on a 2-core CPU at load 10-40 (09: 14 min)
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("profile", ["smoke"] + (["gpu-dry"] if os.environ.get("FASTLAB_GPU_DRY_NOTEBOOKS") == "1"
                                                  else []))
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_the_notebook_runs_with_its_budget_spent(name, profile, tmp_path):
    """The notebook runs whole under nbval with every registered comparison's and held part's runs refused, its
    exercise's check and every comparison its cells call among them (a notebook that calls none may refuse nothing:
    it runs whole all the same), and its cells' own runs cut short."""
    log = tmp_path / "refused.log"
    r = run_under_nbval(name, {"FASTLAB_PROFILE": profile, "FASTLAB_BUDGET_LOG": str(log)}, BUDGET_SITE)
    assert r.returncode == 0, f"{name} fails under {profile} with its budget spent:\n{r.stdout[-20000:]}\n{r.stderr[-5000:]}"
    calls = called_by(name)  # imports every lesson first, so REGISTERED holds every comparison
    comparisons = {c for c, _, _ in refused(log) if c != "(own run)"}
    cut = [label for c, label, _ in refused(log) if c == "(own run)"]
    if "fastlab.run(" in (ROOT / "notebooks" / name).read_text():
        assert cut, f"{name}: its cells' own runs were not cut short with the budget spent"
    held = set(parts_of(name.removesuffix(".ipynb")))
    assert comparisons <= set(REGISTERED) | held, f"{name}: refused runs outside its budget's parts: {comparisons}"
    exercise = {p for p in held if p.endswith(":exercise")}
    assert exercise <= comparisons, f"{name}: its exercise's check ran with the budget spent"
    assert calls <= comparisons, (
        f"{name}: calls {sorted(calls)} but only the runs of {sorted(comparisons)} were refused")
