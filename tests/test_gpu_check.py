"""Issue 24, the GPU path's second review: each mechanism shown on a CPU (CUDA's answers mocked where needed)."""

from __future__ import annotations

import importlib
import itertools
import os
import subprocess
import sys
import textwrap
import time
import types
import weakref

import gpu_check
import pytest
import torch

import fastlab
from fastlab import bench, measure, outcomes, train
from fastlab.config import config_for
from fastlab.lessons.data_loading import describe_data_wait
from fastlab.results import RunResult, TtaRecord, load_results, save_results

advise = importlib.import_module("fastlab.advisor")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def quick():
    return config_for("smoke", steps=4, warmup_steps=1, windows=2, train_images=128, eval_images=64)


# ---------------------------------------------------------------- 1. channels_last: CUDA passes only


def test_channels_last_check_records_cuda_passes_only_not_preflights_cpu_model(quick):
    cfg = quick.replace(channels_last=True, model="resnet18", batch_size=8, steps=2, windows=1)
    # recording every device shows the defect: preflight's CPU model (no channels_last weights) comes first
    every: list[tuple[bool, bool]] = []
    r = fastlab.run(cfg, model=gpu_check.layout_recording_net(every, device_type="cpu"),
                    progress=False)
    assert r.ok and every[0] == (True, False) and (True, True) in every
    # the check's recorder: this CPU run made no CUDA pass, so nothing is recorded (on a GPU, the training passes)
    cuda_only: list[tuple[bool, bool]] = []
    r = fastlab.run(cfg, model=gpu_check.layout_recording_net(cuda_only), progress=False)
    assert r.ok and cuda_only == []


# ---------------------------------------------------------------- 2. data wait is next(batches) alone


class _SlowToCopy:
    """A batch tensor whose copy to the device takes 30 ms (as a sync behind queued kernels would)."""

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t

    def to(self, device, non_blocking: bool = False) -> torch.Tensor:
        time.sleep(0.03)
        return self.t


def test_a_slow_copy_to_the_device_is_not_counted_as_data_wait(monkeypatch, quick):
    from fastlab import training

    monkeypatch.setenv("FASTLAB_ISOLATION", "thread")  # the mock below lives in this process
    real = training.forever

    def slow(loader, sampler=None):
        return [(_SlowToCopy(x), _SlowToCopy(y)) for x, y in itertools.islice(real(loader, sampler), 10)]

    monkeypatch.setattr(training, "forever", slow)
    r = fastlab.run(quick.replace(warmup_steps=3), progress=False)
    assert r.ok and len(r.copy_seconds) == 2  # the sampled warm-up steps: the copy timed on its own
    assert all(c >= 0.06 for c in r.copy_seconds)  # x and y, 30 ms each
    assert all(w < 0.03 for w in r.data_wait_seconds)


def _cuda_result(wait: float, copy: float) -> RunResult:
    steps = 10
    return RunResult(config={"warmup_steps": 0, "loader": "dataloader", "num_workers": 0, "batch_size": 512},
                     label="gpu", env={"device_type": "cuda", "usable_cpus": 8}, images_per_step=512,
                     window_throughput=[1000.0, 1000.0], step_seconds=[0.1] * steps,
                     data_wait_seconds=[wait * 0.1] * steps, copy_seconds=[copy * 0.1] * steps)


def test_the_copy_is_shown_apart_from_data_wait_wherever_data_wait_is_shown(tmp_path):
    r = _cuda_result(wait=0.05, copy=0.6)  # a GPU-bound run whose synchronous copy waits for the kernels
    assert r.data_wait_fraction() == pytest.approx(0.05) and r.copy_fraction() == pytest.approx(0.6)
    text = describe_data_wait(r)
    assert text.startswith("5% of step time was spent waiting for data: mostly compute-bound")
    assert "another 60%" in text and "not counted as data wait" in text
    assert "| 5% + 60% copy |" in bench.markdown_table([r])
    assert "data wait 5%, copy to device 60%" in r.summary()
    assert advise._data_bound(r, r.config, gpu=True) is None  # no data bottleneck is advised on a sync
    fed = _cuda_result(wait=0.5, copy=0.1)
    finding = advise._data_bound(fed, fed.config, gpu=True)
    assert finding is not None and any("copy" in e.what for e in finding.evidence)
    # kept in results files like the other per-step lists
    save_results(tmp_path / "r.json", [r])
    assert load_results(tmp_path / "r.json")[0].copy_seconds == r.copy_seconds
    # a CPU run has no device to copy to: nothing is shown
    cpu = RunResult(config={}, env={"device_type": "cpu"}, window_throughput=[1.0], step_seconds=[1.0],
                    data_wait_seconds=[0.1], copy_seconds=[0.0])
    assert "copy" not in cpu.summary() and "copy" not in describe_data_wait(cpu)


# ---------------------------------------------------------------- 3. the OOM rerun uses the probes' configuration


def test_gpu_check_oom_rerun_uses_the_probes_own_configuration(monkeypatch):
    from fastlab.lessons import batch_size

    fits = 24  # the largest batch that fits, in this pretend GPU
    calls: list = []

    def fake_run(cfg, model=None, progress=True, **kw):
        calls.append(cfg)
        oom = cfg.batch_size > fits
        return RunResult(config=cfg.to_dict(), status="failed" if oom else "ok",
                         error="out of memory at batch_size=..." if oom else None)

    monkeypatch.setattr(fastlab, "run", fake_run)
    monkeypatch.setattr(batch_size, "resolve_device", lambda name: torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(total_memory=2**30))
    text = gpu_check._oom()
    probes = [c for c in calls[1:-1]]
    rerun = calls[-1]
    last_fit = [c for c in probes if c.batch_size == fits][-1]
    assert rerun.batch_size == fits and rerun == last_fit, (rerun, last_fit)
    assert f"rerun at {fits}: ok" in text


# ---------------------------------------------------------------- 4. a fixed budget per rung; a budget stop is no trap


def test_a_stop_by_the_harness_budget_is_not_a_trap():
    below = RunResult(config={}, label="below", window_throughput=[100, 100])
    stopped = RunResult(config={}, status="time_limited", error="stopped at its max_seconds=3 budget",
                        window_throughput=[90, 95], stopped_by="max_seconds")
    assert bench.drop_reason(stopped, below) is None
    slow = RunResult(config={}, status="time_limited", window_throughput=[30, 35], stopped_by="max_seconds")
    assert "trap" in bench.drop_reason(slow, below)  # judged by its windows, like any rung
    unmeasured = RunResult(config={}, status="time_limited", stopped_by="max_seconds")
    said = bench.drop_reason(unmeasured, below)  # no step time either: nothing known, so no word on a trap
    assert said.startswith("not measured:") and "trap" not in said
    # time to accuracy: a first seed stopped by max_seconds ends nothing, whatever its speed
    tta = TtaRecord(0.5, False, why_not="time budget spent")
    seed = RunResult(config={"warmup_steps": 0}, status="time_limited", window_throughput=[1.0], steps_done=9,
                     step_seconds=[1.0] * 9, images_per_step=1, tta=tta, stopped_by="max_seconds")
    assert outcomes.TrapLimits(max_training_seconds=5, max_seconds_per_image=1e-6).trap(seed) is None


def test_runs_record_which_budget_stopped_them(monkeypatch, quick):
    monkeypatch.setenv("FASTLAB_ISOLATION", "thread")  # the slow callback must hold up the run's own steps

    def slow(done, total):
        time.sleep(0.2)

    r = fastlab.run(quick.replace(steps=40, windows=4, max_seconds=0.5), on_step=slow, progress=False)
    assert r.status == "time_limited" and r.stopped_by == "max_seconds"
    limited = fastlab.time_to_accuracy(quick.replace(warmup_steps=0), target=1.01, seeds=(0,), eval_every=2,
                                       progress=False, limits=outcomes.TrapLimits(max_training_seconds=1e-6))
    assert limited.runs[0].stopped_by == "max_training_seconds"


def test_ladder_rungs_get_a_fixed_budget_and_none_starts_once_the_whole_budget_is_spent(monkeypatch, native_bf16):
    native_bf16(True)  # the third rung (bf16) is an ordinary rung here, as on a GPU: not a trap demonstration
    clock = [0.0]
    seen: list[float] = []

    def fake_run(cfg, label="run", progress=True, **kwargs):
        seen.append(cfg.max_seconds)
        clock[0] += 40.0  # each rung's wall time: set-up, compile, evaluation and all
        budget_stop = len(seen) == 3  # the third rung stops at the harness's budget, at an ordinary speed
        return RunResult(config=cfg.to_dict(), label=label, status="time_limited" if budget_stop else "ok",
                         window_throughput=[100.0, 100.0], stopped_by="max_seconds" if budget_stop else "")

    monkeypatch.setattr(bench, "run", fake_run)
    monkeypatch.setattr("fastlab.train.run", fake_run)  # a rung that is a known trap here runs through it
    monkeypatch.setattr(bench.time, "monotonic", lambda: clock[0])
    base = config_for("smoke")
    rungs = bench.ladder(base)
    not_run: dict[str, str] = {}
    results = bench.run_ladder(base, rungs, progress=False, max_seconds=3.0, budget_s=100.0, not_run=not_run,
                               repeats=1)
    assert seen == [3.0, 3.0, 3.0]  # started at 0, 40 and 80 s; at 120 s the budget is spent
    assert [r.rung for r in results] == [r.name for r in rungs[:3]]
    assert list(not_run) == [r.title for r in rungs[3:]] and all("budget" in v for v in not_run.values())
    assert not results[2].dropped  # stopped by the harness's budget: carried up, not a trap


def test_gpu_check_ladders_use_a_fixed_rung_budget(monkeypatch, tmp_path):
    calls = []

    def fake_ladder(base, rungs, progress, on_update, max_seconds, budget_s, not_run, repeats):
        calls.append((max_seconds, budget_s, repeats))
        datasets.append(base.dataset)
        on_update([RunResult(config=base.to_dict(), label="naive", window_throughput=[1.0])])
        return []

    monkeypatch.setattr(bench, "run_ladder", fake_ladder)
    datasets: list[str] = []
    gpu_check.run_ladders(tmp_path, budget_s=120.0)
    assert calls == [(gpu_check.LADDER_RUNG_SECONDS, 60.0, 1)] * 2
    assert datasets == ["synthetic"] * 2  # no CIFAR-10 download (a 15 s socket timeout offline) from the budget
    assert (tmp_path / "ladder-resnet18.json").exists()  # saved as each run ends
    gpu_check.run_ladders(tmp_path, budget_s=120.0, profile="smoke", repeats=2)
    assert calls[-1] == (gpu_check.LADDER_RUNG_SECONDS, 60.0, 2)


# ---------------------------------------------------------------- 5. what gpu-check needs, named before it starts


def test_gpu_check_names_a_missing_package_in_one_line_before_starting(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "PIL", None)  # `import PIL` now raises ImportError
    ran: list[str] = []
    monkeypatch.setattr(gpu_check, "CHECKS", [("a check", lambda: ran.append("ran") or "")])
    assert gpu_check.main(["--out", str(tmp_path)]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and "missing Pillow" in lines[0] and ran == []


def test_a_torchvision_built_for_another_torch_counts_as_missing(monkeypatch):
    import importlib

    real = importlib.import_module

    def fake_import(name, *args):
        if name == "torchvision":
            raise RuntimeError("operator torchvision::nms does not exist")
        return real(name, *args)

    monkeypatch.setattr(gpu_check.importlib, "import_module", fake_import)
    missing = gpu_check.missing_packages()
    assert len(missing) == 1 and missing[0].startswith("torchvision") and "nms does not exist" in missing[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_make_gpu_check_prints_one_line_and_exits_0_without_cuda():
    p = subprocess.run(["make", "--no-print-directory", "gpu-check", f"PYTHON={sys.executable}",
                        f"PY={sys.executable}"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 0, p.stderr
    lines = (p.stdout + p.stderr).strip().splitlines()
    assert len(lines) == 1 and "no CUDA GPU" in lines[0]


# ---------------------------------------------------------------- 6. trap limits from synchronised windows


def _stopped(window_throughput: list[float], step: float, batch: int = 64) -> RunResult:
    return RunResult(config={"warmup_steps": 1}, label="x", status="time_limited", images_per_step=batch,
                     step_seconds=[9.0] + [step] * 10, steps_done=11, window_throughput=window_throughput,
                     tta=TtaRecord(0.5, False, why_not="time budget spent"), stopped_by="max_training_seconds")


def test_time_to_accuracy_traps_are_judged_from_synchronised_windows_not_step_times():
    limits = outcomes.TrapLimits(max_training_seconds=10.0, max_seconds_per_image=2 * 0.5 / 64)
    # on CUDA a step's own time is mostly enqueueing: 1 ms steps, but its synchronised windows ran 20 images/s
    assert "a speed trap" in limits.trap(_stopped([20.0, 21.0], step=0.001))
    # and a step that absorbed a sync looks slow while the windows are fast: no trap
    assert limits.trap(_stopped([5000.0, 5200.0], step=5.0)) is None
    assert limits.trap(_stopped([128 / 1.2] * 2, step=1.2, batch=128)) is None  # per image: a larger batch is fine
    # stopped by the limit before any window ended: warm-up's (or the steps') cost, every seed repeats it
    in_warm_up = _stopped([], step=10.0)
    in_warm_up.steps_done, in_warm_up.step_seconds = 1, [50.0]
    assert "spent 50.0 s, over its budget, in 1 warm-up step (compilation" in limits.trap(in_warm_up)
    assert "before its first synchronised window" in limits.trap(_stopped([], step=1.0))


def test_the_per_image_limit_comes_from_the_rung_below_s_windows():
    below = fastlab.TimeToAccuracy("below", 0.5)
    for seconds, speed in ((10.0, 50.0), (14.0, 25.0)):  # 20 ms and 40 ms an image; step times say nothing
        below.runs.append(RunResult(config={"warmup_steps": 1}, label="x", step_seconds=[3.0, 1e-3, 1e-3],
                                    images_per_step=10, window_throughput=[speed, speed],
                                    tta=TtaRecord(0.5, True, seconds, 5, 0.6)))
    limits = bench.tta_limits(below)
    assert limits.max_training_seconds == 28.0 and limits.max_seconds_per_image == pytest.approx(0.06)


# ---------------------------------------------------------------- also


class _OomInTraining(torch.nn.Module):
    """Passes preflight's two-image check, then runs out of memory on a training batch."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3 * 32 * 32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return self.fc(x.flatten(1))


def test_the_scheduler_is_released_with_the_optimiser_after_an_oom(monkeypatch, quick):
    opts: list[weakref.ref] = []

    class Recording(torch.optim.Adam):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            opts.append(weakref.ref(self))

    monkeypatch.setattr(torch.optim, "Adam", Recording)
    training = train.TrainingRun(quick.replace(scheduler="cosine"), "oom", _OomInTraining, None, False, None, None)
    r = training.execute()
    assert r.status == "failed"
    assert opts and opts[-1]() is None  # nothing of this run holds the optimiser (and Adam's state) any more


def test_own_model_and_advise_use_the_usable_cpu_count(monkeypatch):
    from fastlab.lessons import own_model

    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    from fastlab.data import load_data

    images, _ = load_data(config_for("smoke"), None)
    tried, _, _ = own_model.candidates(config_for("smoke", device="cpu"), images)
    assert tried["DataLoader workers"]["num_workers"] == 2
    starved = _cuda_result(wait=0.6, copy=0.0)
    starved.env = {"device_type": "cuda", "cpu_count": 64, "usable_cpus": 3}
    finding = advise._data_bound(starved, {**starved.config, "loader": "dataloader"}, gpu=True)
    alternatives = dict(finding.alternatives[0]) if finding.alternatives else finding.changes
    assert alternatives["num_workers"] == 3  # min(max(2, usable cpus), 8), not the host's 64


def test_nvml_matches_the_gpu_by_uuid_without_cuda_visible_devices(monkeypatch):
    assert measure.nvml_device_key(1, None, uuid="GPU-58f9") == ("uuid", "GPU-58f9")
    assert measure.nvml_device_key(1, "2,3", uuid="GPU-58f9") == ("index", 3)  # the visible list decides
    opened: list = []
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlDeviceGetHandleByIndex=lambda i: opened.append(("index", i)) or i,
        nvmlDeviceGetHandleByUUID=lambda u: opened.append(("uuid", u)) or u,
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=1))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: types.SimpleNamespace(uuid="58f9a3c1-0000-1111-2222-333344445555"))
    sampler = measure.GpuUtilSampler(torch.device("cuda", 1))
    assert sampler.available and opened == [("uuid", "GPU-58f9a3c1-0000-1111-2222-333344445555")]


# ---------------------------------------------------------------- issue 36, the third review


def test_gpu_check_run_as_main_sends_its_compared_runs_to_a_child_and_keeps_the_hog_here(monkeypatch, tmp_path,
                                                                                          capsys):
    import runpy

    from fastlab import isolation

    isolation_of: dict[str, str] = {}

    def fake_run(cfg, model=None, label="run", progress=True, **kw):
        why, _ = isolation.why_in_process(types.SimpleNamespace(parallel=None, model_arg=model, dataset_arg=None))
        if isinstance(model, type):
            isolation_of[model.__name__] = why or "process"
        return RunResult(config=cfg.to_dict(), label=label, window_throughput=[1.0], extras={"isolation": why or "process"})

    # `make gpu-check` is `python tests/gpu_check.py`: the script runs as __main__, on a pretend GPU
    monkeypatch.setattr(sys, "argv", ["gpu_check", "--out", str(tmp_path), "--no-ladder"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(fastlab, "run", fake_run)
    monkeypatch.setattr(measure, "device_name", lambda device: "a pretend GPU")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(total_memory=2**30))
    monkeypatch.setattr(importlib.import_module("fastlab.lessons.ddp"), "torchrun", lambda *a, **k: 1 / 0)
    with pytest.raises(SystemExit):
        runpy.run_path(gpu_check.__file__, run_name="__main__")
    assert "PASS" in capsys.readouterr().out  # the compared runs' checks ran (the fake runs pass some)
    assert isolation_of["UntunedForward"] == "process"  # cuDNN's plans of the off run cannot reach the on run
    assert isolation_of["_Hog"].startswith("FASTLAB_ISOLATION=thread")  # the OOM check reads this process's allocator


def test_the_gpu_profile_without_cuda_says_its_estimate_and_waits_for_the_flag(monkeypatch, capsys):
    from fastlab import calibration, isolation

    started: list = []
    estimated: list = []
    monkeypatch.setattr(train, "_STEP_ESTIMATES", {}, raising=False)
    monkeypatch.setattr(train, "_SAID", set(), raising=False)
    monkeypatch.setattr(isolation, "call", lambda fn, *args: estimated.append(args) or 29.0)  # 29 s a step (pretend)
    monkeypatch.setattr(isolation, "execute", lambda training, cold=False: started.append(training.cfg) or
                        training.result)
    monkeypatch.delenv("FASTLAB_CONFIRM_SLOW", raising=False)
    gpu = config_for("gpu", device="cpu", dataset="synthetic")
    with pytest.raises(ValueError, match=r"sized for a CUDA GPU .* 230 steps is estimated at 111\.2 min .* "
                                         r"Fix: set FASTLAB_CONFIRM_SLOW=1"):
        fastlab.run(gpu, progress=False)
    with pytest.raises(ValueError, match="80 steps is estimated"):  # before a calibration: the shortest sized run
        calibration.sized(gpu, arms=2, measure=lambda cfg: started.append(cfg) or [29.0])
    assert started == [] and estimated == [("resnet18", 512, "cpu")]  # measured once, then kept
    short = gpu.replace(steps=10, warmup_steps=2)  # 5.8 min: under ten, it goes ahead, said in one line
    fastlab.run(short, progress=False)
    said = capsys.readouterr().out.strip().splitlines()
    assert len(said) == 1 and "a run of 12 steps is estimated at 5.8 min" in said[0]
    monkeypatch.setenv("FASTLAB_CONFIRM_SLOW", "1")
    fastlab.run(gpu, progress=False)
    assert started == [short, gpu] and capsys.readouterr().out == ""  # said once


def test_each_gpu_check_check_has_a_deadline_and_a_fail_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu_check, "missing_packages", lambda: [])
    monkeypatch.setattr(measure, "device_name", lambda device: "a pretend GPU")
    monkeypatch.setattr(gpu_check, "CHECK_DEADLINE_S", 0.5, raising=False)
    monkeypatch.setattr(gpu_check, "CHECKS", [("hangs", lambda: time.sleep(60) or "woke"), ("next", lambda: "fine")])
    assert gpu_check.main(["--out", str(tmp_path), "--no-ladder"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("FAIL") and "hangs: not done within its deadline of 0.5 s" in lines[1]
    assert lines[2].startswith("PASS") and lines[-1] == "1 of 2 checks passed; failed: ['hangs']"


def test_a_gpu_check_stuck_past_its_deadline_and_the_grace_ends_with_every_threads_traceback(tmp_path):
    stuck = textwrap.dedent(f"""
        import signal, sys, time, torch
        from fastlab import isolation, measure
        import gpu_check
        torch.cuda.is_available = lambda: True
        gpu_check.missing_packages = lambda: []
        measure.device_name = lambda device: "a pretend GPU"
        isolation.STOP_GRACE_SECONDS, gpu_check.CHECK_DEADLINE_S = 0.5, 0.5
        def deaf():  # as a CUDA call that never returns: no Ctrl-C reaches it
            signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGINT}})
            time.sleep(60)
        gpu_check.CHECKS = [("stuck", deaf)]
        sys.exit(gpu_check.main(["--out", {str(tmp_path)!r}, "--no-ladder"]))
    """)
    p = subprocess.run([sys.executable, "-c", stuck], capture_output=True, text=True, cwd=ROOT, timeout=120,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.path.join(ROOT, "tests")])})
    assert p.returncode == 1 and "Timeout" in p.stderr and "in deaf" in p.stderr, p.stderr


def test_the_watched_loop_check_sees_each_technique_on_a_cpu():
    # the CUDA check's mechanism (a reader's loop under the watch, compared in turns, each technique seen) on a CPU;
    # on an H200 it passed on 2026-12-04
    text = gpu_check.watched_loops("cpu", images=128, batch_size=16, model="tiny")
    for seen in ("autocast to bfloat16", "DataLoader(num_workers=2, pin_memory=True)", "convolutions got channels_last input"):
        assert seen in text
