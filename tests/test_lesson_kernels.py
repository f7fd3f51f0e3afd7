import pytest
import torch

from fastlab.lessons import kernels as k
from fastlab.results import RunResult


def test_varying_sizes_never_repeat_before_all_were_used_and_skip_the_fixed_size():
    sizes = k.varying_sizes(len(k.VARYING_SIZES) * 2, seed=3)
    first, second = sizes[: len(k.VARYING_SIZES)], sizes[len(k.VARYING_SIZES):]
    assert sorted(first) == sorted(k.VARYING_SIZES) == sorted(second)
    assert k.FIXED_SIZE not in sizes
    assert k.varying_sizes(5, seed=1) == k.varying_sizes(5, seed=1)
    assert k.mean_pixel_ratio([32, 32]) == 1.0 and k.mean_pixel_ratio([64]) == 4.0


def test_time_shapes_times_each_step_and_restores_the_flag():
    before = torch.backends.cudnn.benchmark
    t = k.time_shapes([16, 24, 16], benchmark=not before, batch_size=4, warmup_steps=1, device="cpu")
    assert len(t.step_seconds) == 3 and all(s > 0 for s in t.step_seconds)
    assert t.warmup_seconds > 0 and t.peak_memory_mb > 0
    assert torch.backends.cudnn.benchmark == before
    on = k.time_shapes([16], benchmark=True, batch_size=2, warmup_steps=0, device="cpu")
    assert on.no_op and "cuDNN" in on.no_op  # recorded as a no-op on a CPU, not silently ignored


@pytest.mark.parametrize("kwargs, field", [(dict(sizes=[8]), "sizes"), (dict(sizes=[]), "sizes"),
                                           (dict(sizes=[32], batch_size=0), "batch_size"),
                                           (dict(sizes=[32], benchmark="yes"), "benchmark")])
def test_time_shapes_rejects_bad_arguments(kwargs, field):
    kwargs.setdefault("benchmark", False)
    with pytest.raises(ValueError, match=field):
        k.time_shapes(**kwargs)


def test_shape_timings_compare_varying_with_fixed_in_milliseconds():
    from fastlab.verdicts import verdict

    fixed = k.ShapeTiming("fixed", [32] * 3, False, "cpu", 0.1, step_seconds=[0.010, 0.011, 0.012])
    varying = k.ShapeTiming("varying", [24, 36, 40], False, "cpu", 0.1, step_seconds=[0.10, 0.11, 0.12])
    assert (varying.step_ms.median, varying.step_ms.n) == (pytest.approx(110.0), 3)
    c = verdict(fixed.step_ms, varying.step_ms, "ms", higher_is_better=False)
    assert c.ratio == pytest.approx(10.0) and not c.better and not c.noise  # 10x the step time: slower
    assert (varying.step_ms.low, varying.step_ms.high) == (pytest.approx(100.0), pytest.approx(120.0))


def _run(amp, cl, ips):
    return RunResult(config={"amp": amp, "channels_last": cl}, label=f"{amp} {cl}", window_throughput=ips)


def test_channels_last_gain_per_precision():
    gains = k.channels_last_gain([_run("off", False, [10, 11, 12]), _run("off", True, [10, 11, 12]),
                                  _run("bf16", False, [10, 11, 12]), _run("bf16", True, [20, 21, 22])])
    assert gains["fp32"].noise and gains["bf16"].better and "(faster)" in str(gains["bf16"])


def test_comparisons_record_gpu_knobs_as_no_ops_on_cpu(quick):
    for what, fn in (("cudnn_benchmark", k.compare_cudnn_benchmark), ("channels_last", k.compare_channels_last),
                     ("tf32", k.compare_tf32)):
        assert fn.name == f"{k.NAME}:{what}"
    strict, default, matmuls = k.compare_tf32(quick, progress=False)
    assert not strict.config["tf32"] and default.config["tf32"] and matmuls.config["matmul_precision"] == "high"
    if not torch.cuda.is_available():
        assert "tf32" in strict.no_ops  # strict fp32 convolutions: a cuDNN setting, nothing to switch off here


def test_a_timing_runs_in_a_fresh_process_and_hands_back_errors():
    import os

    from fastlab import isolation

    assert isolation.call(os.getpid) != os.getpid()
    with pytest.raises(ValueError, match="sizes"):
        isolation.call(k.time_shapes, [8], benchmark=False)


def _bench(on_windows, no_op=None):
    off = RunResult(config={}, label="off", window_throughput=[100, 102, 104], warmup_seconds=0.5)
    on = RunResult(config={}, label="on", window_throughput=on_windows, warmup_seconds=2.0,
                   no_ops={"cudnn_benchmark": no_op} if no_op else {})
    return [off, on]


def test_c6_verdict():
    assert k.judge_benchmark(_bench([100, 101], "cuDNN runs only on NVIDIA GPUs")).verdict == \
        "not testable here: no accelerator (cuDNN runs only on NVIDIA GPUs)"
    fixed = k.ShapeTiming("fixed", [32] * 3, True, "cuda", 0.1, step_seconds=[0.01] * 3)
    slow = k.ShapeTiming("varying off", [24, 36, 40], False, "cuda", 0.1, step_seconds=[0.010, 0.011, 0.012])
    slower = k.ShapeTiming("varying on", [24, 36, 40], True, "cuda", 0.1, step_seconds=[0.10, 0.11, 0.12])
    verdict = k.judge_benchmark(_bench([150, 152, 154]), [fixed, slow, slower]).verdict
    assert verdict == "holds only when shapes are fixed"
    assert k.judge_benchmark(_bench([150, 152, 154])).verdict == "holds"


def test_every_tf32_switch_notebook_03_names_exists_in_this_torch():
    """03's pitfalls name the current fp32_precision switches beside the legacy allow_tf32 flags: all must exist."""
    import json
    import operator
    import re
    from pathlib import Path

    nb = Path(__file__).resolve().parents[1] / "notebooks" / "03_cudnn_benchmark_and_channels_last.ipynb"
    prose = "".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "markdown")
    names = set(re.findall(r"`torch\.(backends\.[\w.]+\.(?:fp32_precision|allow_tf32))`", prose))
    assert {"backends.cuda.matmul.fp32_precision", "backends.cudnn.conv.fp32_precision"} <= names, names
    for name in names:
        operator.attrgetter(name)(torch)  # raises AttributeError for a switch this torch does not have
    assert "before Ampere (sm_80" in prose


def test_a_no_op_arm_has_no_warm_up_figure_in_the_verdict():
    off = RunResult(config={"warmup_steps": 2}, label="off", window_throughput=[100, 102, 104], warmup_seconds=13.44,
                    steps_done=10)
    on = RunResult(config={"warmup_steps": 2}, label="on", status="no_op", error="every change is a no-op here",
                   no_ops={"cudnn_benchmark": "cuDNN runs only on NVIDIA GPUs"})
    evidence = k.judge_benchmark([off, on]).evidence
    assert "0.00 s" not in evidence and "warm-up did not run (NOT TRAINED" in evidence and "13.44 s" in evidence

