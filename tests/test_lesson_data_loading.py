import math

import pytest

from fastlab.comparisons import all_comparisons, run_comparison
from fastlab.lessons import data_loading as dl
from fastlab.results import RunResult


def test_worker_counts_go_from_zero_to_the_core_count():
    assert dl.worker_counts(1) == [0, 1]
    assert dl.worker_counts(2) == [0, 1, 2]
    assert dl.worker_counts(6) == [0, 1, 2, 4, 6]
    assert dl.worker_counts(16) == [0, 1, 2, 4, 8, 16]
    with pytest.raises(ValueError, match="cpu_count"):
        dl.worker_counts(0)


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
    with pytest.raises(ValueError, match="one wait per step"):
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


def test_vs_baseline_explains_a_run_without_windows():
    ok = RunResult(config={}, label="a", window_throughput=[10.0, 11.0, 12.0])
    limited = RunResult(config={}, label="b", status="time_limited", error="over budget")
    assert "no timed window" in dl.vs_baseline(ok, limited) and "over budget" in dl.vs_baseline(ok, limited)
    faster = RunResult(config={}, label="c", window_throughput=[30.0, 31.0, 32.0])
    assert "faster" in dl.vs_baseline(ok, faster)


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


def test_comparisons_are_registered_and_slow_storage_runs(quick):
    names = all_comparisons()
    for name in ("01_data_loading:num_workers", "01_data_loading:pipeline", "01_data_loading:slow_storage"):
        assert name in names
    results = run_comparison("01_data_loading:slow_storage", quick, progress=False)
    assert [r.config["num_workers"] for r in results] == [0, dl.pipeline_workers()]
    assert all(r.synthetic and r.extras["comparison"] == "01_data_loading:slow_storage" for r in results)
    fig = dl.plot_busy_trace(results)
    assert "SYNTHETIC" in fig.get_suptitle()
