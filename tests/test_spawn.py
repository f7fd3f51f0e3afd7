"""The notebooks that start DataLoader workers, run as a macOS or Windows laptop runs them: under `spawn`.

On Linux a worker is forked and inherits everything; under spawn (the default on macOS and Windows) it starts a fresh
interpreter and rebuilds the Dataset by importing its class by name. tests/spawn/sitecustomize.py makes spawn the
default start method of every process started with that folder on PYTHONPATH: pytest, the notebook's kernel, and
(through fastlab's own hand-over of the start method to a run's child) the workers of fastlab's runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from notebook_tools import run_under_nbval

ROOT = Path(__file__).resolve().parents[1]
SPAWN_SITE = Path(__file__).resolve().parent / "spawn"
WORKER_LOOP = "torch.utils.data._utils.worker._worker_loop"  # what a DataLoader worker process runs
# The notebooks that start DataLoader workers under the smoke profile (num_workers > 0 in fastlab's runs or in the
# notebook's own loops): each runs whole under nbval, so only these, and each must really start a worker.
SPAWN_NOTEBOOKS = ["01_data_loading.ipynb", "08_profiling.ipynb", "09_all_together.ipynb", "10_your_own_model.ipynb"]


def spawn_env(log: Path) -> dict[str, str]:
    """This process's environment with spawn the default start method, and every process start logged to `log`."""
    path = os.pathsep.join([str(SPAWN_SITE), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, "PYTHONPATH": path, "FASTLAB_WORKER_LOG": str(log)}


def started(log: Path) -> list[tuple[str, str]]:
    """(start method, target) of each process the log recorded."""
    lines = log.read_text().splitlines() if log.exists() else []
    return [tuple(line.split(" ", 1)) for line in lines]


def run(args: list[str], log: Path, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=spawn_env(log), capture_output=True, text=True,
                          timeout=timeout)


NOTEBOOK_CELL_DATASET = """
import multiprocessing, sys
import torch
from torch.utils.data import DataLoader, Dataset

class CellDataset(Dataset):  # defined where a notebook cell would define it: in __main__
    def __len__(self):
        return 4
    def __getitem__(self, i):
        return torch.tensor([i])

assert multiprocessing.get_start_method() == "spawn", multiprocessing.get_start_method()
list(DataLoader(CellDataset(), num_workers=1))
"""


def test_the_spawn_site_reproduces_the_macos_pitfall(tmp_path):
    """Under tests/spawn, a Dataset class defined in __main__ (a notebook cell) breaks DataLoader workers, as on a
    Mac; under Linux's fork the same script runs."""
    log = tmp_path / "started.log"
    r = run(["-c", NOTEBOOK_CELL_DATASET], log, timeout=300)
    assert r.returncode != 0 and "Can't get attribute 'CellDataset'" in r.stderr, r.stdout + r.stderr
    assert started(log) == [("spawn", WORKER_LOOP)]


@pytest.mark.slow  # minutes under spawn: every worker imports torch afresh (01 starts about 80)
@pytest.mark.timeout(1800)  # past the suite's 900 s: 01 took 16 minutes on a loaded 2-core machine
@pytest.mark.parametrize("name", SPAWN_NOTEBOOKS)
def test_the_notebook_runs_with_spawned_dataloader_workers(name, tmp_path):
    """The notebook runs whole under nbval with spawn the default, and its DataLoader workers were spawned."""
    log = tmp_path / "started.log"
    r = run_under_nbval(name, {"FASTLAB_WORKER_LOG": str(log)}, SPAWN_SITE)
    assert r.returncode == 0, f"{name} fails under spawn:\n{r.stdout[-20000:]}\n{r.stderr[-5000:]}"
    workers = {method for method, target in started(log) if target == WORKER_LOOP}
    assert workers, f"{name} started no DataLoader worker: it does not belong in SPAWN_NOTEBOOKS"
    assert workers == {"spawn"}, f"{name}: DataLoader workers started with {sorted(workers)}, not only spawn"
