"""Issue 53 items 3 and 4: the gpu profile sized by time on a GPU (estimated from the bundled H200 step times, on
constructed timings for a slower GPU) and `make gpu-notebooks` (its parts and caps, without a GPU)."""

from __future__ import annotations

import json

import gpu_estimate
import gpu_notebooks
import notebook_timings
import pytest
import torch

from fastlab import budget
from fastlab.calibration import Calibration
from fastlab.config import config_for, time_sizing
from fastlab.lessons import compile_export, data_loading
from fastlab.tools import timings

FAST_NOTEBOOK_S, FAST_WORKBOOK_S = 180.0, 25 * 60.0  # issue 53: a notebook, and the workbook, on an H200


@pytest.fixture(autouse=True)
def _fast(monkeypatch):
    monkeypatch.delenv("FASTLAB_THOROUGH", raising=False)
    monkeypatch.delenv("FASTLAB_REPEATS", raising=False)
    yield
    budget.stop()


def constructed(step: float) -> gpu_estimate.StepTimes:
    """A GPU whose every step takes `step` seconds in a window and three times that a timed step (as the H200's)."""
    return gpu_estimate.StepTimes("constructed GPU", 16, {}, {"any": (step, 3 * step)}, {}, 15.0)


# ---------------------------------------------------------------- the estimate (bundled H200 step times)


def test_each_notebook_fast_version_fits_three_minutes_and_the_workbook_25_on_the_h200():
    rows = gpu_estimate.estimate_notebooks("gpu")
    assert {r.notebook for r in rows} >= {"01_data_loading", "07_compile_and_export", "09_all_together"}
    assert all(r.seconds <= FAST_NOTEBOOK_S for r in rows), [(r.notebook, round(r.seconds)) for r in rows]
    assert sum(r.seconds for r in rows) <= FAST_WORKBOOK_S
    sweep = next(r for r in rows if r.notebook == "01_data_loading").comparisons["01_data_loading:num_workers"]
    assert "its own reference runs on the NVIDIA H200" in sweep[1]  # labelled with where its step time comes from


def test_the_estimate_command_prints_each_notebook_and_its_source(capsys):
    assert gpu_estimate.main(["gpu"]) == 0
    out = capsys.readouterr().out
    assert "fastlab/reference/nvidia-h200.json" in out and "the whole workbook" in out
    assert "09_all_together: " in out
    assert gpu_estimate.main(["smoke"]) == 0
    assert "fixed steps" in capsys.readouterr().out


# ---------------------------------------------------------------- a GPU ten times slower than the H200


def test_a_gpu_ten_times_slower_keeps_the_budget_with_fewer_steps_or_repeats(monkeypatch):
    fast, slow = constructed(0.02), constructed(0.2)
    monkeypatch.setattr(gpu_estimate, "COMPILED_ARMS", {})
    base = config_for("gpu")
    share = 50.0
    name = "03_cudnn_benchmark_and_channels_last:channels_last"
    t_fast, how_fast = gpu_estimate.comparison_seconds(name, base, share, fast)
    t_slow, how_slow = gpu_estimate.comparison_seconds(name, base, share, slow)

    def work(how: str) -> int:  # repeats x steps, from "4 arms x 2 repeats x 50 steps"
        parts = how.split(" x ")
        return int(parts[1].split()[0]) * int(parts[2].split()[0])

    assert work(how_slow) < work(how_fast)  # cut: fewer steps, then fewer repeats
    run_slow = budget.run_seconds(0.6, 50, base.warmup_steps, -(-base.eval_images // base.batch_size))
    assert t_slow <= share + run_slow + budget.run_seconds(0.2, 4, 2)  # its share, one started run, the calibration
    rows_fast = {r.notebook: r.seconds for r in gpu_estimate.estimate_notebooks("gpu", fast)}
    rows_slow = {r.notebook: r.seconds for r in gpu_estimate.estimate_notebooks("gpu", slow)}
    for notebook, seconds in rows_slow.items():
        assert seconds >= rows_fast[notebook]
        assert seconds <= rows_fast[notebook] * 10 + 1e-6  # at most 10x, less where the budget holds it


def test_the_first_line_scales_a_gpu_timing_ten_times_up_to_the_budget(tmp_path, monkeypatch):
    path = tmp_path / "timings.json"
    monkeypatch.setenv("FASTLAB_TIMINGS", str(path))
    slower = Calibration(step_seconds=0.2, workload={}, fingerprint={}, steps_measured=4, measured_at="now")
    monkeypatch.setattr("fastlab.calibration.calibrate", lambda cfg, measure=None: slower)
    held = budget.duration(time_sizing("gpu")["notebook_seconds"])
    for seconds, shown in ((6.0, "estimated here now: 60 s"), (60.0, f"estimated here now: {held}")):
        notebook_timings.record_timing(path, "08_profiling", "gpu", seconds, "ok", "NVIDIA H200", "2026-12-04T00:00",
                              step_seconds=0.02)
        line = timings.begin_notebook("08_profiling", "gpu")
        assert shown in line  # 10x the H200's time; the second held to gpu's notebook budget
    assert budget.scaled_estimate(60.0, 0.02, 0.2, None) == pytest.approx(600.0)


# ---------------------------------------------------------------- the sizes that make it fit


def test_the_gpu_worker_sweep_is_bounded_by_time_and_the_thorough_one_is_whole(monkeypatch):
    gpu = config_for("gpu")
    assert data_loading.sweep_counts(gpu, 16) == [0, 1, 2, 4, 8, 16]  # oversubscription past its sweep_seconds
    assert data_loading.sweep_counts(config_for("cpu"), 2) == data_loading.worker_counts(2)  # no sweep_seconds
    monkeypatch.setenv("FASTLAB_THOROUGH", "1")
    assert data_loading.sweep_counts(gpu, 16) == data_loading.worker_counts(16)


def test_max_autotune_runs_in_the_thorough_gpu_version_only(monkeypatch):
    to_run, why = compile_export.modes_plan(config_for("gpu"))
    assert "max-autotune" not in to_run and "thorough" in why["max-autotune"]
    assert "max-autotune" in compile_export.modes_plan(config_for("cpu"))[0]
    monkeypatch.setenv("FASTLAB_THOROUGH", "1")
    assert "max-autotune" in compile_export.modes_plan(config_for("gpu"))[0]


# ---------------------------------------------------------------- make gpu-notebooks


def test_gpu_notebooks_without_cuda_prints_one_line_and_exits_0(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_notebooks.main([]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "no CUDA GPU" in out


def test_notebooks_run_in_parallel_within_their_cap_and_are_logged_as_they_end(monkeypatch, tmp_path):
    caps: list[float] = []

    def fake_run(notebook, out, env, cap):
        caps.append(cap)
        return {"notebook": notebook.stem, "seconds": 1.0, "status": "ok"}

    monkeypatch.setattr(gpu_notebooks, "run_capped", fake_run)
    outcomes = gpu_notebooks.run_notebooks(["a", "b", "c"], tmp_path, {"FASTLAB_PROFILE": "smoke"}, 60.0, jobs=2)
    assert [o["notebook"] for o in outcomes] == ["a", "b", "c"]
    assert all(0 < c <= min(gpu_notebooks.NOTEBOOK_CAP_S, 60.0) for c in caps)
    logged = [json.loads(line) for line in (tmp_path / "notebooks.jsonl").read_text().splitlines()]
    assert sorted(o["notebook"] for o in logged) == ["a", "b", "c"] and logged[0]["profile"] == "smoke"
    spent = gpu_notebooks.run_notebooks(["d"], tmp_path, {"FASTLAB_PROFILE": "smoke"}, 0.0, jobs=1)
    assert spent[0]["status"].startswith("not started")


def test_enough_kernels_at_once_for_the_estimate_to_fit_the_cap(monkeypatch):
    monkeypatch.setattr("fastlab.measure.usable_cpu_count", lambda: 16)
    assert gpu_notebooks.makespan([100.0, 100.0, 60.0, 40.0], 2) == 160.0  # 100+60 and 100+40, longest first
    assert gpu_notebooks.default_jobs([100.0] * 4, 200.0) == 2
    assert gpu_notebooks.default_jobs([130.0] * 11 + [20.0] * 3, 200.0) == 11  # one long notebook a kernel
    assert gpu_notebooks.default_jobs([100.0] * 40, 200.0) == 14  # at most the cores less two
    assert gpu_notebooks.default_jobs([], 200.0) == 14
    estimates = [e.seconds for e in gpu_estimate.estimate_notebooks("gpu")]
    assert gpu_notebooks.makespan(estimates, gpu_notebooks.default_jobs(estimates, 200.0)) <= 200.0
    assert sum(gpu_notebooks.CAPS.values()) <= gpu_notebooks.TOTAL_S == 9 * 60  # every part within 9 minutes


def test_a_notebook_past_its_cap_is_stopped_with_its_kernel(tmp_path, monkeypatch):
    notebook = tmp_path / "slow.ipynb"
    notebook.write_text("{}")
    monkeypatch.setattr(gpu_notebooks.sys, "executable", "sleep")  # a child that outlives its cap
    monkeypatch.setattr(gpu_notebooks, "ROOT", tmp_path)
    real_popen = gpu_notebooks.subprocess.Popen

    def popen(cmd, **kw):
        return real_popen(["sleep", "30"], **kw)

    monkeypatch.setattr(gpu_notebooks.subprocess, "Popen", popen)
    outcome = gpu_notebooks.run_capped(notebook, tmp_path, {}, cap=1.0)
    assert outcome["status"] == "stopped at its cap of 1 s" and outcome["seconds"] < 10


def test_a_part_past_its_cap_is_stopped_and_the_run_goes_on(tmp_path, monkeypatch):
    real_popen = gpu_notebooks.subprocess.Popen
    started: list[list[str]] = []

    def popen(cmd, **kw):
        started.append(cmd)
        return real_popen(["sleep", "30"], **kw)

    monkeypatch.setattr(gpu_notebooks.subprocess, "Popen", popen)
    said = gpu_notebooks.capped_part("reference", tmp_path, "smoke", seconds=1.0)
    assert said.startswith("stopped at its cap of 1 s") and "--part" in started[0]


def test_the_estimate_sizes_by_the_reference_machines_cores_and_gives_this_ones_back():
    from fastlab import measure

    here = measure.usable_cpu_count()
    with measure.assumed_cores(here + 14):
        assert measure.usable_cpu_count() == here + 14
        from fastlab.lessons import data_loading
        assert data_loading.usable_cpu_count() == here + 14  # a lesson's own import of it sees the same count
    assert measure.usable_cpu_count() == here
