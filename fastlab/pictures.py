"""Two pictures: the data pipeline (a diagram) and the anatomy of one training step (measured).

The anatomy comes from warm-up steps sampled with a sync around each part (fastlab.step_parts), so each part's
time is its own even on a GPU; the syncs remove the overlap of a timed step: it shows what each part costs.
"""

from __future__ import annotations

import statistics
import textwrap

from matplotlib.patches import FancyBboxPatch

from .plots import ShownFigure, data_note
from .results import RunResult

# The parts of a step in order, one colour each.
PARTS = ("data wait", "copy", "forward", "backward", "optimiser", "loss read / sync", "other")
COLOURS = {"data wait": "tab:orange", "copy": "tab:brown", "data wait + copy": "tab:orange", "forward": "tab:blue",
           "backward": "tab:purple", "optimiser": "tab:green", "loss read / sync": "tab:red", "other": "tab:gray"}


def _copies(r: RunResult, n: int) -> list[float] | None:
    """Per sampled step, the host-to-device copy's seconds; None where the data wait includes the copy."""
    if len(r.copy_seconds) == n:  # one per sampled step
        return list(r.copy_seconds)
    if len(r.copy_seconds) < n + 1:
        return None
    return [r.copy_seconds[i + 1] for i in range(n)]  # a result from when every step's copy was kept


def step_anatomy(r: RunResult) -> dict[str, float]:
    """Median milliseconds of each part of a step over the run's sampled warm-up steps (steps 1 .. n).

    Each part is bracketed by syncs ("data wait + copy" where the copy was not timed apart); other: zero_grad, the
    scaler, the syncs; loss read / sync: the step's time after the sampled part."""
    n = len(r.forward_seconds)
    if not n or len(r.sampled_step_seconds) != n or len(r.step_seconds) < n + 1:
        raise ValueError(f"step_anatomy: run '{r.label}' has no sampled steps (it needs warmup_steps >= 2 and a "
                         f"fastlab that samples forward and backward)")
    copies = _copies(r, n)
    rows: dict[str, list[float]] = {}
    for i in range(n):
        wait = r.data_wait_seconds[i + 1]
        parts = {"data wait + copy": wait} if copies is None else {"data wait": wait, "copy": copies[i]}
        parts.update(forward=r.forward_seconds[i], backward=r.backward_seconds[i],
                     optimiser=r.optimizer_step_seconds[i])
        parts["other"] = max(r.sampled_step_seconds[i] - sum(parts.values()), 0.0)
        parts["loss read / sync"] = max(r.step_seconds[i + 1] - r.sampled_step_seconds[i], 0.0)
        for k, v in parts.items():
            rows.setdefault(k, []).append(1000 * v)
    order = [p for p in ("data wait + copy", *PARTS) if p in rows]
    return {p: statistics.median(rows[p]) for p in order}


def unsampled(r: RunResult) -> str | None:
    """Why a run that stopped before its sampled steps has no anatomy (it did not start: the notebook's budget was
    spent; it failed; it was a no-op), in its own words; None where it has one (or ran without sampling: a misuse
    step_anatomy names)."""
    if r.ok or r.forward_seconds:
        return None
    return f"no step anatomy: {r.warmup_words()}"


def describe_anatomy(results: list[RunResult]) -> str:
    """Each run's step anatomy as a line of milliseconds and shares (or why it has none: it did not run); for two
    runs that both have one, how far the parts their difference does not touch moved (drift_note)."""
    lines = []
    for r in results:
        if (why := unsampled(r)) is not None:
            lines.append(f"{r.label}: {why}")
            continue
        parts = step_anatomy(r)
        total = sum(parts.values())
        shares = ", ".join(f"{k} {v:.1f} ms ({v / total:.0%})" for k, v in parts.items())
        lines.append(f"{r.label}: {total:.1f} ms a sampled step = {shares}")
    drift = drift_note(*results) if len(results) == 2 and not any(map(unsampled, results)) else ""
    return "\n".join(lines + ([drift] if drift else []))


_DATA_KNOBS = ("loader", "num_workers", "pin_memory", "non_blocking", "persistent_workers", "prefetch_factor")
_OPTIMISER_KNOBS = ("optimizer", "opt_impl", "lr", "weight_decay", "momentum", "scheduler", "set_to_none")
# The parts of a step each knob acts on. A knob not named (model, batch, precision, layout, compile) may act on all.
KNOB_PARTS: dict[str, tuple[str, ...]] = {**dict.fromkeys(_DATA_KNOBS, ("data wait", "copy", "data wait + copy")),
                                          **dict.fromkeys(_OPTIMISER_KNOBS, ("optimiser",)),
                                          "log_every": ("loss read / sync",), "log_loss": ("loss read / sync",)}
_NOT_KNOBS = ("seed", "max_seconds", "profile", "steps", "windows", "eval_images")  # the same computation per step
_CATCH_ALL = ("other", "loss read / sync")  # the step's remainders: any change can move them


def untouched_parts(a: RunResult, b: RunResult) -> list[str]:
    """The parts of a step that no knob differing between the two runs acts on (KNOB_PARTS); none where a
    differing knob may act on every part."""
    touched: set[str] = set()
    for knob in (k for k in {**a.config, **b.config} if a.config.get(k) != b.config.get(k) and k not in _NOT_KNOBS):
        if knob not in KNOB_PARTS:
            return []
        touched.update(KNOB_PARTS[knob])
    return [p for p in PARTS if p not in touched and p not in _CATCH_ALL]


def drift_note(a: RunResult, b: RunResult) -> str:
    """How far the parts of a step the change between `a` and `b` does not touch moved between the two sampled
    runs: a difference of that size in any part is the machine drifting, not the change. "" where none is untouched."""
    pa, pb = step_anatomy(a), step_anatomy(b)
    moved = [(p, pa[p], pb[p]) for p in untouched_parts(a, b) if p in pa and p in pb and pa[p] > 0]
    if not moved:
        return ""
    worst = max(abs(y / x - 1) for _, x, y in moved)
    parts = ", ".join(f"{p} {x:.1f} -> {y:.1f} ms ({y / x - 1:+.0%})" for p, x, y in moved)
    return (f"Parts the change does not touch moved by up to {worst:.0%} between the two samples ({parts}): "
            f"differences of that size here are drift, not the change.")


def plot_step_anatomy(results: list[RunResult], title: str = "anatomy of a step"):
    """One horizontal bar per run, split into the measured parts of a step; a run that did not run has no bar, only
    the words saying why."""
    fig = ShownFigure(figsize=(10, 1.2 + 0.8 * len(results)), layout="constrained")
    ax = fig.subplots()
    seen: set[str] = set()
    for row, r in enumerate(results):
        left = 0.0
        if (why := unsampled(r)) is not None:
            ax.text(0, row, textwrap.shorten(why, 110), va="center", fontsize=8)
            continue
        parts = step_anatomy(r)
        total = sum(parts.values())
        for name, ms in parts.items():
            ax.barh(row, ms, left=left, color=COLOURS[name], edgecolor="white",
                    label=name if name not in seen else None)
            seen.add(name)
            if ms / total > 0.08:  # a label only where it fits
                ax.text(left + ms / 2, row, f"{ms / total:.0%}", ha="center", va="center", fontsize=8, color="white")
            left += ms
    ax.set_yticks(range(len(results)), [textwrap.fill(r.label, 30) for r in results], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("milliseconds per step (median over the sampled warm-up steps; each part bracketed by syncs)")
    if seen:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the bars, never over them
    ax.set_title(f"{title} - {data_note(results)}", fontsize=10)
    return fig


# ---------------------------------------------------------------- the data pipeline, drawn

# (stage, where it runs, what it does), left to right.
PIPELINE = (
    ("Dataset", "in each worker\n(or the main process)", "__getitem__(i): read, decode,\naugment one image"),
    ("worker processes", "num_workers of them", "each builds whole batches;\nprefetch_factor batches ahead"),
    ("collate", "in the worker", "stacks the images\ninto one batch tensor"),
    ("pin-memory thread", "a thread of the main process\n(pin_memory=True)", "copies the batch into\npage-locked host memory"),
    ("copy to the device", "x.to(device,\nnon_blocking=True)", "async only from pinned\nmemory; else it blocks"),
    ("the step", "main process\n(launches the GPU's work)", "forward, backward,\noptimiser step"),
)


def plot_data_pipeline(device_type: str = "cuda"):
    """The DataLoader pipeline as boxes: which stage runs in which process or thread; off CUDA the pin-memory
    and copy stages are greyed (they do nothing)."""
    fig = ShownFigure(figsize=(12, 2.9), layout="constrained")
    ax = fig.subplots()
    ax.set_xlim(0, len(PIPELINE))
    ax.set_ylim(0, 1)
    ax.axis("off")
    idle = device_type != "cuda"
    for i, (name, where, what) in enumerate(PIPELINE):
        skipped = idle and i in (3, 4)
        face = "whitesmoke" if skipped else ("lightyellow" if i < 3 else ("lightcyan" if i < 5 else "honeydew"))
        ax.add_patch(FancyBboxPatch((i + 0.06, 0.18), 0.82, 0.64, boxstyle="round,pad=0.02", facecolor=face,
                                    edgecolor="gray" if skipped else "black"))
        ax.text(i + 0.47, 0.70, name, ha="center", va="center", fontsize=9, weight="bold",
                color="gray" if skipped else "black")
        ax.text(i + 0.47, 0.55, where, ha="center", va="center", fontsize=7, style="italic")
        ax.text(i + 0.47, 0.33, what + ("\n(nothing to do on a CPU)" if skipped else ""), ha="center",
                va="center", fontsize=7)
        if i:
            ax.annotate("", xy=(i + 0.06, 0.5), xytext=(i - 0.12, 0.5), arrowprops=dict(arrowstyle="->", lw=1.2))
    ax.text(1.5, 0.06, "worker processes (parallel, on the CPU's cores)", ha="center", fontsize=8, color="olive")
    ax.text(4.0, 0.06, "host to device", ha="center", fontsize=8, color="teal")
    ax.set_title("the data pipeline of a DataLoader" + (f" (training on {device_type}: no copy to a GPU)"
                                                         if idle else ""), fontsize=10)
    return fig
