"""Plots of results: before/after bars with spread, step-time split, timelines, losses, waterfall, time to accuracy.

Every figure says in its title when the data was synthetic. Comparison figures draw each bar as the one
comparison (fastlab.verdicts) judges it (KINDS, MARKS); whiskers are the interval of the median it compares.
"""

from __future__ import annotations

import io
import itertools
import math
import statistics
import textwrap
from collections.abc import Sequence
from typing import Any

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from .measure import Spread
from .outcomes import TimeToAccuracy, TtaVerdict, built_on, tta_verdict
from .results import RunResult, median_step_seconds, step_time
from .verdicts import Comparison, pooled_throughput, ratio_of, runs_verdict, uncredited


class ShownFigure(Figure):
    """A Figure Jupyter shows as a PNG whatever the backend; bare (not pyplot), so widgets draw from a thread."""

    def _repr_png_(self) -> bytes:
        return figure_png(self)


def data_note(results: list[RunResult]) -> str:
    names = {r.data_name for r in results if r.dataset}
    devices = {r.env.get("device_name", "?") for r in results}
    return f"{' / '.join(sorted(names))} on {' / '.join(sorted(devices))}"


def _finish(fig: ShownFigure, ax: Any, title: str, what: str, results: list[RunResult]) -> ShownFigure:
    """A one-axis plot's legend, title (what, on which data) and layout."""
    ax.legend(fontsize=8)
    ax.set_title(f"{title + ' - ' if title else ''}{what}\n{data_note(results)}", fontsize=10)
    fig.tight_layout()
    return fig


def new_figure(ncols: int, width: float = 5.0, height: float = 3.6):
    fig = ShownFigure(figsize=(width * ncols, height))
    axes = fig.subplots(1, ncols, squeeze=False)
    return fig, list(axes[0])


# kind -> (face colour, hatch, marker where no bar can be drawn, legend words; "{than}": what a bar is compared with)
KINDS = {
    "base": ("tab:gray", "", "s", "the first: what the others are compared with"),
    "better": ("tab:green", "", "^", "better than {than}: outside the noise rule's spread"),
    "worse": ("tab:red", "", "v", "worse than {than}: outside the noise rule's spread"),
    "noise": ("gainsboro", "", "o", "noise: no difference from {than} detected (inside the noise rule's spread)"),
    "not_comparable": ("white", "", "X", "not comparable: nothing credited to compare (why: above it)"),
    "diverged": ("tab:orange", "xx", "X", "diverged: the loss went non-finite; speed shown, never credited"),
    "no-op": ("white", "..", "o", "no-op: not trained, every change does nothing here (why: above it)"),
}
# Marks over a bar's colour: hatch and the legend's words.
MARKS = {"dropped": ("//", "dropped: not carried up the ladder"),
         "time_limited": ("--", "time-limited: stopped at its time budget, judged by the windows it finished")}
INTERVAL_WORDS = "whiskers: the interval of the median the noise rule compares (about 95%)"
REPEATS_WORDS = "dots: each interleaved repeat's median (noise unless every repeat differs the same way)"
PAIRED_MARK = "baseline measured beside it (paired)"


def judged_kind(r: RunResult, c: Comparison | None) -> str:
    """A bar's kind (a key of KINDS): its run's state where that rules its speed out, else the comparison's."""
    if r.status == "no_op":
        return "no-op"
    if uncredited([r]) is not None:
        return "diverged" if r.status == "diverged" else "not_comparable"
    if c is None:
        return "base"
    return c.direction if c.comparable else "not_comparable"


def judged_spread(r: RunResult, c: Comparison | None) -> Spread:
    """The spread a bar and its whiskers show: the comparison's own (c.other), else the run's pooled windows."""
    return c.other if c is not None and c.comparable else pooled_throughput(r)


def kind_words(kind: str, r: RunResult, c: Comparison | None) -> str:
    """What is written beside a bar of this kind: the ratio, "noise", or why it has none."""
    if kind in ("better", "worse"):
        return f"{c.ratio:.2f}x" if c is not None else ""
    if kind == "noise":
        return "noise"
    if kind == "diverged":
        return "DIVERGED, not credited"
    if kind == "no-op":
        return f"{NO_OP_WORDS}: {r.extras.get('not_trained') or r.error or 'every change is a no-op here'}"
    if kind == "not_comparable":
        side = "its baseline " if c is not None and c.side == "base" else ""
        return f"not comparable: {side}{(c.status if c is not None and c.status else r.status).replace('_', '-')}"
    return ""


NO_OP_WORDS = "no-op here, not trained"  # what every plot writes of a run that was not trained: no change acts here


def run_label(r: RunResult) -> str:
    """A run's name on an axis or in a legend: its label, marked as a no-op where it was not trained."""
    return f"{r.label} ({NO_OP_WORDS})" if r.status == "no_op" else r.label


def own_no_ops(r: RunResult, built_on: RunResult | None) -> list[str]:
    """The knobs this trained run changed from the run it is compared with that did nothing here (its no-ops)."""
    return [] if r.status == "no_op" else [k for k in own_knobs(r, built_on) if k in r.no_ops]


def marks_of(r: RunResult) -> list[str]:
    """The MARKS a run carries: dropped from the ladder, stopped at its time budget."""
    return [m for m, on in (("dropped", r.dropped), ("time_limited", r.status == "time_limited")) if on]


def kind_hatch(kind: str, marks: list[str]) -> str:
    return KINDS[kind][1] + "".join(MARKS[m][0] for m in marks)


def legend_handles(kinds: list[str], marks: list[str], than: str, markers: set[str] = frozenset(),
                   repeats: bool = False) -> list[Any]:
    """One legend entry per kind and mark drawn, then the whiskers. markers: the kinds drawn as a marker, not a bar."""
    out: list[Any] = []
    for k, (face, hatch, marker, words) in KINDS.items():
        if k in kinds:
            label = words.format(than=than)
            out.append(Line2D([], [], marker=marker, color="black", markerfacecolor=face, linestyle="none",
                              label=label) if k in markers else
                       Patch(facecolor=face, hatch=hatch, edgecolor="black", label=label))
    out += [Patch(facecolor="white", hatch=h, edgecolor="black", label=w) for m, (h, w) in MARKS.items() if m in marks]
    out.append(Line2D([], [], color="black", marker="_", markersize=8, label=INTERVAL_WORDS))
    if repeats:
        out.append(Line2D([], [], color="black", marker=".", linestyle="none", label=REPEATS_WORDS))
    return out


def _short_label(label: str, width: int = 30, lines: int = 2) -> str:
    """Wrap a run's label onto at most `lines` lines, ending in '...' when cut."""
    wrapped = textwrap.wrap(label, width) or [""]
    if len(wrapped) > lines:
        wrapped = wrapped[:lines]
        wrapped[-1] = wrapped[-1][:width - 3] + "..."
    return "\n".join(wrapped)


def _row_comparison(results: list[RunResult], r: RunResult) -> Comparison:
    """A row against the baseline measured beside it (a panel's paired runs), else against the first row."""
    c = (r.extras.get("paired") or {}).get("comparison")
    return c if isinstance(c, Comparison) else runs_verdict(results[0], r)


def plot_comparison(results: list[RunResult], title: str = "", reference: list[RunResult] | None = None):
    """Throughput and peak memory, one row per run; returns the Figure. Each row is drawn as the one comparison
    judges it against the first row, or against the baseline measured beside it (a dashed mark)."""
    n = len(results)
    fig = ShownFigure(figsize=(10, max(2.6, 0.5 * n + 1.8)), layout="constrained")
    ax_t, ax_m = fig.subplots(1, 2, sharey=True, gridspec_kw={"width_ratios": [3, 1]})
    cs: list[Comparison | None] = [None] + [_row_comparison(results, r) for r in results[1:]]
    kinds = [judged_kind(r, c) for r, c in zip(results, cs)]
    spreads = [judged_spread(r, c) for r, c in zip(results, cs)]
    med = [s.median if s.n else 0 for s in spreads]
    bounds = [s.interval if s.n else (0, 0) for s in spreads]
    err = [[m - lo for m, (lo, _) in zip(med, bounds)], [hi - m for m, (_, hi) in zip(med, bounds)]]
    marks = [marks_of(r) for r in results]
    y = list(range(n))
    ax_t.barh(y, med, xerr=err, capsize=3, color=[KINDS[k][0] for k in kinds], edgecolor="black", linewidth=0.6,
              hatch=[kind_hatch(k, m) for k, m in zip(kinds, marks)])
    ax_m.barh(y, [r.peak_memory_mb for r in results], color="tab:purple")
    ends = [m + e for m, e in zip(med, err[1])]  # where each row's text may start: right of whisker and mark
    handles = legend_handles(kinds, [m for ms in marks for m in ms], than="its baseline")
    paired_rows = [i for i, r in enumerate(results) if (r.extras.get("paired") or {}).get("ratios")]
    for i in paired_rows:
        baseline = results[i].extras["paired"]["baseline"]
        ax_t.plot([baseline] * 2, [i - 0.42, i + 0.42], color="black", ls="--", lw=1.2)
        ends[i] = max(ends[i], baseline)
    if paired_rows:
        handles.append(Line2D([], [], color="black", ls="--", lw=1.2, label=PAIRED_MARK))
    right = max(ends + [1.0])
    for i, r in enumerate(results):
        paired = r.extras.get("paired") or {}
        text = kind_words(kinds[i], r, cs[i])
        if kinds[i] in ("better", "worse", "noise") and isinstance(paired.get("comparison"), Comparison):
            text = f"{paired['label']} (paired)"  # the panel's words: the median of its pairs' ratios
        text += "".join(f", {m.replace('_', '-')}" for m in marks[i])
        noop = own_no_ops(r, results[0]) if i else []
        text += f", no-op here: {', '.join(noop)}" if noop else ""
        ax_t.text(ends[i] + 0.02 * right, i, text, va="center", fontsize=8)
    ax_t.set_xlim(0, right * 1.5)  # room for the text right of the whiskers
    ax_t.set_yticks(y)
    ax_t.set_yticklabels([_short_label(r.label) for r in results], fontsize=8)
    ax_t.invert_yaxis()  # the first result on top
    ax_t.set_xlabel("images/s (median; whiskers: the interval of the median the noise rule compares)")
    ax_t.set_title("training throughput", fontsize=10)
    ax_m.set_xlabel(f"MiB ({results[0].memory_kind.replace('_', ' ')})" if results else "MiB")
    ax_m.set_title("peak memory", fontsize=10)
    fig.legend(handles=handles, fontsize=7.5, loc="outside lower left", ncols=2)  # below the axes: never over a bar
    note = f"\nreference: {data_note(reference)}" if reference else ""
    fig.suptitle(f"{title + ' - ' if title else ''}{data_note(results)}{note}", fontsize=10)
    return fig


TRAP_WORDS = "trap demonstration: one short run (its steps, timed window or not)"


def plot_step_times(results: list[RunResult], title: str = ""):
    """Seconds a step, one row per run: results.median_step_seconds (whiskers: the min and max of the steps it is the
    median of), written as results.step_time. A trap's short demonstration run is hatched and marked, with how many
    times the first row's step of the same images a step it took: its slowdown shows even without a timed window."""
    fig = ShownFigure(figsize=(10, max(2.6, 0.5 * len(results) + 1.8)), layout="constrained")
    ax = fig.subplots()
    steps = [r.step_seconds[int(r.config.get("warmup_steps", 0)):] or r.step_seconds or [0.0] for r in results]
    med = [median_step_seconds(r) if r.step_seconds else 0.0 for r in results]
    err = [[m - min(s) for m, s in zip(med, steps)], [max(s) - m for m, s in zip(med, steps)]]
    traps = [bool(r.trap) for r in results]
    ax.barh(range(len(results)), med, xerr=err, capsize=3, color=["tab:red" if t else "tab:gray" for t in traps],
            hatch=["xx" if t else "" for t in traps], edgecolor="black", linewidth=0.6)
    right = max([m + e for m, e in zip(med, err[1])] + [1e-3])
    for i, r in enumerate(results):
        first = next(b for b in results if b.images_per_step == r.images_per_step)
        ratio = (f", {med[i] / med[results.index(first)]:.1f}x the step of {first.label}"
                 if first is not r and med[results.index(first)] > 0 else "")
        ax.text(med[i] + err[1][i] + 0.02 * right, i, f"{step_time(r)}{ratio}" + (", TRAP" if traps[i] else ""),
                va="center", fontsize=8)
    ax.set_xlim(0, right * 1.9)  # room for the words right of the whiskers
    ax.set_yticks(range(len(results)))
    ax.set_yticklabels([_short_label(r.label) for r in results], fontsize=8)
    ax.invert_yaxis()  # the first result on top
    ax.set_xlabel("host seconds a step (median; whiskers: min and max of those steps)")
    if any(traps):
        ax.legend(handles=[Patch(facecolor="tab:red", hatch="xx", edgecolor="black", label=TRAP_WORDS)], fontsize=8)
    ax.set_title(f"{title + ' - ' if title else ''}seconds a step\n{data_note(results)}", fontsize=10)
    return fig


def plot_step_split(results: list[RunResult], title: str = ""):
    """Median per-step time split into waiting for data, the copy to the device and the rest (compute)."""
    fig, (ax,) = new_figure(1, width=max(5.0, 1.1 * len(results) + 2))
    waits, copies, computes = [], [], []
    for r in results:
        warm = int(r.config.get("warmup_steps", 0))
        steps = r.step_seconds[warm:] or [0.0]
        wait = r.data_wait_seconds[warm:] or [0.0]
        sampled = len(r.copy_seconds) == len(r.sampled_step_seconds)  # the sampled steps' copies, else every step's
        copy = (r.copy_seconds if sampled else r.copy_seconds[warm:]) or [0.0]
        copy = copy if r.env.get("device_type", "cpu") != "cpu" else [0.0]
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
    ax.set_xticklabels([run_label(r) for r in results], rotation=25, ha="right", fontsize=8)
    ax.set_ylabel("ms per step (median)")
    return _finish(fig, ax, title, "where a step's time goes", results)


def plot_timeline(results: list[RunResult], title: str = ""):
    """Per step: the share of the step spent busy (not waiting for data), or NVML GPU utilisation when sampled."""
    fig, (ax,) = new_figure(1, width=8)
    for r in results:
        if r.gpu_util:
            ax.plot([t for t, _ in r.gpu_util], [u for _, u in r.gpu_util], label=f"{r.label} (GPU util, NVML)")
            ax.set_xlabel("seconds")
        else:
            busy = [100 * (1 - w / s) if s else 0 for w, s in zip(r.data_wait_seconds, r.step_seconds)]
            ax.plot(range(len(busy)), busy, marker=".", label=f"{run_label(r)} (busy share of step)")
            ax.set_xlabel("step")
    ax.set_ylim(-5, 105)
    ax.set_ylabel("% busy")
    return _finish(fig, ax, title, "utilisation over time", results)


def plot_losses(results: list[RunResult], title: str = "", by: str = "step"):
    """Training loss against optimiser step (by="step") or against wall-clock seconds (by="time")."""
    fig, (ax,) = new_figure(1, width=7)
    for r in results:
        if not r.losses:
            if r.status == "no_op":  # named in the legend, with nothing to draw
                ax.plot([], [], linestyle="none", label=run_label(r))
            continue
        xs = [s for s, _ in r.losses]
        if by == "time":
            elapsed = list(itertools.accumulate(r.step_seconds))
            xs = [elapsed[min(s, len(elapsed) - 1)] for s in xs]
        ax.plot(xs, [v for _, v in r.losses], label=r.label)
    ax.set_xlabel("seconds" if by == "time" else "step")
    ax.set_ylabel("training loss")
    return _finish(fig, ax, title, "loss", results)


def plot_memory_trace(results: list[RunResult], title: str = ""):
    """Memory in use after each step (CUDA allocated, or process RSS on CPU)."""
    fig, (ax,) = new_figure(1, width=7)
    for r in results:
        ax.plot(range(1, len(r.memory_trace_mb) + 1), r.memory_trace_mb, label=run_label(r))
    ax.set_xlabel("step")
    ax.set_ylabel(f"MiB ({results[0].memory_kind.replace('_', ' ')})" if results else "MiB")
    return _finish(fig, ax, title, "memory over steps", results)


def own_knobs(r: RunResult, built_on: RunResult | None, ignore: tuple[str, ...] = ("max_seconds", "seed")) -> list[str]:
    """The config fields, but `ignore`, in which this rung differs from the rung it was built on (trained or not)."""
    if built_on is None:
        return []
    return [k for k, v in r.config.items() if built_on.config.get(k) != v and k not in ignore]


def plot_waterfall(results: list[RunResult], title: str = ""):
    """The ladder: cumulative speed-up of each rung over the first, each bar drawn as runs_verdict judges it
    against the rung it builds on; untrained, dropped, diverged and time-limited rungs and no-op knobs marked;
    peak memory below."""
    n = len(results)
    width = min(14.0, max(8.0, 0.85 * n + 3.0))
    fig = ShownFigure(figsize=(width, 7.5), layout="constrained")
    ax, ax_m = fig.subplots(2, 1, sharex=True, height_ratios=[3, 1.2])
    first = pooled_throughput(results[0]) if results else Spread.of([])
    base = first.median if first.n and first.median > 0 else math.nan
    prev, below, built_on = 1.0, None, None  # the last trained rung carried up (its speed); the last carried up
    kinds, marks, markers, repeats = [], [], set(), False
    for i, r in enumerate(results):
        c = runs_verdict(below, r) if below is not None else None
        kind = judged_kind(r, c)
        s = judged_spread(r, c)
        speed = ratio_of(first, s).median if s.n else math.nan
        own = marks_of(r)
        kinds.append(kind)
        marks += own
        notes = [f"{speed:.2f}x"] if speed == speed else []
        notes += [_short_label(kind_words(kind, r, c) if kind not in ("better", "worse", "base") else "", 18, 5)]
        notes += [m.replace("_", "-") for m in own]
        noop = own_no_ops(r, built_on)
        notes += [f"no-op:\n{', '.join(noop)}" if noop else ""]
        text = "\n".join(x for x in notes if x)
        face, hatch, marker, _ = KINDS[kind]
        if speed != speed:  # nothing timed that can be drawn: a marker at the level it would build on
            markers.add(kind)
            ax.plot(i, prev, marker=marker, color="black", markerfacecolor=face, markersize=10, linestyle="none")
            top = prev
        else:
            bottom = 0.0 if i == 0 else prev
            lo, hi = s.interval
            ax.bar(i, speed - bottom, bottom=bottom, color=face, hatch=kind_hatch(kind, own), edgecolor="black",
                   linewidth=0.6, alpha=0.5 if "dropped" in own else 1.0)
            ax.errorbar(i, speed, yerr=[[speed - lo / base], [hi / base - speed]], color="black", capsize=3,
                        linewidth=1)
            if len(s.repeats) >= 2:
                repeats = True
                ax.plot([i] * len(s.repeats), [ratio_of(first, x).median for x in s.repeats], ".", color="black", ms=4)
            top = max(speed, prev, hi / base)
        ax.annotate(text, (i, top), textcoords="offset points", xytext=(0, 3), ha="center", va="bottom",
                    fontsize=7.5, color="tab:orange" if kind == "diverged" else "black")
        if not r.dropped:
            built_on = r
            if r.status != "no_op":
                below = r
                prev = speed if speed == speed else prev
    ax.axhline(1.0, color="black", lw=0.5)
    ax.margins(y=0.22)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("speed-up over the first rung\n(median images/s)")
    handles = legend_handles(kinds, marks, than="the rung it builds on", markers=markers, repeats=repeats)
    fig.legend(handles=handles, fontsize=7.5, loc="outside lower center", ncols=2 if width >= 12 else 1)
    ax_m.bar(range(n), [r.peak_memory_mb for r in results], color="tab:purple")
    kind_mem = (results[0].memory_kind or "?").replace("_", " ") if results else "?"
    ax_m.set_ylabel(f"peak memory, MiB\n({kind_mem})")
    ax_m.set_xticks(range(n))
    ax_m.set_xticklabels([r.label for r in results], rotation=30, ha="right", fontsize=8)
    devices = " / ".join(sorted({r.env.get("device_name", "?") for r in results}))
    data = " / ".join(sorted({r.data_name for r in results if r.dataset})) or "data not recorded"
    fig.suptitle(f"{title or 'the ladder'}: cumulative speed-up\n{devices} - {data}", fontsize=10)
    return fig


def plot_memory_breakdowns(rows: Sequence[Any], title: str = ""):
    """Stacked bars, one per lessons.memory MemoryBreakdown (notebooks 02 and 12): parameters, gradients, optimiser state,
    activations, weight copies; what checkpointing recomputes in backward hatched on top."""
    fig = ShownFigure(figsize=(max(6.0, 1.6 * len(rows) + 2), 4.2))
    ax = fig.subplots()
    bottoms = [0.0] * len(rows)
    for comp, color in zip(rows[0].component_mb(), ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")):
        values = [r.component_mb()[comp] for r in rows]
        ax.bar(range(len(rows)), values, bottom=bottoms, color=color, label=comp)
        bottoms = [b + v for b, v in zip(bottoms, values)]
    recompute = [r.recompute_mb for r in rows]
    if any(recompute):
        ax.bar(range(len(rows)), recompute, bottom=bottoms, color="none", edgecolor="tab:red", hatch="//",
               label="recomputed in backward (one segment)")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([r.label.replace(", ", "\n") for r in rows], fontsize=7)
    ax.set_ylabel("MiB")
    ax.legend(fontsize=7)
    devices = sorted({r.device for r in rows})
    ax.set_title(f"{title + ' - ' if title else ''}one training step's memory, by component\nrandom SYNTHETIC inputs "
                 f"on {', '.join(devices)}; {rows[0].source}", fontsize=9)
    fig.tight_layout()
    return fig


def plot_tta_curves(ttas: Sequence[TimeToAccuracy], title: str = "") -> ShownFigure:
    """Held-out accuracy against training seconds, one line per seed, one colour per group (fastlab.outcomes'
    TimeToAccuracy: notebooks 04 and 06), the target dashed; a seed that diverged is marked."""
    fig = ShownFigure(figsize=(7.5, 4.0), layout="constrained")
    ax = fig.subplots()
    runs = [r for t in ttas for r in t.runs]
    for i, t in enumerate(ttas):
        for j, r in enumerate(t.runs):
            curve = r.tta_curve
            if curve:
                ax.plot([c[0] for c in curve], [100 * c[2] for c in curve], color=f"C{i}", marker=".", lw=1.2,
                        alpha=0.85, label=t.label if j == 0 else None)
            if r.status == "diverged":
                ax.annotate("diverged", (curve[-1][0] if curve else 0, 0), color=f"C{i}", fontsize=8)
    ax.axhline(100 * ttas[0].target, color="black", ls="--", lw=0.8, label=f"target {ttas[0].target:.0%}")
    ax.set_xlabel("training seconds (warm-up included, evaluation excluded)")
    ax.set_ylabel("held-out accuracy, %")
    ax.legend(fontsize=8)
    ax.set_title(f"{title + ' - ' if title else ''}time to accuracy, one line per seed\n{data_note(runs)}",
                 fontsize=10)
    return fig


def tta_kind(t: TimeToAccuracy, v: TtaVerdict | None) -> str:
    """A time-to-accuracy rung's kind (plots.KINDS) by tta_verdict against the rung it builds on (v None: first);
    a gain the verdict does not credit, or a verdict that could not tell, is "noise"."""
    if any(r.status == "diverged" for r in t.runs):
        return "diverged"
    if not t.reached:
        return "not_comparable"
    if v is None:
        return "base"
    if v.faster:
        return "better"
    return "worse" if v.told and (v.seconds is None or v.seconds.direction == "worse") else "noise"


def plot_tta_ladder(ttas: Sequence[TimeToAccuracy], title: str = "time to accuracy",
                    not_run: dict[str, str] | None = None) -> ShownFigure:
    """Bars of seconds to target per rung (`fastlab bench --metric time-to-accuracy`, notebook 06), drawn as
    tta_verdict judges each against the rung it builds on; not_run: rung -> why it was not run (a marker)."""
    fig = ShownFigure(figsize=(8.0, 5.6), layout="constrained")
    ax = fig.subplots()
    names = [t.label for t in ttas] + list(not_run or {})
    kinds, marks, markers = [], [], {"no-op"}  # markers: the kinds drawn as a marker (no bar)
    for i, t in enumerate(ttas):
        below = built_on(ttas, i)  # the last rung carried up
        v = tta_verdict(below, t) if below is not None else None
        kind = tta_kind(t, v)
        kinds.append(kind)
        dropped = ["dropped"] if t.runs and t.runs[0].dropped else []
        marks += dropped
        face = KINDS[kind][0]
        if t.reached:
            s = v.seconds.other if v is not None and v.seconds is not None else t.seconds
            lo, hi = s.interval
            ax.bar(i, s.median, color=face, hatch=kind_hatch(kind, dropped), edgecolor="black", linewidth=0.6)
            ax.errorbar(i, s.median, yerr=[[s.median - lo], [hi - s.median]], color="black", capsize=4)
            ratio = f"{v.seconds.gain:.2f}x" if v is not None and v.seconds is not None else ""
            words = {"noise": "noise", "diverged": "DIVERGED"}.get(kind) or (
                "fewer seeds reached" if kind == "worse" and not ratio else "")
            text = "\n".join(x for x in (f"{t.reached}/{len(t.runs)}", ratio, words) if x)
            ax.text(i, hi, text, ha="center", va="bottom", fontsize=8)
        else:
            why = "diverged" if kind == "diverged" else "not reached"
            markers.add(kind)
            ax.plot(i, 0, marker=KINDS[kind][2], color="black", markerfacecolor=face, ms=10, clip_on=False)
            ax.annotate(why, (i, 0), textcoords="offset points", xytext=(0, 9), ha="center", va="bottom",
                        rotation=90, color="tab:red", fontsize=9)
    for j, why in enumerate((not_run or {}).values(), start=len(ttas)):
        kinds.append("no-op")
        ax.plot(j, 0, marker=KINDS["no-op"][2], color="black", markerfacecolor="white", ms=10, clip_on=False)
        ax.annotate(f"{NO_OP_WORDS}:\n" + _short_label(why, 18, 4), (j, 0), textcoords="offset points",
                    xytext=(0, 9), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    ax.set_xlim(-0.6, len(names) - 0.4)  # a last rung with no bar keeps its "not reached" inside the axes
    ax.margins(y=0.2)
    ax.set_ylabel("training seconds to target (lower is better)")
    first = ttas[0].runs[0] if ttas and ttas[0].runs else None
    if first is not None:
        title = f"{title}: {ttas[0].target:.0%} held-out accuracy, {first.env.get('device_name')}, {first.data_name}"
    ax.set_title(title, fontsize=9)
    fig.legend(handles=legend_handles(kinds, marks, than="the rung it builds on", markers=markers), fontsize=7,
               loc="outside lower center")
    return fig


def figure_png(fig, dpi: int = 90) -> bytes:
    """The figure as PNG bytes: what a widget shows from a background thread."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()
