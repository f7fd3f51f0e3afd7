"""fastlab.watch: your own training loop, measured the way fastlab.run measures its own.

    w = fastlab.watch(label="my loop")
    for x, y in w(loader):                      # 1st touch: times the wait for each batch
        with w.step(len(x)):                    # 2nd touch (or call w.step_done(len(x)) after the step)
            ...forward, backward, optimiser step...
    result = w.result()                         # a RunResult: plots, save_results and fastlab.advise apply
    print(fastlab.advise(result).text())

What is measured, and where:
- step time: wall time from the end of one step to the end of the next: waiting for the batch, the step, and
  whatever the loop does in between. Data wait: time inside the loader (iter() at an epoch's start, and each
  next()). Compute is the rest.
- throughput: the first `warmup_steps` steps (compile, autotuning, allocator growth) are not timed; after them
  the device is synchronised every `window_steps` steps and only there (a sync per step would change what is
  measured): a window's images / its wall time. Median with min and max over the windows, as fastlab.run does.
- memory after every step (CUDA: allocated tensor memory, which needs no sync; CPU: the process's resident set)
  and the peak. A steady rise over the steps is read by fastlab.advise as a probable leak (C11).
- GPU utilisation through NVML where it works (fastlab.measure.GpuUtilSampler).
- sync_debug=True (CUDA only): torch.cuda.set_sync_debug_mode("warn") after the warm-up; each host-device sync
  torch reports is counted by the line of your code that caused it (the warnings are counted, not printed).
- loss (optional, step(n, loss=loss)): kept as a detached tensor every `log_every` steps and read once at the
  end, so watching adds no sync; a non-finite one marks the run diverged.
- profile_steps=N: torch.profiler around N steps right after the warm-up (one more step for the profiler's own
  warm-up); those steps are not timed. It adds an idle-time breakdown and a trace file (Perfetto, chrome://tracing).

A callback-style trainer (Lightning, Hugging Face's Trainer) fetches batches itself: call w.describe(loader) once,
w.batch_ready() when a batch arrives (on_train_batch_start) and w.step_done(n) when its step ends; the time from
the previous step's end to batch_ready() counts as data wait.
"""

from __future__ import annotations

import contextlib
import math
import re
import statistics
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from .measure import GpuUtilSampler, MemoryMeter, environment, resolve_device, synchronize
from .profiling import safe_name
from .results import RunResult

DATA_RANGE = "fastlab.watch: waiting for data"  # the profiler range around each batch fetch
SYNC_WARNING = re.compile(r"synchronizing CUDA operation")  # what set_sync_debug_mode("warn") says
SOURCE = "your loop (fastlab.watch)"


def _positive_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"fastlab.watch: {name}={value!r} is not allowed: an integer >= {minimum}")
    return value


# ---------------------------------------------------------------- what the loader is


def loader_facts(loader: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config entries, dataset entries) read from the loader: DataLoader arguments where it is one."""
    dataset = getattr(loader, "dataset", loader)
    data: dict[str, Any] = {"name": type(dataset).__name__, "synthetic": bool(getattr(dataset, "synthetic", False)),
                            "source": SOURCE}
    with contextlib.suppress(TypeError):
        data["train_images"] = len(dataset)
    if not isinstance(loader, torch.utils.data.DataLoader):
        return {"loader": "iterable"}, data
    workers = loader.num_workers
    return {"loader": "dataloader", "num_workers": workers, "pin_memory": loader.pin_memory,
            "persistent_workers": loader.persistent_workers,
            "prefetch_factor": loader.prefetch_factor if workers else None}, data


# ---------------------------------------------------------------- syncs caught by torch


class SyncCounter:
    """Counts the host-device syncs torch.cuda.set_sync_debug_mode("warn") reports, by file:line."""

    def __init__(self) -> None:
        self.where: Counter[str] = Counter()
        self._saved_mode = 0
        self._warnings: warnings.catch_warnings | None = None

    def start(self) -> None:
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        warnings.filterwarnings("always", message=".*" + SYNC_WARNING.pattern)  # each one, not once per line
        show = warnings.showwarning

        def count(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001 (warnings' signature)
            if SYNC_WARNING.search(str(message)):
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

    def stop(self) -> None:
        torch.cuda.set_sync_debug_mode(self._saved_mode)
        if self._warnings is not None:
            self._warnings.__exit__(None, None, None)
            self._warnings = None

    def summary(self, steps: int) -> dict[str, Any]:
        total = sum(self.where.values())
        return {"count": total, "steps": steps, "per_step": total / steps if steps else float("nan"),
                "where": [[w, n] for w, n in self.where.most_common(5)]}


# ---------------------------------------------------------------- the profiler window


def _merge(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for start, end in sorted(spans):
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


def _length(spans: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in spans)


def idle_breakdown(events: Any, cuda: bool) -> dict[str, Any]:
    """Split the profiled steps' span (profiler clock) into busy, idle while the host waited for data, and idle
    otherwise (the host busy with Python, launches, syncs). Busy: GPU kernels and copies on CUDA; on a CPU, the
    operators run outside the data fetches (the CPU is the device there)."""
    steps = [(e.time_range.start, e.time_range.end) for e in events if e.name.startswith("ProfilerStep")]
    if not steps:
        return {}
    lo, hi = min(s for s, _ in steps), max(e for _, e in steps)
    span = [(lo, hi)]
    data = _subtract(_merge((e.time_range.start, e.time_range.end) for e in events if e.name == DATA_RANGE),
                     _subtract(_merge([(float("-inf"), float("inf"))]), span))
    if cuda:
        busy_kind = "GPU kernels and copies"
        busy = [(e.time_range.start, e.time_range.end) for e in events
                if getattr(e.device_type, "name", "") == "CUDA"]
    else:
        busy_kind = "CPU operators outside the data fetches"
        busy = [(e.time_range.start, e.time_range.end) for e in events
                if not e.name.startswith("ProfilerStep") and e.name != DATA_RANGE]
    busy_spans = _subtract(_merge(busy), _subtract([(float("-inf"), float("inf"))], span))
    if not cuda:
        busy_spans = _subtract(busy_spans, data)
    ms = 1000.0  # profiler times are in microseconds
    total, busy_ms = (hi - lo) / ms, _length(busy_spans) / ms
    data_idle = _length(_subtract(data, busy_spans)) / ms
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


# ---------------------------------------------------------------- the watch


class Watch:
    """Measures a loop you wrote. Make it with fastlab.watch(...); see this module's docstring."""

    def __init__(self, label: str = "your loop", *, device: str | torch.device = "auto", warmup_steps: int = 3,
                 window_steps: int = 10, log_every: int = 10, sync_debug: bool = False, profile_steps: int = 0,
                 trace_dir: str | Path | None = None, config: dict[str, Any] | None = None) -> None:
        self.label = label
        self.device = resolve_device(device) if isinstance(device, str) else torch.device(device)
        self.warmup_steps = _positive_int("warmup_steps", warmup_steps, 0)
        self.window_steps = _positive_int("window_steps", window_steps, 1)
        self.log_every = _positive_int("log_every", log_every, 1)
        self.profile_steps = _positive_int("profile_steps", profile_steps, 0)
        self.untimed = self.warmup_steps + (self.profile_steps + 1 if self.profile_steps else 0)
        self.sync_debug = bool(sync_debug)
        self.trace_dir = trace_dir
        self.known = dict(config or {})  # what the reader tells about the loop (e.g. {"amp": "bf16"})
        self.res = RunResult(config={}, label=label)
        self._loader: dict[str, Any] = {}
        self._started = False
        self._finished = False
        self._steps = 0
        self._wait = 0.0
        self._t_start = self._t_last = self._window_start = 0.0
        self._window_images = self._window_count = 0
        self._windows: list[list[float]] = []  # [images, seconds] of each closed window
        self._batch_sizes: list[int] = []
        self._losses: list[tuple[int, Any]] = []
        self._meter: MemoryMeter | None = None
        self._util: GpuUtilSampler | None = None
        self._syncs: SyncCounter | None = None
        self._prof: Any = None

    # ------------------------------------------------------------ the two touches

    def __call__(self, loader: Iterable) -> Iterator:
        """Iterate `loader` as usual; the time spent getting each batch is recorded as data wait."""
        self.describe(loader)
        return self._batches(loader)

    def describe(self, loader: Iterable) -> None:
        """Record what the loader is (DataLoader arguments, dataset name and size) without wrapping it: for a
        trainer that iterates its loader itself (a callback's on_train_start: trainer.train_dataloader)."""
        self._check_open()
        config, data = loader_facts(loader)
        self._loader.update(config)
        self.res.dataset = data

    def _batches(self, loader: Iterable) -> Iterator:
        self._start()
        t = time.perf_counter()
        with self._data_range():
            it = iter(loader)  # an epoch's start (DataLoader workers starting) is data wait too
        self._wait += time.perf_counter() - t
        while True:
            t = time.perf_counter()
            try:
                with self._data_range():
                    batch = next(it)
            except StopIteration:
                return
            self._wait += time.perf_counter() - t
            yield batch

    def batch_ready(self) -> None:
        """For trainers that fetch batches themselves: the time since the last step ended was spent waiting."""
        self._check_open()
        self._start()
        self._wait += time.perf_counter() - self._t_last

    @contextlib.contextmanager
    def step(self, batch_size: int, loss: Any = None) -> Iterator[None]:
        """Wrap one training step (forward, backward, optimiser); batch_size: the images it trained on."""
        try:
            yield
        except BaseException as e:
            self._failed(e)
            raise
        self.step_done(batch_size, loss)

    def step_done(self, batch_size: int, loss: Any = None) -> None:
        """Call after each step instead of `with w.step(n)`. loss: optionally the step's loss (read at the end)."""
        self._check_open()
        self._start()
        self._steps += 1
        k = self._steps
        if loss is not None and k % self.log_every == 0:
            self._losses.append((k - 1, loss.detach() if isinstance(loss, torch.Tensor) else float(loss)))
        timed = k > self.untimed
        boundary = k == self.warmup_steps or k == self.untimed or (
            timed and (self._window_count + 1) % self.window_steps == 0)
        if boundary:
            self._sync()
        t = time.perf_counter()
        self.res.step_seconds.append(t - self._t_last)
        self.res.data_wait_seconds.append(self._wait)
        self.res.memory_trace_mb.append(self._meter.sample())
        self._batch_sizes.append(int(batch_size))
        self._wait, self._t_last = 0.0, t
        if timed:
            self._window_images += int(batch_size)
            self._window_count += 1
            if boundary:
                self._close_window(t)
        if self._prof is not None:
            self._prof.step()
        if k == self.warmup_steps:
            self.res.warmup_seconds = t - self._t_start
            self._after_warmup()
        if k == self.untimed:
            self._stop_profiler()
            self._t_last = self._window_start = time.perf_counter()  # the analysis is not the loop's time

    # ------------------------------------------------------------ phases

    def _start(self) -> None:
        if self._started:
            return
        self._started = True
        self._meter = MemoryMeter(self.device)
        self.res.memory_kind = self._meter.kind
        self._util = GpuUtilSampler(self.device)
        self._util.__enter__()
        if self.sync_debug and self.device.type != "cuda":
            self.res.no_ops["sync_debug"] = ("host-device syncs exist only between a CUDA GPU and its host; this "
                                             f"loop ran on {self.device.type}: nothing to catch")
        self._t_start = self._t_last = self._window_start = time.perf_counter()
        if self.untimed == 0:
            self._after_warmup()

    def _after_warmup(self) -> None:
        if self.sync_debug and self.device.type == "cuda":
            self._syncs = SyncCounter()
            self._syncs.start()
        if self.profile_steps:
            self._start_profiler()

    def _sync(self) -> None:
        with self._syncs.paused() if self._syncs is not None else contextlib.nullcontext():
            synchronize(self.device)

    def _close_window(self, t: float) -> None:
        self._windows.append([self._window_images, t - self._window_start])
        self._window_start, self._window_images, self._window_count = t, 0, 0

    def _data_range(self) -> contextlib.AbstractContextManager:
        if self._prof is None:
            return contextlib.nullcontext()
        return torch.profiler.record_function(DATA_RANGE)

    def _start_profiler(self) -> None:
        from torch.profiler import ProfilerActivity, profile, schedule

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        # one step for the profiler's own warm-up, then profile_steps recorded steps
        self._prof = profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=self.profile_steps,
                                                                      repeat=1))
        self._prof.start()

    def _stop_profiler(self) -> None:
        if self._prof is None:
            return
        prof, self._prof = self._prof, None
        prof.stop()
        folder = Path(self.trace_dir) if self.trace_dir is not None else Path(tempfile.mkdtemp(prefix="fastlab-watch-"))
        folder.mkdir(parents=True, exist_ok=True)
        trace = folder / f"{safe_name(self.label)}.pt.trace.json"
        prof.export_chrome_trace(str(trace))
        breakdown = idle_breakdown(prof.events(), self.device.type == "cuda")
        self.res.extras.setdefault("watch", {})["profile"] = {**breakdown, "trace": str(trace)}

    def _failed(self, error: BaseException) -> None:
        if isinstance(error, KeyboardInterrupt):
            self.res.status = "interrupted"
        else:
            first_line = (str(error).splitlines() or [""])[0]
            self.res.status, self.res.error = "failed", f"{type(error).__name__}: {first_line}"

    def _check_open(self) -> None:
        if self._finished:
            raise RuntimeError("this fastlab.watch has finished (result() was called): start a new fastlab.watch "
                               "for another loop")

    # ------------------------------------------------------------ the result

    def result(self) -> RunResult:
        """Finish (one sync, the sampler and the sync counting stopped) and return what was measured."""
        if self._finished:
            return self.res
        self._finished = True
        if not self._started:
            self._start()
        self._sync()
        self._stop_profiler()
        res = self.res
        if self._window_count:
            self._close_partial_window()
        res.window_throughput = [images / seconds for images, seconds in self._windows]
        res.timed_seconds = sum(seconds for _, seconds in self._windows)
        if self._util is not None:
            self._util.__exit__(None, None, None)
            res.gpu_util = self._util.samples
            if self._util.unavailable and self.device.type == "cuda":
                res.no_ops["gpu_util"] = self._util.unavailable
        watch_extras = res.extras.setdefault("watch", {})
        if self._syncs is not None:
            self._syncs.stop()
            watch_extras["syncs"] = self._syncs.summary(max(0, self._steps - self.warmup_steps))
        res.peak_memory_mb = self._meter.peak()
        res.steps_done = self._steps
        timed = self._batch_sizes[self.untimed:] or self._batch_sizes
        res.images_per_step = int(statistics.median_low(timed)) if timed else 0
        res.env = environment(self.device, "custom")
        res.config = {**self.known, "watched": True, "device": self.device.type,
                      "warmup_steps": min(self.untimed, self._steps), "batch_size": res.images_per_step,
                      "grad_accum_steps": 1, "window_steps": self.window_steps, "log_every": self.log_every,
                      "profile_steps": self.profile_steps, "sync_debug": self.sync_debug, **self._loader}
        res.dataset = res.dataset or {"name": "data not described (w.describe(loader))", "synthetic": False,
                                      "source": SOURCE}
        res.extras["watched"] = True
        watch_extras["images"] = sum(self._batch_sizes)
        self._read_losses()
        return res

    def _close_partial_window(self) -> None:
        """The steps after the last full window. On a CPU the end of the last step is exact: they make a window of
        their own if at least half a window, else join the window before. On a GPU their queued work ended at
        some point before result()'s sync, which may come long after the loop: they stay untimed."""
        if self.device.type != "cpu":
            self.res.extras.setdefault("watch", {})["untimed_tail_steps"] = self._window_count
        elif self._window_count * 2 >= self.window_steps or not self._windows:
            self._close_window(self._t_last)
        else:
            self._windows[-1][0] += self._window_images
            self._windows[-1][1] += self._t_last - self._window_start
        self._window_count = self._window_images = 0

    def _read_losses(self) -> None:
        """The kept losses, read once (one sync); the first non-finite one marks the run diverged."""
        if not self._losses:
            return
        tensors = [v.float().mean() for _, v in self._losses if isinstance(v, torch.Tensor)]
        read = iter(torch.stack(tensors).tolist() if tensors else [])
        values = [next(read) if isinstance(v, torch.Tensor) else v for _, v in self._losses]
        res = self.res
        res.losses = [(step, value) for (step, _), value in zip(self._losses, values)]
        for step, value in res.losses:
            if not math.isfinite(value):
                if res.status == "ok":
                    res.status, res.diverged_step = "diverged", step
                    res.error = f"the training loss became {value} at step {step} (read every {self.log_every} steps)"
                break
            res.last_finite_loss = value


def watch(label: str = "your loop", **options: Any) -> Watch:
    """Watch a training loop you wrote. Options: device, warmup_steps, window_steps, log_every, sync_debug,
    profile_steps, trace_dir, config (what you know about the loop, e.g. {"amp": "bf16", "lr": 1e-3})."""
    return Watch(label, **options)
