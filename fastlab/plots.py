"""Plots of results: before/after bars with spread, step-time split, timelines, losses, waterfall.

Every figure says in its title when the data was synthetic. Bars show the median; whiskers the
min and max over the timed windows; a bar whose difference from the first is inside the spread
is labelled "noise".
"""

from __future__ import annotations

import io
import math

from matplotlib.figure import Figure

from .measure import is_noise
from .results import RunResult


class ShownFigure(Figure):
    """A matplotlib Figure that Jupyter shows as a PNG when a cell returns it, whatever the backend.

    fastlab draws on bare Figures (not pyplot) so that widgets can draw from a background thread;
    a bare Figure would otherwise print as '<Figure size ...>' unless the inline backend is active.
    """

    def _repr_png_(self) -> bytes:
        return figure_png(self)


def data_note(results: list[RunResult]) -> str:
    names = {("SYNTHETIC data" if r.synthetic else r.dataset.get("name", "?")) for r in results if r.dataset}
    devices = {r.env.get("device_name", "?") for r in results}
    return f"{' / '.join(sorted(names))} on {' / '.join(sorted(devices))}"


def new_figure(ncols: int, width: float = 5.0, height: float = 3.6):
    # A bare Figure, not pyplot: safe to draw from a widget's background thread, and shown by
    # Jupyter only when a cell returns or displays it.
    fig = ShownFigure(figsize=(width * ncols, height))
    axes = fig.subplots(1, ncols, squeeze=False)
    return fig, list(axes[0])


def _ratio_labels(results: list[RunResult]) -> list[str]:
    base = results[0].throughput
    out = []
    for r in results:
        t = r.throughput
        if not r.ok and r.status == "failed":
            out.append("failed")
        elif r is results[0] or math.isnan(t.median) or math.isnan(base.median):
            out.append("")
        elif is_noise(base, t):
            out.append("noise")
        else:
            out.append(f"{t.median / base.median:.2f}x")
    return out


def plot_comparison(results: list[RunResult], title: str = "", reference: list[RunResult] | None = None):
    """Throughput (median, min-max whiskers) and peak memory per run; returns the Figure."""
    fig, (ax_t, ax_m) = new_figure(2, width=max(5.0, 1.1 * len(results) + 2))
    labels = [r.label for r in results]
    med = [r.throughput.median if r.window_throughput else 0 for r in results]
    err = [[m - r.throughput.low if r.window_throughput else 0 for m, r in zip(med, results)],
           [r.throughput.high - m if r.window_throughput else 0 for m, r in zip(med, results)]]
    colors = ["tab:gray"] + ["tab:blue"] * (len(results) - 1)
    colors = ["tab:red" if r.status == "failed" else c for r, c in zip(results, colors)]
    x = range(len(results))
    ax_t.bar(x, med, yerr=err, capsize=4, color=colors)
    for i, text in enumerate(_ratio_labels(results)):
        if text:
            ax_t.annotate(text, (i, med[i]), textcoords="offset points", xytext=(0, 12), ha="center", fontsize=9)
    ax_t.set_ylabel("images/s (median, min-max)")
    ax_t.set_title("training throughput")
    ax_m.bar(x, [r.peak_memory_mb for r in results], color=colors)
    ax_m.set_ylabel(f"peak memory, MiB ({results[0].memory_kind.replace('_', ' ')})" if results else "MiB")
    ax_m.set_title("peak memory")
    for ax in (ax_t, ax_m):
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, rotation=25, ha="right", fontsize=8)
    if reference:
        ax_t.text(0.99, 0.98, "reference: " + data_note(reference), transform=ax_t.transAxes, ha="right",
                  va="top", fontsize=7)
    fig.suptitle(f"{title + ' - ' if title else ''}{data_note(results)}", fontsize=10)
    fig.tight_layout()
    return fig


def plot_step_split(results: list[RunResult], title: str = ""):
    """Median per-step time split into waiting for data and everything else (compute)."""
    import statistics

    fig, (ax,) = new_figure(1, width=max(5.0, 1.1 * len(results) + 2))
    waits, computes = [], []
    for r in results:
        warm = int(r.config.get("warmup_steps", 0))
        steps = r.step_seconds[warm:] or [0.0]
        wait = r.data_wait_seconds[warm:] or [0.0]
        waits.append(1000 * statistics.median(wait))
        computes.append(1000 * (statistics.median(steps) - statistics.median(wait)))
    x = range(len(results))
    ax.bar(x, waits, label="waiting for data", color="tab:orange")
    ax.bar(x, computes, bottom=waits, label="compute (the rest of the step)", color="tab:blue")
    ax.set_xticks(list(x))
    ax.set_xticklabels([r.label for r in results], rotation=25, ha="right", fontsize=8)
    ax.set_ylabel("ms per step (median)")
    ax.legend(fontsize=8)
    ax.set_title(f"{title + ' - ' if title else ''}where a step's time goes\n{data_note(results)}", fontsize=10)
    fig.tight_layout()
    return fig


def plot_timeline(results: list[RunResult], title: str = ""):
    """Per step: the share of the step spent busy (not waiting for data), or NVML GPU utilisation when sampled."""
    fig, (ax,) = new_figure(1, width=8)
    for r in results:
        if r.gpu_util:
            ax.plot([t for t, _ in r.gpu_util], [u for _, u in r.gpu_util], label=f"{r.label} (GPU util, NVML)")
            ax.set_xlabel("seconds")
        else:
            busy = [100 * (1 - w / s) if s else 0 for w, s in zip(r.data_wait_seconds, r.step_seconds)]
            ax.plot(range(len(busy)), busy, marker=".", label=f"{r.label} (busy share of step)")
            ax.set_xlabel("step")
    ax.set_ylim(-5, 105)
    ax.set_ylabel("% busy")
    ax.legend(fontsize=8)
    ax.set_title(f"{title + ' - ' if title else ''}utilisation over time\n{data_note(results)}", fontsize=10)
    fig.tight_layout()
    return fig


def plot_losses(results: list[RunResult], title: str = "", by: str = "step"):
    """Training loss against optimiser step (by="step") or against wall-clock seconds (by="time")."""
    fig, (ax,) = new_figure(1, width=7)
    for r in results:
        if not r.losses:
            continue
        steps = [s for s, _ in r.losses]
        if by == "time":
            elapsed, t = [], 0.0
            for sec in r.step_seconds:
                t += sec
                elapsed.append(t)
            xs = [elapsed[min(s, len(elapsed) - 1)] for s in steps]
        else:
            xs = steps
        ax.plot(xs, [v for _, v in r.losses], label=r.label)
    ax.set_xlabel("seconds" if by == "time" else "step")
    ax.set_ylabel("training loss")
    ax.legend(fontsize=8)
    ax.set_title(f"{title + ' - ' if title else ''}loss\n{data_note(results)}", fontsize=10)
    fig.tight_layout()
    return fig


def plot_memory_trace(results: list[RunResult], title: str = ""):
    """Memory in use after each step (CUDA allocated, or process RSS on CPU)."""
    fig, (ax,) = new_figure(1, width=7)
    for r in results:
        ax.plot(range(1, len(r.memory_trace_mb) + 1), r.memory_trace_mb, label=r.label)
    ax.set_xlabel("step")
    ax.set_ylabel(f"MiB ({results[0].memory_kind.replace('_', ' ')})" if results else "MiB")
    ax.legend(fontsize=8)
    ax.set_title(f"{title + ' - ' if title else ''}memory over steps\n{data_note(results)}", fontsize=10)
    fig.tight_layout()
    return fig


def plot_waterfall(results: list[RunResult], title: str = ""):
    """Cumulative speed-up of each rung over the first, with the step from the rung before it, and peak memory."""
    fig, (ax, ax_m) = new_figure(2, width=max(5.0, 0.9 * len(results) + 2))
    base = results[0].throughput.median if results and results[0].window_throughput else float("nan")
    prev = 1.0
    kept = results[0] if results else None  # the last rung carried up the ladder
    labels = [r.label for r in results]
    for i, r in enumerate(results):
        speed = r.throughput.median / base if r.window_throughput and base == base else float("nan")
        if math.isnan(speed):
            ax.bar(i, 0, color="tab:red")
            ax.annotate("failed" if r.status == "failed" else "n/a", (i, 0), ha="center", fontsize=8)
            continue
        dropped = bool(r.extras.get("dropped"))
        color = "tab:gray" if i == 0 else ("tab:green" if speed >= prev else "tab:red")
        ax.bar(i, speed - prev if i else speed, bottom=prev if i else 0, color=color,
               alpha=0.4 if dropped else 1.0, hatch="//" if dropped else None)
        noise = i > 0 and kept is not None and kept.window_throughput and is_noise(kept.throughput, r.throughput)
        note = " (dropped)" if dropped else (" (noise)" if noise else "")
        ax.annotate(f"{speed:.2f}x{note}", (i, max(speed, prev)), textcoords="offset points",
                    xytext=(0, 4), ha="center", fontsize=8)
        if not dropped:
            prev = speed
            kept = r
    ax.axhline(1.0, color="black", lw=0.5)
    ax.set_ylabel("speed-up over the first rung (median images/s)")
    ax.set_title("cumulative speed-up")
    ax_m.bar(range(len(results)), [r.peak_memory_mb for r in results], color="tab:purple")
    ax_m.set_ylabel("peak memory, MiB")
    ax_m.set_title("peak memory")
    for a in (ax, ax_m):
        a.set_xticks(range(len(results)))
        a.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    fig.suptitle(f"{title + ' - ' if title else ''}{data_note(results)}", fontsize=10)
    fig.tight_layout()
    return fig


def figure_png(fig, dpi: int = 90) -> bytes:
    """The figure as PNG bytes: what a widget shows from a background thread."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()
