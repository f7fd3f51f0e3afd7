"""The comparison figures draw each bar as the one comparison (fastlab.verdicts) judges it: read from the figures'
own matplotlib objects (bar colours, annotations, legend labels, whisker extents) on constructed results."""

import matplotlib

matplotlib.use("Agg")

from matplotlib.colors import to_rgba  # noqa: E402
from matplotlib.container import ErrorbarContainer  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

import fastlab  # noqa: E402
from fastlab.outcomes import tta_verdict  # noqa: E402
from fastlab.plots import KINDS, plot_comparison, plot_tta_ladder, plot_waterfall  # noqa: E402
from fastlab.results import RunResult, TtaRecord  # noqa: E402
from fastlab.verdicts import pooled_throughput, runs_verdict  # noqa: E402
from fastlab.widgets import pair_summary  # noqa: E402

CUDNN_WHY = "cudnn_benchmark: cuDNN runs only on NVIDIA GPUs"


def rung(label, windows, status="ok", no_ops=None, extras=None, repeat_windows=(), dropped="", **config):
    return RunResult(config={"warmup_steps": 1, **config}, label=label, status=status, window_throughput=list(windows),
                     repeat_windows=list(repeat_windows), dropped=dropped,
                     peak_memory_mb=300.0, memory_kind="process_rss", no_ops=no_ops or {}, extras=extras or {},
                     error="every change is a no-op here" if status == "no_op" else None,
                     dataset={"name": "synthetic", "synthetic": True}, env={"device_name": "CPU"})


def spaced(median, n=12, step=1.0):
    """n windows around a median: more than 8, so the interval of the median is narrower than min-max."""
    return [median + step * (k - n // 2) for k in range(n)]


def ladder():
    """naive; +workers clearly faster (its pin_memory a no-op here); +bf16 inside the noise; +cudnn.benchmark not
    trained (a no-op); +channels_last built on it (cudnn_benchmark in its config, a no-op, not its own knob) and
    clearly slower; a diverged rung; a time-limited one."""
    workers = dict(num_workers=2, pin_memory=True)
    return [rung("naive", spaced(100)),
            rung("+workers", spaced(200), no_ops={"pin_memory": "no GPU"}, **workers),
            rung("+bf16", spaced(202, step=4), no_ops={"pin_memory": "no GPU"}, amp="bf16", **workers),
            rung("+cudnn.benchmark", [], status="no_op", extras={"not_trained": CUDNN_WHY},
                 no_ops={"pin_memory": "no GPU", "cudnn_benchmark": "CPU"}, amp="bf16", cudnn_benchmark=True,
                 **workers),
            rung("+channels_last", spaced(150), no_ops={"pin_memory": "no GPU", "cudnn_benchmark": "CPU"},
                 amp="bf16", cudnn_benchmark=True, channels_last=True, **workers),
            rung("+fused", spaced(300), status="diverged", dropped="diverged", amp="bf16",
                 cudnn_benchmark=True, channels_last=True, opt_impl="fused", **workers),
            rung("+batch 128", spaced(260), status="time_limited", amp="bf16", cudnn_benchmark=True,
                 channels_last=True, batch_size=128, **workers)]


def bar_at(ax, x):
    bars = [p for p in ax.patches if isinstance(p, Rectangle) and abs(p.get_x() + p.get_width() / 2 - x) < 1e-9]
    return bars[0] if bars else None


def legend_labels(fig):
    return [t.get_text() for leg in fig.legends for t in leg.get_texts()]


def annotation(ax, x):
    return "\n".join(t.get_text() for t in ax.texts if abs(t.xy[0] - x) < 1e-9)


def whisker(ax, index):
    """(low, high) of the errorbar drawn at x=index (vertical) or y=index (horizontal)."""
    for c in ax.containers:
        if isinstance(c, ErrorbarContainer):
            for (x0, y0), (x1, y1) in c.lines[2][0].get_segments():
                if abs(x0 - x1) < 1e-12 and abs(x0 - index) < 1e-9:
                    return sorted((y0, y1))
                if abs(y0 - y1) < 1e-12 and abs(y0 - index) < 1e-9:
                    return sorted((x0, x1))
    return None


def test_each_rung_is_coloured_by_its_verdict_against_the_rung_it_builds_on():
    results = ladder()
    fig = plot_waterfall(results)
    ax = fig.axes[0]
    assert runs_verdict(results[1], results[2]).direction == "noise"  # the constructed case is what it says
    want = {0: "base", 1: "better", 2: "noise", 4: "worse", 5: "diverged", 6: "better"}
    for i, kind in want.items():
        assert bar_at(ax, i).get_facecolor()[:3] == to_rgba(KINDS[kind][0])[:3], (results[i].label, kind)
    assert "noise" in annotation(ax, 2)
    labels = legend_labels(fig)
    for kind in set(want.values()):
        assert KINDS[kind][3].format(than="the rung it builds on") in labels
    assert not any("faster than the rung" in x for x in labels)  # the old words for any bar that went up


def test_a_no_op_rung_is_drawn_and_named_as_a_no_op_not_as_stopped():
    fig = plot_waterfall(ladder())
    ax = fig.axes[0]
    assert bar_at(ax, 3) is None  # not trained: no speed to draw
    text = " ".join(annotation(ax, 3).split())
    assert text.startswith("no-op here, not trained") and CUDNN_WHY in text
    labels = legend_labels(fig)
    assert KINDS["no-op"][3] in labels and not any(x.startswith("stopped") for x in labels)
    assert not any("NO-OP" in t.get_text() for t in ax.texts)


def test_a_rung_names_only_its_own_no_op_knobs():
    ax = plot_waterfall(ladder()).axes[0]
    assert "no-op:\npin_memory" in annotation(ax, 1)  # its own knob, a no-op here
    after = annotation(ax, 4)  # +channels_last, built on the no-op rung, compared with +bf16
    assert "cudnn_benchmark" not in after and "pin_memory" not in after


def test_the_whiskers_are_the_interval_the_verdict_compares():
    results = ladder()
    ax = plot_waterfall(results).axes[0]
    base = pooled_throughput(results[0]).median
    below = {1: results[0], 2: results[1], 4: results[2], 6: results[4]}  # the last trained rung carried up
    for i, b in below.items():
        c = runs_verdict(b, results[i])
        lo, hi = c.other.interval
        assert whisker(ax, i) == [lo / base, hi / base], results[i].label
        assert (lo, hi) != (c.other.low, c.other.high)  # not min-max over the windows
    assert [lo * base for lo in whisker(ax, 0)] == list(pooled_throughput(results[0]).interval)


def test_interleaved_repeats_are_shown_as_the_verdict_pairs_them():
    naive = rung("naive", spaced(100, 6) + spaced(104, 6), repeat_windows=[spaced(100, 6), spaced(104, 6)])
    up = rung("+workers", spaced(130, 6) + spaced(90, 6), num_workers=2,
              repeat_windows=[spaced(130, 6), spaced(90, 6)])
    assert runs_verdict(naive, up).direction == "noise"  # the repeats disagree
    fig = plot_waterfall([naive, up])
    assert bar_at(fig.axes[0], 1).get_facecolor()[:3] == to_rgba(KINDS["noise"][0])[:3]
    assert any("interleaved repeat" in x for x in legend_labels(fig))


def test_plot_comparison_rows_follow_the_verdict_and_its_interval():
    base = rung("baseline", spaced(100))
    same = rung("noise", spaced(101, step=3))
    off = rung("not trained", [], status="no_op", extras={"not_trained": CUDNN_WHY})
    slow = rung("slower", spaced(60))
    nan = rung("nan loss", spaced(300), status="diverged")
    results = [base, same, off, slow, nan]
    fig = plot_comparison(results)
    ax = fig.axes[0]
    for i, kind in enumerate(["base", "noise", "no-op", "worse", "diverged"]):
        assert ax.patches[i].get_facecolor()[:3] == to_rgba(KINDS[kind][0])[:3], results[i].label
    texts = [t.get_text() for t in ax.texts]
    assert texts[1] == "noise" and texts[2].startswith("no-op here, not trained") and texts[3] == "0.60x"
    assert texts[4].startswith("DIVERGED")
    assert whisker(ax, 1) == list(runs_verdict(base, same).other.interval)
    assert whisker(ax, 3) == list(runs_verdict(base, slow).other.interval)
    labels = legend_labels(fig)
    assert KINDS["noise"][3].format(than="its baseline") in labels and KINDS["no-op"][3] in labels


def test_the_panels_row_follows_the_comparison_with_the_baseline_beside_it():
    page_load = rung("page load", spaced(100))
    beside = [rung("baseline", spaced(200)), rung("baseline", spaced(204))]
    variant = rung("knobs as set", spaced(150))
    variant.extras["paired"] = paired = pair_summary(beside, variant)
    assert paired["comparison"].direction == "worse" and runs_verdict(page_load, variant).direction == "better"
    ax = plot_comparison([page_load, variant]).axes[0]
    assert ax.patches[1].get_facecolor()[:3] == to_rgba(KINDS["worse"][0])[:3]  # not "better" against page load
    assert ax.texts[1].get_text() == f"{paired['label']} (paired)"
    assert whisker(ax, 1) == list(paired["comparison"].other.interval)


def tta(label, seconds):
    t = fastlab.TimeToAccuracy(label, 0.5)
    # each seed's step as fast as its seconds say: tta_verdict credits seconds only where steps or speed show them
    t.runs = [RunResult(config={}, label=label, window_throughput=[1000 / s * k for k in (0.98, 1.0, 1.02)],
                        images_per_step=32, tta=TtaRecord(0.5, True, s, 5, 0.6))
              for s in seconds]
    return t


def test_the_time_to_accuracy_ladder_follows_its_verdicts():
    ttas = [tta("naive", [10, 11, 12]), tta("+workers", [5, 5.5, 6]), tta("+bf16", [5.2, 5.6, 5.9])]
    assert tta_verdict(ttas[1], ttas[2]).seconds.noise
    fig = plot_tta_ladder(ttas, not_run={"+cudnn.benchmark": CUDNN_WHY})
    ax = fig.axes[0]
    for i, kind in enumerate(["base", "better", "noise"]):
        assert ax.patches[i].get_facecolor()[:3] == to_rgba(KINDS[kind][0])[:3], ttas[i].label
    assert whisker(ax, 2) == list(tta_verdict(ttas[1], ttas[2]).seconds.other.interval)
    assert any(t.get_text().startswith("no-op here, not trained") for t in ax.texts)
    labels = legend_labels(fig)
    assert KINDS["no-op"][3] in labels and KINDS["noise"][3].format(than="the rung it builds on") in labels


def test_every_plot_of_runs_marks_a_no_op_here():
    """A run not trained is named a no-op in every plot that draws runs; a trained row whose own changed knob did
    nothing here says so in the comparison bars."""
    from fastlab.plots import plot_losses, plot_memory_trace, plot_step_split, plot_timeline

    base = rung("baseline", spaced(100), steps=10)
    base.step_seconds, base.data_wait_seconds, base.memory_trace_mb = [0.1] * 4, [0.01] * 4, [10.0] * 4
    base.losses = [(0, 2.3), (1, 2.2)]
    off = rung("cudnn.benchmark", [], status="no_op", extras={"not_trained": CUDNN_WHY}, cudnn_benchmark=True)
    both = rung("workers + pin_memory", spaced(150), no_ops={"pin_memory": "no GPU"}, num_workers=2, pin_memory=True)
    marked = "cudnn.benchmark (no-op here, not trained)"
    assert marked in [t.get_text() for t in plot_step_split([base, off]).axes[0].get_xticklabels()]
    for plot in (plot_timeline, plot_memory_trace, plot_losses):
        legend = [t.get_text() for t in plot([base, off]).axes[0].get_legend().get_texts()]
        assert any(x.startswith(marked) for x in legend), (plot.__name__, legend)
    texts = [t.get_text() for t in plot_comparison([base, off, both]).axes[0].texts]
    assert texts[1].startswith("no-op here, not trained") and texts[2].endswith(", no-op here: pin_memory")
