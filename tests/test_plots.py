"""The figures of fastlab.plots: the bench waterfall (readable, every label inside, each kind of rung marked), the
memory breakdown."""

import matplotlib

matplotlib.use("Agg")

from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from fastlab.lessons import memory  # noqa: E402
from fastlab.plots import INTERVAL_WORDS, KINDS, figure_png, plot_memory_breakdowns, plot_waterfall  # noqa: E402
from fastlab.results import RunResult  # noqa: E402

DEVICE = "CPU (2 cores, x86_64)"


def rung(label, windows, status="ok", dropped=None, no_ops=None, **config):
    r = RunResult(config={"warmup_steps": 1, **config}, label=label, status=status, window_throughput=list(windows),
                  peak_memory_mb=300.0, memory_kind="process_rss", no_ops=no_ops or {},
                  dataset={"name": "synthetic", "synthetic": True}, env={"device_name": DEVICE})
    if dropped:
        r.dropped = dropped
    return r


def ladder():
    return [rung("naive", [100, 105, 110]),
            rung("+workers", [160, 170, 185], num_workers=2),
            rung("+cudnn.benchmark", [168, 172, 180], no_ops={"cudnn_benchmark": "CPU"}, num_workers=2,
                 cudnn_benchmark=True),
            rung("+bf16", [60, 65, 70], dropped="0.38x the rung below it", num_workers=2, cudnn_benchmark=True,
                 amp="bf16"),
            rung("+fused AdamW", [200, 240, 260], status="diverged", dropped="diverged", num_workers=2,
                 cudnn_benchmark=True, opt_impl="fused"),
            rung("+batch 512", [], status="failed", dropped="failed: out of memory", num_workers=2,
                 cudnn_benchmark=True, batch_size=512)]


def texts(fig):
    FigureCanvasAgg(fig).draw()  # lays the figure out (constrained layout) as savefig would
    return [t for t in fig.findobj(Text) if t.get_text() and t.get_visible()]


def test_title_names_device_and_synthetic_data_and_each_kind_of_rung_is_marked():
    fig = plot_waterfall(ladder(), title="fastlab bench")
    words = " ".join(t.get_text() for t in texts(fig))
    assert DEVICE in fig.get_suptitle() and "SYNTHETIC" in fig.get_suptitle()
    assert "DIVERGED" in words and KINDS["diverged"][3] in words
    assert "dropped" in words and "not comparable: failed" in " ".join(words.split())
    assert "no-op:\ncudnn_benchmark" in words  # the rung whose only change did nothing here
    assert INTERVAL_WORDS in words
    assert figure_png(fig)[:4] == b"\x89PNG"


def test_every_label_is_inside_the_figure_at_a_readable_aspect():
    fig = plot_waterfall(ladder(), title="fastlab bench")
    width, height = fig.get_size_inches()
    assert width / height < 2  # not a wide, short strip
    texts(fig)
    renderer = fig.canvas.get_renderer()
    box = fig.bbox
    # what is drawn: each axes with its tick labels, axis labels and annotations; the title; the legend
    parts = {f"axes {i}": ax.get_tightbbox(renderer) for i, ax in enumerate(fig.axes)}
    parts["title"] = fig._suptitle.get_window_extent(renderer)
    parts.update({f"legend {i}": leg.get_window_extent(renderer) for i, leg in enumerate(fig.legends)})
    assert fig.axes[0].yaxis.label.get_text().startswith("speed-up over the first rung")
    parts["y-label"] = fig.axes[0].yaxis.label.get_window_extent(renderer)
    for name, ext in parts.items():
        assert box.x0 - 1 <= ext.x0 and ext.x1 <= box.x1 + 1 and box.y0 - 1 <= ext.y0 and ext.y1 <= box.y1 + 1, \
            f"{name} is clipped: {ext} outside {box}"


def test_real_data_is_named_as_real():
    results = ladder()[:2]
    for r in results:
        r.dataset = {"name": "cifar10", "synthetic": False}
    assert "real cifar10" in plot_waterfall(results).get_suptitle()


def test_the_memory_breakdown_stacks_each_component_and_the_recompute():
    rows = [memory.measure_breakdown("tiny", 4), memory.measure_breakdown("tiny", 4, checkpointing=True)]
    ax = plot_memory_breakdowns(rows).axes[0]
    assert "SYNTHETIC" in ax.get_title()
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == [*memory.COMPONENTS, "recomputed in backward (one segment)"]
