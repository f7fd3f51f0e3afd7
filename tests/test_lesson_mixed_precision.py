import math

import pytest
import torch

import fastlab.models
from fastlab.lessons import mixed_precision as mp
from fastlab.results import RunResult, median_step_seconds, step_time


def test_fp16_flushes_small_gradients_and_the_scale_saves_them():
    report = mp.gradient_underflow(batch=512, residual=2.5e-4)  # gradients as small as the defaults give
    assert report.output_grads == 512 * 10
    assert report.output_zero_unscaled > 0.05 * report.output_grads  # real underflow without scaling
    assert report.output_zero_scaled < report.output_zero_unscaled / 10
    assert report.param_zero_scaled <= report.param_zero_unscaled
    # a loss scale of 1 is no scaling at all: the same zeros as the unscaled pass
    same = mp.gradient_underflow(batch=512, loss_scale=1.0)
    assert same.output_zero_scaled == same.output_zero_unscaled
    # large errors give gradients fp16 can hold: nothing underflows
    assert mp.gradient_underflow(batch=64, residual=1.0).output_zero_unscaled == 0


@pytest.mark.parametrize("kwargs, field", [(dict(loss_scale=0), "loss_scale"), (dict(residual=-1), "residual"),
                                           (dict(batch=0), "batch"), (dict(loss_scale=math.inf), "loss_scale")])
def test_gradient_underflow_rejects_bad_arguments(kwargs, field):
    with pytest.raises(ValueError, match=field):
        mp.gradient_underflow(**kwargs)


def test_scaler_history_backs_off_on_overflow_then_grows():
    history = mp.scaler_history(steps=16, init_scale=2.0**30, growth_interval=3)
    scales = [s for _, s, _ in history]
    assert history[0][2] and scales[1] == scales[0] / 2  # too high: the first step overflows and is skipped
    assert any(b > a for a, b in zip(scales, scales[1:]))  # after clean steps it grows again
    assert all(skipped == (b < a) for (_, a, skipped), b in zip(history, scales[1:]))


def _run(amp, batch, ips, losses=(), status="ok", steps=(1.0,)):
    return RunResult(config={"amp": amp, "batch_size": batch, "warmup_steps": 0}, label=f"{amp}{batch}",
                     status=status, window_throughput=list(ips), losses=list(losses), step_seconds=list(steps))


def test_batch_pairs_pair_each_batch_with_its_fp32_run():
    from fastlab.verdicts import runs_verdict

    results = [_run("off", 8, [10, 11, 12]), _run("bf16", 8, [5, 6, 7]),
               _run("off", 32, [10, 11, 12]), _run("bf16", 32, [20, 21, 22])]
    pairs = mp.batch_pairs(results)
    assert set(pairs) == {8, 32}
    assert all((a.config["amp"], b.config["amp"]) == ("off", "bf16") for a, b in pairs.values())
    assert "slower" in str(runs_verdict(*pairs[8])) and "faster" in str(runs_verdict(*pairs[32]))


def test_final_loss_and_step_time_of_a_time_limited_run():
    r = _run("bf16", 8, [], losses=[(i, float(i)) for i in range(10)], status="time_limited", steps=(3.0, 5.0, 4.0))
    assert mp.final_loss(r, last=2) == pytest.approx(8.5)
    assert median_step_seconds(r) == 4.0
    assert step_time(r) == "median step 4.00 s (3 timed steps)"
    with pytest.raises(ValueError, match="last"):
        mp.final_loss(r, last=0)


def test_batch_sizes_and_low_precision(smoke):
    assert mp.batch_sizes(smoke) == (smoke.batch_size // 4, smoke.batch_size)
    assert mp.low_precision("cpu") == "bf16"


def test_comparisons_are_named_and_sized_by_their_runs():
    assert (mp.compare_precision.name, mp.compare_precision.arms, mp.compare_precision.repeated) == (
        "02_mixed_precision:precision", 6, False)  # 3 precisions x 2 seeds, one run each
    assert (mp.compare_batch_size.name, mp.compare_batch_size.arms) == ("02_mixed_precision:batch_size", 4)


def _seed(amp, seed, ips, acc, status="ok", batch=32):
    return RunResult(config={"amp": amp, "batch_size": batch, "warmup_steps": 0, "seed": seed}, label=f"{amp} {seed}",
                     status=status, window_throughput=list(ips), eval_accuracy=acc, peak_memory_mb=100.0,
                     memory_kind="process_rss", extras={"variant": mp.LABELS[amp]},
                     error="loss is nan" if status == "diverged" else None)


def test_runs_group_by_precision_over_seeds():
    runs = [_seed("off", s, [10, 11], 0.8) for s in (0, 1)] + [_seed("bf16", s, [20, 21], 0.8) for s in (0, 1)]
    groups = mp.by_variant(runs)
    assert list(groups) == ["fp32", "bf16"] and all(len(v) == 2 for v in groups.values())
    assert [r.label for r in mp.first_seed(runs)] == ["off 0", "bf16 0"]


def test_c3_speed_and_quality():
    fp32 = [_seed("off", s, [10, 11], a) for s, a in ((0, 0.80), (1, 0.82))]
    fast_same = [_seed("bf16", s, [25, 26], a) for s, a in ((0, 0.81), (1, 0.80))]
    small = [RunResult(config={"amp": a, "batch_size": 8}, label=f"8 {a}", window_throughput=w)
             for a, w in (("off", [5, 6]), ("bf16", [5, 6]))]
    assert mp.judge_speed_and_quality(fp32 + fast_same).verdict == "holds"
    assert mp.judge_speed_and_quality(fp32 + fast_same, small).verdict == "holds only when bf16 at batch 32"
    worse = [_seed("bf16", s, [20, 21], a) for s, a in ((0, 0.50), (1, 0.52))]
    assert "quality lost" in mp.judge_speed_and_quality(fp32 + worse).evidence
    diverged = [_seed("bf16", 0, [20, 21], 0.1, status="diverged"), _seed("bf16", 1, [20], 0.8)]
    assert mp.quality_loss(fp32, diverged).startswith("1 of 2 runs diverged")


def test_c4_on_cpu_uses_the_breakdown_and_c5_the_underflow_report():
    from fastlab.lessons import memory

    runs = [_seed("off", 0, [10], 0.8), _seed("bf16", 0, [20], 0.8)]
    finding = mp.judge_memory(runs, memory.judge_amp_memory(memory.amp_pairs("tiny", (4,), "bf16")))
    assert "stays fp32" in finding.evidence
    assert "weak test" in mp.judge_memory(runs).evidence  # without the breakdown: RSS, said to be weak
    report = mp.gradient_underflow(batch=512, residual=2.5e-4)
    assert mp.judge_underflow(report).verdict.startswith("holds in a demonstration")
    assert mp.judge_underflow(mp.gradient_underflow(batch=64, residual=1.0)).verdict.startswith("does not hold")


def test_c3_a_gain_short_of_the_advices_figure_is_not_a_bare_holds():
    fp32 = [_seed("off", s, [100, 101], 0.8) for s in (0, 1)]
    bf16 = [_seed("bf16", s, [110, 111], 0.8) for s in (0, 1)]
    verdict = mp.judge_speed_and_quality(fp32 + bf16).verdict
    assert verdict.startswith("holds") and verdict != "holds"
    assert "short of the advice's up to 2-3x (best measured 1.10x)" in verdict


def test_c5_is_labelled_a_demonstration_and_adds_the_nets_own_share(smoke):
    report = mp.gradient_underflow(batch=512, residual=2.5e-4)
    assert mp.judge_underflow(report).verdict.startswith("holds in a demonstration built to underflow")
    net = mp.net_gradient_underflow(smoke, steps=2)
    assert net.param_grads == sum(p.numel() for p in fastlab.models.build_model(smoke.model).parameters())
    assert 0 <= net.zero_scaled <= net.zero_unscaled <= net.param_grads
    # fp16 is a trap on a CPU: the gradients are compared on a few images of the batch, and the summary says so
    assert net.grad_images == mp.TRAP_GRAD_IMAGES and f"its first {mp.TRAP_GRAD_IMAGES} images" in net.summary()
    f = mp.judge_underflow(report, net)
    assert f"in a real run of the workbook net, {net.share:.2%}" in f.verdict and net.summary() in f.evidence
    with pytest.raises(ValueError, match="steps"):
        mp.net_gradient_underflow(smoke, steps=0)


# ---------------------------------------------------------------- a trap's short run, described once everywhere


def _trap_run(steps=(47.40, 45.17)):
    """A trap's demonstration stopped at its budget: one warm-up step and one timed step, no timed window."""
    return RunResult(config={"amp": "bf16", "batch_size": 8, "warmup_steps": 1}, label="bf16 (trap demonstration)",
                     status="time_limited", error="stopped at its 10 s budget during step 3", images_per_step=8,
                     step_seconds=list(steps), trap="no native bf16 here")


def test_a_trap_run_without_a_timed_window_has_one_step_time_everywhere():
    base = RunResult(config={"amp": "off", "batch_size": 8, "warmup_steps": 1}, label="fp32", images_per_step=8,
                     window_throughput=[2.0, 2.1], step_seconds=[5.0, 4.0, 4.0, 4.0])
    trap = _trap_run()
    said = step_time(trap)
    assert said == "median step 45.17 s (1 timed step)"  # the timed step's, not the warm-up's
    assert said in trap.summary() and said in mp.versus(base, trap) and "nothing measured" not in mp.versus(base, trap)
    only_warmup = _trap_run(steps=(47.40,))
    assert step_time(only_warmup) == "median step 47.40 s (1 warm-up step, no timed step finished)"
    assert step_time(only_warmup) in only_warmup.summary()


def test_the_speed_plot_draws_a_traps_step_time_marked_as_a_trap():
    from fastlab import plots

    base = RunResult(config={"amp": "off", "warmup_steps": 1}, label="fp32", images_per_step=8,
                     window_throughput=[2.0, 2.1], step_seconds=[5.0, 4.0, 4.0])
    ax = plots.plot_step_times([base, _trap_run()], title="t").axes[0]
    assert [round(bar.get_width(), 2) for bar in ax.patches[:2]] == [4.0, 45.17]
    words = [t.get_text() for t in ax.texts]
    assert "median step 45.17 s (1 timed step), 11.3x the step of fp32, TRAP" in words
    assert ax.get_legend().get_texts()[0].get_text() == plots.TRAP_WORDS


@pytest.mark.parametrize("native", [True, False])
def test_the_exercise_trap_is_named_where_its_half_precision_is_slow_here(native_bf16, smoke, native):
    native_bf16(native)
    why = mp.exercise_trap(smoke, torch.device("cpu"))
    assert (why is None) is native


def test_notebook_02s_core_path_ends_with_its_verdict_and_its_headings_count_up():
    import json
    import re
    from pathlib import Path

    cells = json.loads((Path(__file__).parents[1] / "notebooks" / "02_mixed_precision.ipynb").read_text())["cells"]
    text = ["".join(c["source"]) for c in cells]
    further = next(i for i, t in enumerate(text) if t.startswith("## Going further"))
    assert cells[further - 1]["cell_type"] == "code" and "claims.conclude(" in text[further - 1]
    numbers = [int(m.group(1)) for t in text if (m := re.match(r"## (\d+)\.", t))]
    assert numbers == list(range(1, len(numbers) + 1))
