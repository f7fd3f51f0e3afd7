import math

import pytest

from fastlab import claims
from fastlab.lessons import data_loading as dl
from fastlab.results import RunResult


def test_worker_counts_go_past_four_times_the_cores():
    assert dl.worker_counts(1) == [0, 1, 2, 4, 6]
    assert dl.worker_counts(2) == [0, 1, 2, 4, 8, 12]
    assert dl.worker_counts(6) == [0, 1, 2, 4, 6, 12, 24, 36]
    assert dl.worker_counts(16)[-3:] == [32, 64, 96] and max(dl.worker_counts(16)) > 4 * 16
    with pytest.raises(ValueError, match="cpu_count"):
        dl.worker_counts(0)


def test_torchs_worker_warning_is_asked_here_not_lost_in_the_runs_process(smoke, monkeypatch):
    import fastlab.train as train
    from fastlab.measure import usable_cpu_count

    too_many = 4 * usable_cpu_count()
    said = dl.torch_worker_check(too_many)
    assert said is not None and f"create {too_many} worker processes" in said
    assert dl.torch_worker_check(0) is None and dl.torch_worker_check(1) is None
    monkeypatch.setattr(train, "run", lambda cfg, label="run", progress=True, comparison=None, **given: RunResult(
        config=cfg.to_dict(), label=label, window_throughput=[100.0, 101.0], repeats=1))
    swept = dl.compare_num_workers(smoke, progress=False)  # 01 prints the first warning the sweep kept
    assert "torch_warning" not in swept[0].extras and "worker processes" in swept[-1].extras["torch_warning"]


def test_pipeline_steps_are_cumulative_and_valid_configs(smoke):
    steps = dl.pipeline_steps(2)
    assert [label for label, _ in steps][-1] == "device-resident loader"
    (_, first), (_, pinned), (_, persistent), (_, prefetch), (_, device) = steps
    assert first["num_workers"] == 2 and not first["pin_memory"]
    assert pinned["pin_memory"] and pinned["non_blocking"] and not pinned["persistent_workers"]
    assert persistent["pin_memory"] and persistent["persistent_workers"] and persistent["prefetch_factor"] is None
    assert prefetch["persistent_workers"] and prefetch["prefetch_factor"] == 4
    assert device["loader"] == "device" and device["num_workers"] == 0
    for _, changes in steps:
        smoke.replace(**changes)  # every rung is a config TrainConfig accepts
    assert dl.pipeline_workers(64) == dl.MAX_PIPELINE_WORKERS and dl.pipeline_workers(2) == 2
    with pytest.raises(ValueError, match="workers"):
        dl.pipeline_steps(0)


def test_busy_trace_is_idle_while_waiting_and_busy_otherwise():
    times, busy = dl.busy_trace([1.0, 2.0, 0.5], [0.25, 0.0, 0.5])
    assert times == [0.0, 0.25, 1.0, 3.0, 3.5]
    assert busy == [0.0, 100.0, 100.0, 0.0, 0.0]
    # busy time (value times duration) equals the steps' compute time
    busy_time = sum((t1 - t0) * b / 100 for t0, t1, b in zip(times, times[1:], busy))
    assert busy_time == pytest.approx(0.75 + 2.0)
    with pytest.raises(ValueError, match="argument 2 is shorter"):  # one wait per step
        dl.busy_trace([1.0], [])


def _result(steps, waits, batch=32, images=640, warmup=3):
    return RunResult(config={"batch_size": batch, "warmup_steps": warmup, "grad_accum_steps": 1, "train_images": images},
                     step_seconds=steps, data_wait_seconds=waits, dataset={"train_images": images})


def test_epoch_starts_and_the_wait_there():
    r = _result([0.1] * 45, [0.01] * 45)
    assert dl.epoch_starts(r) == [20, 40]
    r.data_wait_seconds[20] = r.data_wait_seconds[40] = 0.5
    at_start, other = dl.epoch_start_wait(r)
    assert at_start == pytest.approx(0.5) and other == pytest.approx(0.01)
    assert math.isnan(dl.epoch_start_wait(_result([0.1] * 10, [0.01] * 10))[0])


def test_describe_data_wait_tells_a_bottleneck_from_compute():
    assert "data bottleneck" in dl.describe_data_wait(_result([1.0] * 10, [0.6] * 10))
    assert "compute-bound" in dl.describe_data_wait(_result([1.0] * 10, [0.01] * 10))


def test_slow_storage_sleeps_per_image_and_is_labelled_synthetic(smoke):
    import time

    train, held_out = dl.slow_storage_data(smoke.replace(train_images=64, eval_images=32), batch_ms=64.0)
    assert train.synthetic and len(train) == 64 and len(held_out) == 32
    t0 = time.perf_counter()
    for i in range(4):
        train[i]
    assert time.perf_counter() - t0 >= 4 * 0.002  # 64 ms per batch of 32 -> 2 ms an image
    with pytest.raises(ValueError, match="latency_ms"):
        dl.SlowStorage(train.inner.images, train.inner.labels, latency_ms=-1)


def test_the_slow_storage_comparison_runs_and_is_tagged(quick):
    assert [c.name for c in (dl.compare_num_workers, dl.compare_pipeline, dl.compare_slow_storage)] == [
        "01_data_loading:num_workers", "01_data_loading:pipeline", "01_data_loading:slow_storage"]
    results = dl.compare_slow_storage(quick, progress=False)
    assert [r.config["num_workers"] for r in results] == [0, dl.pipeline_workers()]
    assert all(r.synthetic and r.comparison == "01_data_loading:slow_storage" for r in results)


def _point(workers, windows, cores=2, wait=0.1):
    return RunResult(config={"num_workers": workers, "warmup_steps": 0}, label=f"num_workers={workers}",
                     window_throughput=windows, step_seconds=[1.0] * 4, data_wait_seconds=[wait] * 4,
                     extras={"usable_cpus": cores})


def test_the_sweep_reading_and_the_c1_verdict():
    peak_at_4 = [_point(0, [50, 52]), _point(2, [90, 92]), _point(4, [120, 124]), _point(8, [118, 123]),
                 _point(12, [80, 82])]
    reading = dl.read_sweep(peak_at_4)
    assert dl.workers_of(reading.peak) == 4 and reading.near_peak == [4, 8]
    assert dl.workers_of(reading.costs_from) == 12 and "oversubscription (more workers than cores) costs from num_workers=12" in reading.describe()
    assert dl.judge_workers(peak_at_4).verdict.startswith("holds")
    peak_at_1 = [_point(0, [50, 52]), _point(1, [100, 102]), _point(2, [70, 72]), _point(4, [60, 62]),
                 _point(8, [40, 42])]
    assert "the peak is at num_workers=1" in dl.judge_workers(peak_at_1).verdict
    flat = [_point(0, [50, 60]), _point(4, [52, 58]), _point(8, [51, 59])]
    v = dl.judge_workers(flat).verdict  # every point's spread within ±10%: a 1.2x gain would have been seen
    assert v.startswith("does not hold here (no worker count beat num_workers=0 outside the spread, where a 1.2x")
    assert "wall" not in v  # a cause it did not measure is not named


def test_c1_is_not_judged_where_the_sweep_could_not_have_seen_a_gain():
    # num_workers=0 ranged 51-209 images/s: the sweep could not have seen a 2x gain, so C1 is not "does not hold"
    wide = [_point(0, [51, 209]), _point(2, [60, 190]), _point(4, [55, 200]), _point(8, [58, 205])]
    v = dl.judge_workers(wide).verdict
    assert v.startswith("could not tell here (no worker count beat num_workers=0 outside the spread; num_workers=")
    assert "could not have been seen" in v and "a quieter machine" in v and "wall" not in v
    claims.check_verdict(v)


def test_c2_and_c13_are_not_testable_on_a_cpu():
    pipeline = [RunResult(config={"pin_memory": False, "loader": "dataloader"}, label="2 workers"),
                RunResult(config={"pin_memory": True, "loader": "dataloader", "persistent_workers": False},
                          label="+pin", no_ops={"pin_memory": "no GPU here"})]
    assert dl.judge_pinning(pipeline).verdict == ("not testable here: no accelerator (the claim is about copies to "
                                                  "a GPU; no GPU here)")
    assert dl.time_copies(8, device="cpu").startswith("pinned memory only speeds copies to a CUDA GPU")
    starved = [_point(0, [10, 11], wait=0.8), _point(2, [30, 31])]
    assert dl.judge_swing(starved).verdict.startswith("not testable here: no accelerator (the claim reads a GPU's")
    for r in starved:  # a CUDA machine whose NVML gave nothing: a no-op of the sampler, not a missing device
        r.env = {"device_type": "cuda", "device_name": "GPU"}
    assert dl.judge_swing(starved).verdict.startswith("no-op here (no GPU utilisation to read on GPU")


def test_c1_on_a_cpu_says_the_workers_compete_with_training():
    sweep = [_point(0, [50, 52]), _point(2, [90, 92]), _point(4, [120, 124]), _point(8, [118, 123])]
    v = dl.judge_workers(sweep).verdict
    assert v.startswith("holds (") and v.endswith(f"; {dl.ON_A_CPU})") and "same cores" in v
    for r in sweep:
        r.env = {"device_type": "cuda"}
    assert "same cores" not in dl.judge_workers(sweep).verdict
    # a sweep that could not tell names no cause it did not measure (01 under the cpu profile, 2026-12-04)
    wide = [_point(0, [50, 150]), _point(2, [60, 160]), _point(4, [55, 155]), _point(8, [52, 152])]
    v = dl.judge_workers(wide).verdict
    assert v.startswith("could not tell here") and "same cores" not in v


def test_c13_reads_an_nvml_trace():
    slow, fed = _point(0, [10, 11], wait=0.8), _point(2, [30, 31])
    slow.gpu_util = [(i * 0.1, 0.0 if i % 2 else 100.0) for i in range(20)]
    assert dl.utilisation_swing(slow) == (0.5, 0.5)
    assert dl.judge_swing([slow, fed]).verdict.startswith("holds")
    slow.gpu_util = [(i * 0.1, 55.0) for i in range(20)]
    assert "did not swing" in dl.judge_swing([slow, fed]).verdict


def test_c2_on_a_gpu_weighs_the_copy_and_training():
    from fastlab.measure import Spread

    before = RunResult(config={"pin_memory": False, "loader": "dataloader"}, label="2 workers",
                       window_throughput=[100, 101])
    pinned = RunResult(config={"pin_memory": True, "loader": "dataloader", "persistent_workers": False},
                       label="+pin", window_throughput=[100, 102])
    copies = [dl.CopyTiming("pageable", Spread(2.0, 1.9, 2.1, 5)), dl.CopyTiming("pinned", Spread(0.5, 0.45, 0.55, 5))]
    assert dl.judge_pinning([before, pinned], copies).verdict == "holds only when measured on the copy alone"
    assert "copy time" in dl.judge_pinning([before, pinned], copies).evidence


def test_no_notebook_says_non_blocking_overlaps_compute():
    """On the default stream a non_blocking copy still queues behind the previous kernels: the host runs ahead."""
    import json
    import re
    from pathlib import Path

    notebooks = Path(__file__).resolve().parents[1] / "notebooks"
    claim = re.compile(r"non_blocking[^\n]{0,80}\boverlaps? compute|overlap compute[^\n]{0,40}non_blocking", re.I)
    said = [p.name for p in sorted(notebooks.glob("*.ipynb"))
            if claim.search(" ".join("".join(c["source"]).replace("\n", " ") for c in json.loads(p.read_text())["cells"]))]
    assert said == []


@pytest.mark.parametrize("compare", [dl.compare_num_workers, dl.compare_pipeline, dl.compare_slow_storage])
def test_the_sweep_the_staircase_and_slow_storage_run_every_arm_in_turns(compare, smoke, monkeypatch):
    """A count or a step run once after another is a single pair: each arm runs twice, the order reversed."""
    import fastlab.train as train

    order: list[str] = []

    def fake_run(cfg, label="run", progress=True, comparison=None, **given):
        order.append(label)
        return RunResult(config=cfg.to_dict(), label=label, window_throughput=[100.0, 101.0], repeats=1)

    monkeypatch.setattr(train, "run", fake_run)
    results = compare(smoke)
    trained = [r for r in results if r.label in order]  # a step whose every change is a no-op here is not trained
    labels = [r.label for r in trained]
    assert len(labels) >= 2 and order == labels + labels[::-1]
    assert all(len(r.throughput.repeats) == 2 for r in trained)  # the noise rule pairs the repeats


def test_a_single_pair_that_could_not_tell_never_prints_an_infinite_ratio():
    one_run = [_point(0, [100, 102]), _point(4, [101, 103])]
    for r in one_run:
        r.repeats = 1  # each count ran once: single pairs
    v = dl.judge_workers(one_run).verdict
    assert v.startswith("could not tell here") and "inf" not in v and "not interleaved" in v


def test_a_sweep_the_budget_did_not_start_could_not_tell_and_says_why():
    from fastlab import config, train

    cfg = config.config_for("smoke")
    refused = [train.not_started(cfg.replace(num_workers=n), f"num_workers={n}", "not started: spent") for n in (0, 2)]
    assert "no run of the sweep finished a timed window: 'num_workers=0'" in dl.read_sweep(refused).describe()
    finding = dl.judge_workers(refused)
    assert finding.verdict.startswith("could not tell here") and not finding.recorded


def test_a_sweep_that_stops_short_of_2x_the_cores_could_not_tell_c1():
    """The gpu profile's fast version sweeps only up to the cores (sweep_seconds): with no point at 2-4x the cores
    the advice was not tested, which tells nothing (it once said "does not hold here")."""
    to_the_cores = [_point(0, [50, 52], cores=4), _point(2, [90, 92], cores=4), _point(4, [120, 124], cores=4)]
    finding = dl.judge_workers(to_the_cores)
    assert finding.verdict == ("could not tell here (the sweep has no point at 2-4x the cores to judge: it went to "
                               "num_workers=4 on 4 cores)")
    assert not finding.recorded
