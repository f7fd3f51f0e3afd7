"""Plots of results: before/after bars with spread, step-time split, timelines, losses, waterfall.

Every figure says in its title when the data was synthetic. Bars show the median; whiskers the
min and max over the timed windows; a bar whose difference from the first is inside the spread
is labelled "noise".
"""

from __future__ import annotations

import io
import math
from typing import Any

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


# Marks for runs whose speed is not credited: (hatch, word shown beside the bar).
_STATUS_MARKS = {"interrupted": ("//", "stopped early, not credited"), "diverged": ("xx", "DIVERGED, not credited"),
                 "time_limited": ("..", "time limit, not credited"), "failed": ("", "failed")}
PAIRED_MARK = "baseline measured beside it (paired)"


def _ratio_labels(results: list[RunResult]) -> list[str]:
    """Per bar: the ratio to the baseline measured beside it (a panel's paired runs), else to the first result;
    a run whose speed is not credited (stopped early, diverged, failed) says so instead of a ratio."""
    if not results:
        return []
    base = results[0].throughput
    out = []
    for r in results:
        t = r.throughput
        paired = r.extras.get("paired")
        if r.status in _STATUS_MARKS:
            text = _STATUS_MARKS[r.status][1]
        elif not r.window_throughput:
            text = ""
        elif paired and paired.get("ratios"):
            text = f"{paired['label']} (paired)"
        elif r is results[0] or math.isnan(t.median) or math.isnan(base.median):
            text = ""
        elif is_noise(base, t):
            text = "noise"
        else:
            text = f"{t.median / base.median:.2f}x"
        out.append(text)
    return out


def _short_label(label: str, width: int = 30, lines: int = 2) -> str:
    """Wrap a run's label onto at most `lines` lines, ending in '...' when cut."""
    import textwrap

    wrapped = textwrap.wrap(label, width) or [""]
    if len(wrapped) > lines:
        wrapped = wrapped[:lines]
        wrapped[-1] = wrapped[-1][:width - 3] + "..."
    return "\n".join(wrapped)


def plot_comparison(results: list[RunResult], title: str = "", reference: list[RunResult] | None = None):
    """Throughput (median, min-max whiskers) and peak memory per run, one row per run; returns the Figure.

    Rows keep long labels readable however many runs there are. A run measured beside its own baseline (a
    panel's paired runs) shows that baseline as a dashed mark and its ratio to it; runs that stopped early,
    diverged or failed are hatched and say so.
    """
    n = len(results)
    fig = ShownFigure(figsize=(10, max(2.6, 0.5 * n + 1.4)), layout="constrained")
    ax_t, ax_m = fig.subplots(1, 2, sharey=True, gridspec_kw={"width_ratios": [3, 1]})
    med = [r.throughput.median if r.window_throughput else 0 for r in results]
    err = [[m - r.throughput.low if r.window_throughput else 0 for m, r in zip(med, results)],
           [r.throughput.high - m if r.window_throughput else 0 for m, r in zip(med, results)]]
    colors = ["tab:gray"] + ["tab:blue"] * (n - 1)
    colors = ["tab:red" if r.status in ("failed", "diverged") else c for r, c in zip(results, colors)]
    hatches = [_STATUS_MARKS.get(r.status, ("",))[0] for r in results]
    y = list(range(n))
    ax_t.barh(y, med, xerr=err, capsize=3, color=colors, hatch=hatches, edgecolor="white")
    ax_m.barh(y, [r.peak_memory_mb for r in results], color=colors, hatch=hatches, edgecolor="white")
    ends = [m + e for m, e in zip(med, err[1])]  # where each row's text may start: right of whisker and mark
    for i, r in enumerate(results):
        paired = r.extras.get("paired")
        if paired and paired.get("ratios"):
            ax_t.plot([paired["baseline"]] * 2, [i - 0.42, i + 0.42], color="black", ls="--", lw=1.2,
                      label=None if i and PAIRED_MARK in ax_t.get_legend_handles_labels()[1] else PAIRED_MARK)
            ends[i] = max(ends[i], paired["baseline"])
    right = max(ends + [1.0])
    for i, text in enumerate(_ratio_labels(results)):
        if text:
            ax_t.text(ends[i] + 0.02 * right, i, text, va="center", fontsize=8)
    ax_t.set_xlim(0, right * 1.5)  # room for the text right of the whiskers
    ax_t.set_yticks(y)
    ax_t.set_yticklabels([_short_label(r.label) for r in results], fontsize=8)
    ax_t.invert_yaxis()  # the first result on top
    ax_t.set_xlabel("images/s (median, min-max over timed windows)")
    ax_t.set_title("training throughput", fontsize=10)
    ax_m.set_xlabel(f"MiB ({results[0].memory_kind.replace('_', ' ')})" if results else "MiB")
    ax_m.set_title("peak memory", fontsize=10)
    if ax_t.get_legend_handles_labels()[1]:
        fig.legend(fontsize=8, loc="outside lower left")  # below the axes: never over a bar
    note = f"\nreference: {data_note(reference)}" if reference else ""
    fig.suptitle(f"{title + ' - ' if title else ''}{data_note(results)}{note}", fontsize=10)
    return fig


def plot_step_split(results: list[RunResult], title: str = ""):
    """Median per-step time split into waiting for data and everything else (compute)."""
    import statistics

    fig, (ax,) = new_figure(1, width=max(5.0, 1.1 * len(results) + 2))
    waits, copies, computes = [], [], []
    for r in results:
        warm = int(r.config.get("warmup_steps", 0))
        steps = r.step_seconds[warm:] or [0.0]
        wait = r.data_wait_seconds[warm:] or [0.0]
        # the host-to-device copy apart from data wait, where the run had a device to copy to
        copy = r.copy_seconds[warm:] if r.env.get("device_type", "cpu") != "cpu" and r.copy_seconds else [0.0]
        waits.append(1000 * statistics.median(wait))
        copies.append(1000 * statistics.median(copy))
        computes.append(1000 * (statistics.median(steps) - statistics.median(wait) - statistics.median(copy)))
    x = range(len(results))
    ax.bar(x, waits, label="waiting for data", color="tab:orange")
    if any(copies):
        ax.bar(x, copies, bottom=waits, label="copy to the device", color="tab:purple")
    ax.bar(x, computes, bottom=[w + c for w, c in zip(waits, copies)], label="compute (the rest of the step)",
           color="tab:blue")
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


# Waterfall marks: face colour, hatch and legend text for each kind of rung (drawn only for kinds present).
WATERFALL_STYLES = {
    "base": ("tab:gray", None, "the first rung (1.00x)"),
    "faster": ("tab:green", None, "faster than the rung it builds on"),
    "slower": ("tab:red", None, "slower than the rung it builds on"),
    "no-op": ("lightgray", "..", "no-op: its change does nothing here"),
    "dropped": ("white", "//", "dropped: not carried up the ladder"),
    "diverged": ("tab:orange", "xx", "diverged: speed not credited"),
    "time_limited": ("khaki", "--", "time-limited: hit its time budget"),
}


def _rung_noop(r: RunResult, below: RunResult | None) -> tuple[list[str], bool]:
    """The knobs this rung changed (against the rung it builds on) that did nothing here, and whether that
    is every knob it changed."""
    if below is None or not r.no_ops:
        return [], False
    changed = [k for k, v in r.config.items() if below.config.get(k) != v]
    noop = [k for k in changed if k in r.no_ops]
    return noop, bool(noop) and len(noop) == len(changed)


def _waterfall_kind(r: RunResult, i: int, speed: float, prev: float, all_noop: bool) -> str:
    """What a bar's colour says; a dropped rung is also hatched, whatever its kind."""
    if r.status in ("diverged", "time_limited"):
        return r.status
    if i == 0:
        return "base"
    if all_noop:
        return "no-op"
    return "faster" if speed >= prev else "slower"


def plot_waterfall(results: list[RunResult], title: str = ""):
    """The ladder: cumulative speed-up of each rung over the first (bar from the rung it builds on, whiskers
    min-max over the timed windows), with dropped, diverged, time-limited, failed and no-op rungs marked; and
    peak memory below. The title names the device and the data (SYNTHETIC or real)."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    n = len(results)
    width = min(14.0, max(8.0, 0.85 * n + 3.0))
    fig = ShownFigure(figsize=(width, 7.5), layout="constrained")
    ax, ax_m = fig.subplots(2, 1, sharex=True, height_ratios=[3, 1.2])
    base = results[0].throughput.median if results and results[0].window_throughput else float("nan")
    prev, kept = 1.0, (results[0] if results else None)  # the last rung carried up the ladder
    seen: dict[str, Any] = {}
    for i, r in enumerate(results):
        speed = r.throughput.median / base if r.window_throughput and base == base else float("nan")
        if math.isnan(speed):  # failed, interrupted or time-limited before a window finished: nothing to plot
            ax.plot(i, prev, marker="X", color="tab:red", markersize=11, linestyle="none")
            ax.annotate(r.status.replace("_", "-").upper(), (i, prev), textcoords="offset points", xytext=(0, 9),
                        ha="center", fontsize=8, color="tab:red", fontweight="bold")
            seen["stopped"] = Line2D([], [], marker="X", color="tab:red", linestyle="none",
                                     label="stopped: no timed window finished")
            continue
        noop, all_noop = _rung_noop(r, kept) if i else ([], False)
        kind = _waterfall_kind(r, i, speed, prev, all_noop)
        dropped = bool(r.extras.get("dropped"))
        face, hatch, legend = WATERFALL_STYLES[kind]
        bottom = 0.0 if i == 0 else prev
        ax.bar(i, speed - bottom, bottom=bottom, color=face, hatch=hatch or ("//" if dropped else None),
               edgecolor="black", linewidth=0.6, alpha=0.5 if dropped else 1.0)
        seen[kind] = Patch(facecolor=face, hatch=hatch, edgecolor="black", label=legend)
        if dropped:
            seen["dropped"] = Patch(facecolor="white", hatch="//", edgecolor="black",
                                    label=WATERFALL_STYLES["dropped"][2])
        t = r.throughput
        ax.errorbar(i, speed, yerr=[[speed - t.low / base], [t.high / base - speed]], color="black", capsize=3,
                    linewidth=1)
        noise = i > 0 and kept is not None and kept.window_throughput and is_noise(kept.throughput, r.throughput)
        notes = [{"diverged": "DIVERGED", "time_limited": "time-limited"}.get(kind, "")]
        notes += ["dropped" if dropped else "", "noise" if noise and r.ok and kind != "no-op" else ""]
        notes += [f"no-op:\n{', '.join(noop)}" if noop else ""]
        text = "\n".join([f"{speed:.2f}x"] + [x for x in notes if x])
        ax.annotate(text, (i, max(speed, prev, t.high / base)), textcoords="offset points", xytext=(0, 3),
                    ha="center", va="bottom", fontsize=7.5, color="tab:orange" if kind == "diverged" else "black")
        if not dropped:
            prev, kept = speed, r
    seen["spread"] = Line2D([], [], color="black", marker="_", markersize=8, label="whiskers: min-max over windows")
    ax.axhline(1.0, color="black", lw=0.5)
    ax.margins(y=0.22)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("speed-up over the first rung\n(median images/s)")
    fig.legend(handles=list(seen.values()), fontsize=7.5, loc="outside lower center",
               ncols=min(len(seen), 3 if width >= 10 else 2))
    ax_m.bar(range(n), [r.peak_memory_mb for r in results], color="tab:purple")
    kind_mem = (results[0].memory_kind or "?").replace("_", " ") if results else "?"
    ax_m.set_ylabel(f"peak memory, MiB\n({kind_mem})")
    ax_m.set_xticks(range(n))
    ax_m.set_xticklabels([r.label for r in results], rotation=30, ha="right", fontsize=8)
    devices = " / ".join(sorted({r.env.get("device_name", "?") for r in results}))
    data = " / ".join(sorted({"SYNTHETIC data" if r.synthetic else f"real data ({r.dataset.get('name', '?')})"
                              for r in results if r.dataset})) or "data not recorded"
    fig.suptitle(f"{title or 'the ladder'}: cumulative speed-up\n{devices} - {data}", fontsize=10)
    return fig


def figure_png(fig, dpi: int = 90) -> bytes:
    """The figure as PNG bytes: what a widget shows from a background thread."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()
