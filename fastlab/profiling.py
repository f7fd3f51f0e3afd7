"""torch.profiler around a few steps of the fastlab training loop, boiled down to a small result.

The profiled run is fastlab's own training run, the profiler stepped after each step. What comes back: the top
operators, the Chrome trace (open it in https://ui.perfetto.dev) and the per-step split into data wait and compute.
Profiling slows every step, so only a profiled run's shares are compared, never its throughput.
"""

from __future__ import annotations

import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from . import isolation
from .config import TrainConfig, positive_int
from .harness import TrainingRun
from .loop_instruments import event_spans, safe_name, spans_length
from .measure import resolve_device
from .results import RunResult

# torch.profiler labels each DataLoader fetch with a range named like this.
DATALOADER_RANGE = "enumerate(DataLoader)"


@dataclass
class OpRow:
    """One operator of the profile, totals over the profiled steps (milliseconds)."""

    name: str
    calls: int
    self_cpu_ms: float  # host time in this op itself, children excluded
    cpu_total_ms: float  # host time including the ops it called
    self_device_ms: float  # GPU kernel time of this op (0 on a CPU-only run)


@dataclass
class ProfileResult:
    label: str
    run: RunResult  # the profiled run (its timings include the profiler's overhead)
    top_ops: list[OpRow]
    sort_key: str  # "self_device_ms" on a GPU, else "self_cpu_ms"
    trace_path: Path
    profiled_steps: list[int] = field(default_factory=list)  # 0-based step indices the profile covers
    profile_step_ms: list[float] = field(default_factory=list)  # each profiled step's span in the trace
    dataloader_ms: list[float] = field(default_factory=list)  # DataLoader fetch time inside each profiled step

    def table(self, n: int = 10) -> str:
        """The top-n operators by self time, as fixed-width text."""
        positive_int("n", n)
        total = sum(getattr(r, self.sort_key) for r in self.top_ops) or float("nan")
        head = "self GPU" if self.sort_key == "self_device_ms" else "self CPU"
        lines = [f"{'operator':<58} {'calls':>6} {head + ' ms':>12} {'share':>6} {'CPU total ms':>13}"]
        for r in self.top_ops[:n]:
            value = getattr(r, self.sort_key)
            lines.append(f"{r.name[:58]:<58} {r.calls:>6} {value:>12.1f} {value / total:>6.1%} {r.cpu_total_ms:>13.1f}")
        return "\n".join(lines)

    def data_vs_compute_ms(self) -> tuple[list[float], list[float]]:
        """Per profiled step, from the harness: (ms waiting for the batch, ms for everything else)."""
        data = [1000 * self.run.data_wait_seconds[i] for i in self.profiled_steps]
        compute = [1000 * self.run.step_seconds[i] - d for i, d in zip(self.profiled_steps, data)]
        return data, compute

    def data_share(self) -> float:
        """Share of the profiled steps' time spent waiting for data (harness clock)."""
        data, compute = self.data_vs_compute_ms()
        total = sum(data) + sum(compute)
        return sum(data) / total if total else float("nan")

    def summary(self) -> str:
        data, compute = self.data_vs_compute_ms()
        median = statistics.median(d + c for d, c in zip(data, compute))
        lines = [f"{self.label}: {len(self.profiled_steps)} profiled steps; median step {median:.1f} ms "
                 f"(profiler overhead included), waiting for data {self.data_share():.0%} of it"]
        if any(self.dataloader_ms):
            share = sum(self.dataloader_ms) / sum(self.profile_step_ms)
            lines.append(f"  the trace agrees: '{DATALOADER_RANGE}...' ranges take {share:.0%} of the profiled "
                         "steps' span")
        elif self.run.config.get("loader") == "device":
            lines.append("  the device loader has no DataLoader range: its batches appear as tensor ops "
                         "(indexing, padding, flips) at the start of each step")
        lines.append(f"  trace: {self.trace_path}")
        return "\n".join(lines)


def _rows(key_averages, cuda: bool) -> list[OpRow]:
    rows = [OpRow(name=e.key, calls=int(e.count), self_cpu_ms=e.self_cpu_time_total / 1000,
                  cpu_total_ms=e.cpu_time_total / 1000,
                  self_device_ms=(getattr(e, "self_device_time_total", 0.0) or 0.0) / 1000 if cuda else 0.0)
            for e in key_averages if not e.key.startswith("ProfilerStep")]  # the step markers are not operators
    return sorted(rows, key=lambda r: r.self_device_ms if cuda else r.self_cpu_ms, reverse=True)


def _step_split(events) -> tuple[list[float], list[float]]:
    """Each ProfilerStep's span and the DataLoader fetch time inside it, in ms (from the trace's own clock)."""
    steps = sorted((e.time_range.start, e.time_range.end) for e in events if e.name.startswith("ProfilerStep"))
    fetches = [e for e in events if e.name.startswith(DATALOADER_RANGE)]
    return [(end - start) / 1000 for start, end in steps], [spans_length(event_spans(fetches, *s)) / 1000 for s in steps]


def profile_run(cfg: TrainConfig, *, label: str = "run", steps: int = 5, trace_dir: str | Path | None = None,
                record_shapes: bool = False, with_stack: bool = False, progress: bool = False) -> ProfileResult:
    """Run cfg with `steps` timed steps under torch.profiler (warm-up steps not recorded), in a fresh process
    with its profiler. trace_dir: where the Chrome trace goes (default: a new temporary folder)."""
    positive_int("steps", steps, why=" (steps to record)")
    folder = Path(trace_dir) if trace_dir is not None else Path(tempfile.mkdtemp(prefix="fastlab-profile-"))
    folder.mkdir(parents=True, exist_ok=True)
    trace = folder / f"{safe_name(label)}.pt.trace.json"
    return isolation.call(profile_here, cfg, label, steps, trace, record_shapes, with_stack)


def profile_here(cfg: TrainConfig, label: str, steps: int, trace: Path, record_shapes: bool = False,
                 with_stack: bool = False) -> ProfileResult:
    """profile_run's work, in the calling process: the run, the profiler stepped after each of its steps."""
    from torch.profiler import ProfilerActivity, profile, schedule

    cuda = resolve_device(cfg.device).type == "cuda"
    # One untimed step is needed for the profiler's own warm-up; the rest of the warm-up it skips.
    warm = max(cfg.warmup_steps, 1)
    cfg = cfg.replace(steps=steps, warmup_steps=warm, windows=min(cfg.windows, steps))
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    prof = profile(activities=activities, schedule=schedule(wait=warm - 1, warmup=1, active=steps, repeat=1),
                   record_shapes=record_shapes, with_stack=with_stack)
    with prof:
        result = TrainingRun(cfg, label, None, None, False, None, lambda done, total: prof.step()).execute()
    prof.export_chrome_trace(str(trace))
    spans, data = _step_split(prof.events())
    profiled = list(range(warm, min(warm + steps, len(result.step_seconds))))
    return ProfileResult(label=label, run=result, top_ops=_rows(prof.key_averages(), cuda),
                         sort_key="self_device_ms" if cuda else "self_cpu_ms", trace_path=trace,
                         profiled_steps=profiled, profile_step_ms=spans, dataloader_ms=data)


def plot_profile_steps(profiles: list[ProfileResult], title: str = ""):
    """Per profiled step, side by side per run: waiting for data (orange) under compute (blue), in ms."""
    from .plots import ShownFigure as Figure  # here: fastlab.plots imports matplotlib, needed only to plot

    fig = Figure(figsize=(max(5.0, 3.2 * len(profiles)), 3.8))
    axes = fig.subplots(1, len(profiles), squeeze=False, sharey=True)[0]
    for ax, p in zip(axes, profiles):
        data, compute = p.data_vs_compute_ms()
        x = range(1, len(data) + 1)
        ax.bar(x, data, color="tab:orange", label="waiting for data")
        ax.bar(x, compute, bottom=data, color="tab:blue", label="compute (rest of the step)")
        ax.set_xlabel("profiled step")
        ax.set_title(p.label, fontsize=9)
    axes[0].set_ylabel("ms per step (profiler on)")
    axes[0].legend(fontsize=8)
    names = {p.run.data_name for p in profiles}
    devices = {p.run.env.get("device_name", "?") for p in profiles}
    fig.suptitle(f"{title + ' - ' if title else ''}data wait vs compute per step - {' / '.join(sorted(names))} "
                 f"on {' / '.join(sorted(devices))}", fontsize=10)
    fig.tight_layout()
    return fig
