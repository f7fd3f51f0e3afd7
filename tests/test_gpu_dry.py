"""Every notebook under the gpu-dry profile: the gpu profile's model (ResNet-18), device loader, batch grids and every
code path it takes, at smoke's step counts and a quarter of its batch, on whatever device is here (a CPU in CI).

This is what finds a notebook that only breaks on a GPU's profile (12's checkpointing cell on ResNet-18, 10's device
loader with the reader's Datasets) before a GPU is lent: what is left for a GPU is what only a GPU can show.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from notebook_tools import run_under_nbval

from fastlab.profiles import PROFILES

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p.name for p in (ROOT / "notebooks").glob("[01]*.ipynb"))


def test_gpu_dry_takes_the_gpu_profiles_paths():
    """gpu-dry is gpu's model and loader at smoke's steps and batches per epoch, a quarter of smoke's batch, with
    fixed steps (nbval's outputs must not hang on speed)."""
    gpu, dry, smoke = (PROFILES[n] for n in ("gpu", "gpu-dry", "smoke"))
    for key in ("model", "loader", "log_every"):
        assert dry.settings[key] == gpu.settings[key], key
    for key in ("steps", "warmup_steps", "windows"):
        assert dry.settings[key] == smoke.settings[key], key
    assert dry.settings["batch_size"] * 4 == smoke.settings["batch_size"]
    for key in ("train_images", "eval_images"):  # as many batches as smoke's
        assert dry.settings[key] / dry.settings["batch_size"] == smoke.settings[key] / smoke.settings["batch_size"]
    assert dry.fixed_steps and not dry.downloads


# In `make test`: at gpu-dry's batch of 8 the 13 notebooks took 1433 s together on a quiet 2-core Xeon (AVX-512, AMX;
# 2026-12-06, `make gpu-notebooks` rehearsed), 06 the longest at 234 s (its time-to-accuracy runs: 198 s), where at
# smoke's batch of 32 00-03 alone had taken 50 minutes at load 3-6. The budget-spent pass under gpu-dry stays in
# `make test-gpu-dry`.
@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_the_notebook_runs_under_gpu_dry(name):
    r = run_under_nbval(name, {"FASTLAB_PROFILE": "gpu-dry"})
    assert r.returncode == 0, f"{name} fails under gpu-dry:\n{r.stdout[-20000:]}\n{r.stderr[-5000:]}"
