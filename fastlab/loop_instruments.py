"""The watch's instruments besides its clock: memory over the steps and each paused block (MemoryLog), and the
optional ones: torch.profiler over a few steps after the warm-up (StepProfiler, with the trace's idle breakdown),
and CUDA host-device syncs counted by line (SyncCounter)."""

from __future__ import annotations

import contextlib
import re
import tempfile
import threading
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from .measure import MemoryMeter
from .results import RunResult

DATA_RANGE = "fastlab.watch: waiting for data"  # the profiler range around each batch fetch
SYNC_WARNING = "synchronizing CUDA operation"  # what set_sync_debug_mode("warn") says
# Reading a CPU's resident set costs tens of microseconds: after the dense steps it is read at most once per
# MEMORY_EVERY_S.
MEMORY_EVERY_S = 0.02


class MemoryLog:
    """The loop's memory: a sample at a step's end (every step where it is cheap, up to `dense_until` and at window
    ends, or with every_step: fastlab.run's results keep one a step; else once per MEMORY_EVERY_S), the training
    peak kept apart from each paused block's own (sampled from a thread while the block runs, on a CPU)."""

    def __init__(self, device: torch.device, dense_until: int, every_step: bool) -> None:
        self._meter = MemoryMeter(device)
        self.kind = self._meter.kind
        self.dense_until, self.every_step = dense_until, every_step
        self.steps: list[int] = []  # the step (0-based) of each sample
        self._t = 0.0  # when the last sample was taken
        self._train_peak = 0.0  # the training peak before each paused block
        self._steps_before_pause = -1  # steps done when the last paused block ended

    def step(self, res: RunResult, k: int, t: float, boundary: bool) -> None:
        """After step k, ended at t: a sample into res.memory_trace_mb where one is due."""
        if (self.kind != "process_rss" or self.every_step or boundary or k <= self.dense_until
                or t - self._t >= MEMORY_EVERY_S):
            res.memory_trace_mb.append(self._meter.sample())
            self.steps.append(k - 1)
            self._t = t

    def pause_started(self) -> None:
        self._train_peak = max(self._train_peak, self._meter.peak())
        self._meter.reset()

    @contextlib.contextmanager
    def sampling(self, every_s: float = 0.002) -> Iterator[None]:
        """The resident set sampled from a thread while the block runs (CUDA's allocator keeps a peak of its own)."""
        if self.kind != "process_rss":
            yield
            return
        done = threading.Event()

        def sample_until_done() -> None:
            while not done.wait(every_s):
                self._meter.sample()

        thread = threading.Thread(target=sample_until_done, daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()

    def pause_ended(self, steps: int) -> float:
        """The paused block's own peak (MiB); the meter starts again for the training after it."""
        self._meter.sample()
        peak = self._meter.peak()
        self._meter.reset()
        self._steps_before_pause = steps
        return peak

    def training_peak(self, steps: int) -> float:
        """The peak over the training steps: before each paused block, and since the last if a step ran since."""
        return max(self._train_peak, self._meter.peak() if steps > self._steps_before_pause else 0.0)


class StepProfiler:
    """torch.profiler over `steps` steps: one for the profiler's own warm-up, then `steps` recorded; stopped, it
    writes the Chrome trace and returns the idle breakdown (idle_breakdown) with the trace's path."""

    def __init__(self, device: torch.device, steps: int) -> None:
        self.device = device
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        self._prof = profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=steps, repeat=1))
        self._prof.start()

    def fetching(self) -> contextlib.AbstractContextManager:
        """Around a batch fetch: the range the breakdown reads as waiting for data."""
        return torch.profiler.record_function(DATA_RANGE)

    def step(self) -> None:
        self._prof.step()

    def stop(self, trace_dir: str | Path | None, label: str) -> dict[str, Any]:
        self._prof.stop()
        folder = Path(trace_dir) if trace_dir is not None else Path(tempfile.mkdtemp(prefix="fastlab-watch-"))
        folder.mkdir(parents=True, exist_ok=True)
        trace = folder / f"{safe_name(label)}.pt.trace.json"
        self._prof.export_chrome_trace(str(trace))
        return {**idle_breakdown(self._prof.events(), self.device.type == "cuda"), "trace": str(trace)}


def safe_name(label: str) -> str:
    """A label as a plain file name (a trace file's)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", label).strip("_") or "run"


class SyncCounter:
    """Counts the host-device syncs torch.cuda.set_sync_debug_mode("warn") reports, by file:line."""

    def __init__(self) -> None:
        self.where: Counter[str] = Counter()
        self._warnings = warnings.catch_warnings()

    def start(self) -> None:
        self._warnings.__enter__()
        warnings.filterwarnings("always", message=".*" + SYNC_WARNING)  # each one, not once per line
        show = warnings.showwarning

        def count(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001 (warnings' signature)
            if SYNC_WARNING in str(message):
                self.where[f"{filename}:{lineno}"] += 1
            else:
                show(message, category, filename, lineno, file, line)

        warnings.showwarning = count
        self._saved_mode = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("warn")

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """watch's own window-end syncs are not the loop's: switch the reporting off around them."""
        torch.cuda.set_sync_debug_mode(0)
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode("warn")

    def stop(self, steps: int) -> dict[str, Any]:
        """Stop counting; the summary over `steps` steps."""
        torch.cuda.set_sync_debug_mode(self._saved_mode)
        self._warnings.__exit__(None, None, None)
        total = sum(self.where.values())
        return {"count": total, "steps": steps, "per_step": total / steps if steps else float("nan"),
                "where": [[w, n] for w, n in self.where.most_common(5)]}


def event_spans(events: Iterable[Any], lo: float, hi: float) -> list[tuple[float, float]]:
    """The events' time ranges clipped to [lo, hi], merged where they overlap."""
    out: list[tuple[float, float]] = []
    for start, end in sorted((max(e.time_range.start, lo), min(e.time_range.end, hi)) for e in events):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        elif end > start:
            out.append((start, end))
    return out


def _subtract(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Merged spans a minus merged spans b."""
    out = []
    for start, end in a:
        for b_start, b_end in b:
            if b_end <= start or b_start >= end:
                continue
            if b_start > start:
                out.append((start, b_start))
            start = max(start, b_end)
        if end > start:
            out.append((start, end))
    return out


def spans_length(spans: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in spans)


def idle_breakdown(events: Any, cuda: bool) -> dict[str, Any]:
    """Split the profiled steps' span into busy (GPU kernels and copies; on a CPU, operators outside the data
    fetches), idle while the host waited for data, and idle otherwise (Python, launches, syncs)."""
    steps = [e for e in events if e.name.startswith("ProfilerStep")]
    if not steps:
        return {}
    lo, hi = min(e.time_range.start for e in steps), max(e.time_range.end for e in steps)
    data = event_spans([e for e in events if e.name == DATA_RANGE], lo, hi)
    if cuda:
        busy_kind = "GPU kernels and copies"
        busy = event_spans([e for e in events if getattr(e.device_type, "name", "") == "CUDA"], lo, hi)
    else:
        busy_kind = "CPU operators outside the data fetches"
        busy = _subtract(event_spans([e for e in events if not e.name.startswith("ProfilerStep") and e.name != DATA_RANGE],
                                lo, hi), data)
    ms = 1000.0  # profiler times are in microseconds
    total, busy_ms = (hi - lo) / ms, spans_length(busy) / ms
    data_idle = spans_length(_subtract(data, busy)) / ms
    return {"steps": len(steps), "span_ms": total, "busy": busy_kind, "busy_ms": busy_ms,
            "idle_waiting_for_data_ms": data_idle, "idle_waiting_on_host_ms": max(0.0, total - busy_ms - data_idle)}


def profile_text(result: RunResult) -> str:
    """The profiler window's breakdown in words (empty when the run had none)."""
    p = result.extras.get("watch", {}).get("profile") or {}
    if not p.get("span_ms"):
        return ""
    share = {k: p[k] / p["span_ms"] for k in ("busy_ms", "idle_waiting_for_data_ms", "idle_waiting_on_host_ms")}
    device = "GPU" if p["busy"].startswith("GPU") else "CPU"
    return (f"{result.label}: {p['steps']} profiled steps, {p['span_ms']:.1f} ms (profiler on): {device} busy "
            f"{share['busy_ms']:.0%} ({p['busy']}), idle while the host waited for data "
            f"{share['idle_waiting_for_data_ms']:.0%}, idle waiting on the host otherwise (Python, launches, syncs) "
            f"{share['idle_waiting_on_host_ms']:.0%}\n  trace: {p.get('trace', '?')}")
