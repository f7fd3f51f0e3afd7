"""fastlab.watch: your own training loop, measured the way fastlab.run measures its own.

    w = fastlab.watch(label="my loop")
    for epoch in range(epochs):
        for x, y in w(loader):                  # 1st touch: times the wait for each batch (the loader's own
            with w.step(len(x)) as s:           #   attributes stay: w(loader).dataset); 2nd touch: the step
                ...forward, backward, optimiser step...
                s.loss = loss                   # the step's loss: a non-finite or blown-up loss marks divergence
        evaluate(model)                         # between epochs: not counted (or inside the loop: w.paused())
    result = w.result()                         # a RunResult: plots, save_results and fastlab.advise apply
    print(fastlab.advise(result).text())

    fastlab.compare_loops(before_fn, after_fn, repeats=3)  # each fn(w) runs the loop under the watch it is given

Measured: step time (leaving out the time between epochs and inside `with w.paused():`), data wait (with the
process's CPU time over it), throughput over windows of `window_steps` synchronised only at their ends after
`warmup_steps` untimed steps, memory and its peak, GPU utilisation, and the loss, kept as a tensor and read once
at the end (fastlab.clocks.DivergenceWatch judges it). sync_debug=True counts host-device syncs by line (CUDA);
profile_steps=N profiles N steps after the warm-up; facts=True records what the first step did (fastlab.loop_facts).
Misuse ends in an error, or a note in extras["watch"]["notes"] that fastlab.advise prints.

A callback-style trainer (Lightning, Hugging Face's Trainer) calls w.describe(loader) once, w.batch_ready() when a
batch arrives and w.step_done(n) when its step ends.
"""

from __future__ import annotations

import contextlib
import operator
import statistics
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from . import budget
from .clocks import DivergenceWatch, StepClock
from .config import positive_int
from .loop_facts import FirstStepFacts
from .loop_instruments import StepProfiler, SyncCounter
from .measure import GpuUtilSampler, MemoryMeter, Spread, environment, resolve_device, synchronize
from .results import RunResult
from .run_limits import RunLimits
from .step_parts import StepParts
from .verdicts import turns, verdict

SOURCE = "your loop (fastlab.watch)"
# Reading a CPU's resident set costs tens of microseconds: after MEMORY_DENSE_STEPS timed steps it is read at most
# once per MEMORY_EVERY_S.
MEMORY_EVERY_S = 0.02
MEMORY_DENSE_STEPS = 16
# what the last 20 finished watches ran with and measured, so advice never proposes a setting just left
_EARLIER: deque[dict[str, Any]] = deque(maxlen=20)


def loader_facts(loader: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config entries, dataset entries) read from the loader, looking through wrappers (tqdm keeps .iterable)."""
    for _ in range(3):
        inner = next((i for a in ("iterable", "loader") if (i := getattr(loader, a, None)) is not None), None)
        if isinstance(loader, torch.utils.data.DataLoader) or inner is None:
            break
        loader = inner
    dataset = getattr(loader, "dataset", loader)
    data: dict[str, Any] = {"name": type(dataset).__name__, "synthetic": bool(getattr(dataset, "synthetic", False)),
                            "source": SOURCE}
    with contextlib.suppress(TypeError):
        data["train_images"] = len(dataset)
    if not isinstance(loader, torch.utils.data.DataLoader):
        return {"loader": "iterable"}, data
    return {"loader": "dataloader", "num_workers": loader.num_workers, "pin_memory": loader.pin_memory,
            "persistent_workers": loader.persistent_workers,
            "prefetch_factor": loader.prefetch_factor if loader.num_workers else None}, data


@dataclass(slots=True)
class Step:
    """What `with w.step(n) as s:` hands the block: set `s.loss = loss` in it; it is read when the block ends."""

    batch_size: int
    loss: Any = None


def _images(batch_size: Any) -> int:
    """The step's image count, or one line saying what step() takes."""
    tensor = isinstance(batch_size, torch.Tensor)
    try:
        n = operator.index(None if tensor else batch_size)  # int, numpy integers; not floats or tensors
    except TypeError:
        got = (f"a tensor of shape {tuple(batch_size.shape)}: pass len(x) or x.shape[0]" if tensor else
               f"{type(batch_size).__name__} {batch_size!r}: pass len(x)")
        raise TypeError("fastlab.watch: step(batch_size=...) takes the number of images in the batch (an int), got "
                        + got) from None
    if isinstance(batch_size, bool) or n < 1:
        raise ValueError(f"fastlab.watch: step(batch_size={batch_size!r}) is not allowed: the number of images in "
                         "the batch, an integer >= 1")
    return n


def _tensors(batch: Any) -> list[torch.Tensor]:
    """The batch's tensors, one level deep: the batch itself, a tuple's or list's items, a dict's values."""
    if isinstance(batch, torch.Tensor):
        return [batch]
    items = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (tuple, list)) else ()
    return [t for t in items if isinstance(t, torch.Tensor)]


def _watch_device(device: Any) -> torch.device:
    """The device to watch, or one line naming fastlab.watch's own argument."""
    name = str(device)
    try:
        return resolve_device(name) if isinstance(device, str) else torch.device(device)
    except ValueError as e:
        raise ValueError(str(e).replace(f"TrainConfig.device={name!r}", f"fastlab.watch(device={name!r})")) from None
    except (RuntimeError, TypeError):
        raise ValueError(f"fastlab.watch(device={device!r}) is not allowed: choose 'auto', 'cpu', 'cuda', 'cuda:N' "
                         "or 'mps' (or a torch.device)") from None


class WatchedLoader:
    """What w(loader) returns: its batches' wait is timed; every other attribute is the loader's own."""

    def __init__(self, watch: Watch, loader: Iterable) -> None:
        self._watch, self.loader = watch, loader

    def __iter__(self) -> Iterator:
        return self._watch._batches(self.loader)

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]  # a loader without len() says so itself

    def __getattr__(self, name: str) -> Any:
        if name == "loader":  # not set yet (copying, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)


@contextlib.contextmanager
def _sampling(meter: MemoryMeter, every_s: float = 0.002) -> Iterator[None]:
    """The resident set sampled from a thread while the block runs (CUDA's allocator keeps a peak of its own)."""
    if meter.kind != "process_rss":
        yield
        return
    done = threading.Event()

    def sample_until_done() -> None:
        while not done.wait(every_s):
            meter.sample()

    thread = threading.Thread(target=sample_until_done, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


@dataclass(slots=True)
class Pause:
    """What `with w.paused() as p:` hands the block: set `p.accuracy = ...` for a held-out accuracy."""

    accuracy: float | None = None


class Watch:
    """Measures a loop you wrote (see this module's docstring). config: what you know about the loop, e.g.
    {"amp": "bf16", "lr": 1e-3}; limits: fastlab.run's harness's own (fastlab.run_limits), never a reader's."""

    def __init__(self, label: str = "your loop", *, device: str | torch.device = "auto", warmup_steps: int = 3,
                 window_steps: int = 10, log_every: int = 10, sync_debug: bool = False, profile_steps: int = 0,
                 trace_dir: str | Path | None = None, config: dict[str, Any] | None = None, facts: bool = False,
                 limits: RunLimits | None = None) -> None:
        self.label = label
        self.device = _watch_device(device)
        self.warmup_steps = positive_int("fastlab.watch: warmup_steps", warmup_steps, 0)
        self.window_steps = positive_int("fastlab.watch: window_steps", window_steps)
        self.log_every = positive_int("fastlab.watch: log_every", log_every)
        self.profile_steps = positive_int("fastlab.watch: profile_steps", profile_steps, 0)
        self.untimed = self.warmup_steps + (self.profile_steps + 1 if self.profile_steps else 0)
        self.sync_debug = bool(sync_debug)
        self.trace_dir = trace_dir
        self.known = dict(config or {})  # what the reader tells about the loop (e.g. {"amp": "bf16"})
        self.res = limits.result if limits is not None and limits.result is not None else RunResult({}, label=label)
        self._loader: dict[str, Any] = {}
        self._finished = False
        self._thread: int | None = None  # the thread of the first touch (started): one watch, one loop, one thread
        self._steps = 0
        self._wait = 0.0
        self.clock = StepClock()
        self._batch_sizes: list[int] = []
        self._losses: list[tuple[int, Any]] = []  # (step, loss) every log_every steps
        self._last_loss: tuple[int, Any] | None = None  # the last step's: read at the end too
        self._last_step: Step | None = None
        self._in_step = False  # inside a `with w.step(...)`: a second one there would count each step twice
        self.limits = limits
        self._ends = limits.ends(self.warmup_steps) if limits else set()
        self._total = self.warmup_steps + limits.steps if limits else 0
        self.divergence = DivergenceWatch(self.res, limits.agree if limits else None)
        self._parts = StepParts(self.device, bool(limits and limits.sample_parts and self.warmup_steps >= 2))
        self._train_peak = 0.0  # the training peak before each evaluation (its own peak is kept apart)
        self._meter: MemoryMeter | None = None
        self._memory_steps: list[int] = []  # the step (0-based) of each memory sample
        self._t_memory = 0.0
        self._util: GpuUtilSampler | None = None
        self._syncs: SyncCounter | None = None
        self._prof: Any = None
        self._ready = 0  # batch_ready() calls
        self._epochs: list[int] = []  # batches fetched in each epoch of w(loader)
        self._epoch_end: float | None = None  # when the last epoch's batches ran out
        self._fetch_wall = self._fetch_cpu = 0.0  # wall and process CPU seconds inside the loader
        self._last_batch: Any = None
        self._batch_bytes = 0
        self._notes: dict[str, str] = {}  # misuse seen, one line each (shown by fastlab.advise)
        self.record_facts = bool(facts)  # what the first step did (fastlab.loop_facts), for an exercise's check
        self._facts: dict[str, Any] = {}
        self._profiled = False  # a step ran under torch.profiler (recorded with the facts)
        self._paused_blocks = 0
        self._steps_before_pause = -1  # steps done when the last w.paused() ended

    def __call__(self, loader: Iterable) -> WatchedLoader:
        """Iterate `loader` as usual (each epoch); the time spent getting each batch is recorded as data wait."""
        if isinstance(loader, WatchedLoader):
            if loader._watch is self:
                return loader  # wrapped once outside train(), wrapped again inside it: the same thing
            raise ValueError("fastlab.watch: this loader is already watched by another fastlab.watch: wrap the "
                             "loader itself (w(loader.loader))")
        self.describe(loader)
        return WatchedLoader(self, loader)

    def describe(self, loader: Iterable) -> None:
        """Record what the loader is without wrapping it: for a trainer that iterates its loader itself."""
        self._check_open()
        config, data = loader_facts(loader)
        self._loader.update(config)
        if self.limits is None:  # fastlab.run describes its data itself
            self.res.dataset = data

    def _batches(self, loader: Iterable) -> Iterator:
        self._start()
        if self._epoch_end is not None:  # evaluation, checkpoints, logging between epochs: not a step's time
            self.clock.exclude(time.perf_counter() - self._epoch_end)
            self._epoch_end = None
        it = self._fetch(iter, loader)  # an epoch's start (DataLoader workers starting) is data wait too
        self._epochs.append(0)
        try:
            while not (self.limits is not None and self.limits.must_stop(self.res)):
                self._parts.fetch_started()
                try:
                    batch = self._fetch(next, it)
                except StopIteration:
                    return
                self._parts.fetch_ended()
                self._epochs[-1] += 1
                self._last_batch = batch
                if not self._batch_bytes:
                    self._batch_bytes = sum(t.element_size() * t.nelement() for t in _tensors(batch))
                yield batch
        finally:  # the loader ran out, or the loop left it (break, an error): the epoch ends here
            self._epoch_ended(loader, it)

    def _fetch(self, get: Callable[[Any], Any], source: Any) -> Any:
        """get(source), booked as data wait: wall and process CPU time (so torch's intra-op threads count too)."""
        t, cpu = time.perf_counter(), time.process_time()
        waiting = self.limits.waiting if self.limits is not None else None
        if waiting is not None:
            waiting.value = time.monotonic()
        try:
            with self._prof.fetching() if self._prof is not None else contextlib.nullcontext():
                got = get(source)
        finally:
            if waiting is not None:
                waiting.value = 0.0
        wall = time.perf_counter() - t
        self._wait += wall
        self._fetch_wall += wall
        self._fetch_cpu += time.process_time() - cpu
        return got

    def _epoch_ended(self, loader: Iterable, it: Iterator) -> None:
        if self._finished:
            return  # an iterator left unfinished and closed after result(): nothing left to book
        self._sync()  # the last step's queued work belongs to the epoch, not to the time between epochs
        self._epoch_end = time.perf_counter()
        if self._epochs[-1] == 0 and len(self._epochs) > 1 and it is loader and "empty_epoch" not in self._notes:
            note = (f"epoch {len(self._epochs)} got no batches: the loader is an iterator (a generator?) that an "
                    "earlier epoch used up; pass a DataLoader or a list, or make a new generator each epoch")
            warnings.warn("fastlab.watch: " + note, UserWarning, stacklevel=3)
            self._notes["empty_epoch"] = note

    @contextlib.contextmanager
    def paused(self) -> Iterator[Pause]:
        """Time inside is not the loop's; set `p.accuracy` in `with w.paused() as p:` to record a held-out accuracy."""
        if self.limits is not None:
            self.limits.check_pause(self.res)
        self._start()
        self._sync()
        self._paused_blocks += 1
        self._train_peak = max(self._train_peak, self._meter.peak())
        self._meter.reset()
        p = Pause()
        t = time.perf_counter()
        waiting = self.limits.waiting if self.limits is not None else None
        if waiting is not None:  # a hung evaluation is bounded as a hung loader is (negative: paused, not fetching)
            waiting.value = -time.monotonic()
        try:
            with _sampling(self._meter):
                yield p
        finally:
            if waiting is not None:
                waiting.value = 0.0
            self._sync()
            seconds = time.perf_counter() - t
            self._meter.sample()
            if p.accuracy is not None:
                self._evaluated(p.accuracy, seconds, t)
            self._meter.reset()
            self._steps_before_pause = self._steps
            self.clock.exclude(seconds)

    def _evaluated(self, accuracy: float, seconds: float, t: float) -> None:
        """A held-out accuracy: the run's (the last one given), or under RunLimits a time-to-accuracy checkpoint."""
        training = self.clock.training_seconds(t)
        if self.limits is None or self.limits.checkpoint(self.res, self._steps, accuracy, training):
            self.res.eval_accuracy, self.res.eval_seconds = float(accuracy), seconds
            self.res.eval_peak_memory_mb = self._meter.peak()

    def batch_ready(self) -> None:
        """For trainers that fetch batches themselves: the time since the last step ended was spent waiting."""
        self._start()
        self._ready += 1
        self._wait += time.perf_counter() - self.clock.last

    @contextlib.contextmanager
    def step(self, batch_size: int, loss: Any = None) -> Iterator[Step]:
        """Wrap one training step; batch_size: the images it trained on. Set `s.loss = loss` inside the block (the
        loss does not exist yet when it starts)."""
        s = Step(_images(batch_size), loss)
        self._check_open()  # before the body: a finished watch does not run (and then refuse) a training step
        self._refuse_nested("with w.step(...)")
        self._last_step = s
        seen: contextlib.AbstractContextManager = contextlib.nullcontext()
        if self.record_facts and not self._steps:
            seen = FirstStepFacts(self.device.type)
            self._facts = seen.facts  # filled in as the step runs
        self._in_step = True
        try:
            with seen:
                yield s
        except KeyboardInterrupt:
            self.res.status = "interrupted"
            raise
        except BaseException as e:
            first_line = (str(e).splitlines() or [""])[0]
            self.res.status, self.res.error = "failed", f"{type(e).__name__}: {first_line}"
            raise
        finally:
            self._in_step = False
        self.step_done(s.batch_size, s.loss)

    def _refuse_nested(self, call: str) -> None:
        """A step counted inside a `with w.step(...)` would be counted again when the block ends: the images/s
        doubled without a word. Refused in one line."""
        if self._in_step:
            raise RuntimeError(f"fastlab.watch: {call} inside a `with w.step(...)` block counts every step twice: "
                               "mark each step once, with either `with w.step(n)` or `w.step_done(n)`")

    def step_done(self, batch_size: int, loss: Any = None) -> None:
        """Call after each step instead of `with w.step(n)`. loss: optionally the step's loss (read at the end)."""
        self._refuse_nested("w.step_done(...)")
        n = self._counted(_images(batch_size))
        self._start()
        self._steps += 1
        k = self._steps
        if self.record_facts and not self._profiled and self._prof is None:
            self._profiled = torch.autograd._profiler_enabled()  # a profiler's schedule records later steps
        if loss is not None:  # kept, not read: reading a tensor here would be a host-device sync every step
            self._last_loss = (k - 1, loss.detach() if isinstance(loss, torch.Tensor) else float(loss))
            self.divergence.first_loss(self._last_loss[1])
            if k % self.log_every == 0:
                self._losses.append(self._last_loss)
        timed = k > self.untimed
        if self.limits is not None:
            boundary = k == self.warmup_steps or k in self._ends
        else:
            boundary = k == self.warmup_steps or k == self.untimed or (
                timed and (self.clock.window_steps + 1) % self.window_steps == 0)
        if self._parts.active:
            self._parts.end(self.res)
        if boundary:
            self._sync()
        t = time.perf_counter()
        self.res.step_seconds.append(self.clock.step(t, n, timed, boundary))
        self.res.data_wait_seconds.append(self._wait)
        if self._memory_due(k, t, boundary):
            self.res.memory_trace_mb.append(self._meter.sample())
            self._memory_steps.append(k - 1)
            self._t_memory = t
        self._batch_sizes.append(n)
        self._wait = 0.0
        if self._prof is not None:
            self._prof.step()
        if k == self.warmup_steps:
            self.res.warmup_seconds = t - self.clock.start
            self._after_warmup()
        if self.limits is not None:
            if 2 <= k + 1 <= self.warmup_steps:
                self._parts.begin()  # the next step is sampled
            self.limits.after_step(self.res, k, self._total, boundary, timed=k > self.warmup_steps,
                                   training_seconds=self.clock.training_seconds(t),
                                   timed_seconds=self.clock.timed_seconds(t))
        if k == self.untimed:
            self._stop_profiler()
            self.clock.restart(time.perf_counter())  # the analysis is not the loop's time

    def _counted(self, n: int) -> int:
        """The images of this step: n, unless n is the key count of the dict batch just fetched (len(batch))."""
        batch = self._last_batch
        if isinstance(batch, Mapping) and n == len(batch):
            first = next(iter(_tensors(batch)), None)
            rows = int(first.shape[0]) if first is not None and first.dim() else n
            if rows != n:
                key = next(k for k, v in batch.items() if v is first)
                self._notes["dict_batch"] = (f"step({n}) was given len(batch) of a dict batch ({n} keys); counted "
                                             f"{rows} images a step, the first dimension of batch[{key!r}]: pass "
                                             f"len(batch[{key!r}])")
                return rows
        return n

    def _memory_due(self, k: int, t: float, boundary: bool) -> bool:
        """Sample memory this step? Always where it is cheap, in the first steps and under RunLimits (fastlab.run's
        results keep one sample per step); else once per MEMORY_EVERY_S."""
        return (self._meter.kind != "process_rss" or self.limits is not None or boundary
                or k <= self.untimed + MEMORY_DENSE_STEPS or t - self._t_memory >= MEMORY_EVERY_S)

    def _start(self) -> None:
        self._check_open()
        if self._thread is not None:
            if self._thread != threading.get_ident():
                raise RuntimeError("fastlab.watch: one watch measures one loop in one thread; this one was started "
                                   "in another thread: make a fastlab.watch per thread")
            return
        self._thread = threading.get_ident()
        self._meter = MemoryMeter(self.device)
        self.res.memory_kind = self._meter.kind
        self._util = GpuUtilSampler(self.device)
        self._util.__enter__()
        if self.sync_debug and self.device.type != "cuda":
            self.res.no_ops["sync_debug"] = ("host-device syncs exist only between a CUDA GPU and its host; this "
                                             f"loop ran on {self.device.type}: nothing to catch")
        self.clock.begin(time.perf_counter())
        if self.untimed == 0:
            self._after_warmup()

    def _after_warmup(self) -> None:
        if self.sync_debug and self.device.type == "cuda":
            self._syncs = SyncCounter()
            self._syncs.start()
        if self.profile_steps:
            self._prof = StepProfiler(self.device, self.profile_steps)

    def _sync(self) -> None:
        with self._syncs.paused() if self._syncs is not None else contextlib.nullcontext():
            synchronize(self.device)

    def _stop_profiler(self) -> None:
        if self._prof is not None:
            prof, self._prof = self._prof, None
            self.res.extras.setdefault("watch", {})["profile"] = prof.stop(self.trace_dir, self.label)

    def _check_open(self) -> None:
        if self._finished:
            raise RuntimeError("this fastlab.watch has finished (result() was called): start a new fastlab.watch "
                               "for another loop")

    def result(self) -> RunResult:
        """Finish (one sync, the sampler and the sync counting stopped) and return what was measured."""
        if self._finished:
            return self.res
        self._start()  # raises outside the loop's own thread
        self._finished = True
        self._sync()
        self._stop_profiler()
        res = self.res
        if self.clock.window_steps and self.limits is None:  # under RunLimits, steps after the last window: untimed
            if untimed := self.clock.close_tail(self.device.type == "cpu", self.window_steps):
                res.extras.setdefault("watch", {})["untimed_tail_steps"] = untimed
        res.window_throughput = self.clock.throughput()
        res.timed_seconds = sum(self.clock.window_seconds())
        self._util.__exit__(None, None, None)
        res.gpu_util = self._util.samples
        if self._util.unavailable and self.device.type == "cuda":
            res.no_ops["gpu_util"] = self._util.unavailable
        watch_extras = res.extras.setdefault("watch", {})
        if self._syncs is not None:
            watch_extras["syncs"] = self._syncs.stop(max(0, self._steps - self.warmup_steps))
        trained_since_pause = self._steps > self._steps_before_pause  # not only evaluation since the last reset
        res.peak_memory_mb = max(self._train_peak, self._meter.peak() if trained_since_pause else 0.0)
        res.steps_done = self._steps
        if self.limits is not None:  # the harness's run: its config, environment and data description stay
            res.window_seconds = self.clock.window_seconds()
            self.divergence.agree = None  # no all-reduce here: it would hang if another rank failed
            self._read_losses()
            res.extras.pop("watch", None)
            return res
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
        watch_extras.update(images=sum(self._batch_sizes), memory_steps=self._memory_steps,
                            epochs=self._epochs, excluded_seconds=self.clock.excluded, batch_bytes=self._batch_bytes,
                            data_cpu_share=self._fetch_cpu / self._fetch_wall if self._fetch_wall else None)
        self._read_losses()
        self._check_use()
        watch_extras["notes"] = list(self._notes.values())
        if self.record_facts:
            watch_extras["facts"] = {**self._facts, **self._loader, "device": self.device.type,
                                     "images_per_step": res.images_per_step, "profiled": self._profiled,
                                     "paused_blocks": self._paused_blocks}
        # a loop of the reader's: remembered (this process only) for the advice on the next one
        watch_extras["earlier"] = [e for e in _EARLIER if e["dataset"] == res.dataset.get("name")]
        kept = ("loader", "num_workers", "batch_size", "persistent_workers")
        _EARLIER.append({"label": res.label, "dataset": res.dataset.get("name"), "status": res.status,
                         "window_throughput": list(res.window_throughput), **{k: res.config.get(k) for k in kept}})
        return res

    def _check_use(self) -> None:
        """Misuse only the end can see: no step marked, no batches, the loader not wrapped, no loss given."""
        res, fetched = self.res, sum(self._epochs)
        if self._steps == 0 and res.status == "ok":
            res.status = "failed"
            if self._epochs and not fetched:
                res.error = (f"the loader gave no batches in {len(self._epochs)} epoch(s) (empty, or drop_last with "
                             "fewer images than one batch): nothing was measured")
            else:
                got = (f"the loader gave {fetched} batches through the watch" if fetched else
                       "no batch came through the watch either")
                res.error = (f"no step was marked ({got}): put each step in `with w.step(len(x)) as s:` or call "
                             "w.step_done(len(x)) after it")
        elif self._steps and not (fetched or self._ready):
            res.data_wait_seconds = [float("nan")] * len(res.data_wait_seconds)
            self._notes["loader_not_wrapped"] = ("data wait not measured: the loader was not wrapped; iterate "
                                                 "`for x, y in w(loader)` (or call w.batch_ready() when a batch "
                                                 "arrives)")
        if self._steps and self._last_loss is None:
            late = self._last_step is not None and self._last_step.loss is not None
            self._notes["no_loss"] = "no loss given: divergence not checked; " + (
                "s.loss was set after its `with w.step(...) as s:` block ended: set it inside the block" if late else
                "set s.loss = loss inside `with w.step(...) as s:` (or step_done(n, loss=loss))")

    def _read_losses(self) -> None:
        """The kept losses and the last step's, read once (one sync), judged by the rule fastlab.run uses."""
        if self._last_loss is None:
            return
        last_logged = bool(self._losses) and self._losses[-1][0] == self._last_loss[0]
        kept = self._losses + ([] if last_logged else [self._last_loss])
        tensors = [v.float().mean() for _, v in kept if isinstance(v, torch.Tensor)]
        read = iter(torch.stack(tensors).tolist() if tensors else [])
        self.res.losses = [(step, next(read) if isinstance(v, torch.Tensor) else v) for step, v in kept]
        for step, value in self.res.losses:
            if self.divergence.loss(step, value):
                break


watch = Watch  # fastlab.watch(label, ...): watch a training loop you wrote


@dataclass
class LoopComparison:
    """A watched "before" and "after" of your loop, run in turns; the verdict comes from fastlab.measure."""

    before: list[RunResult]
    after: list[RunResult]
    before_speed: Spread
    after_speed: Spread
    # "faster", "slower", "no measurable difference", "diverged", "fixed" (before diverged), "failed" or "not run"
    # (the notebook's budget was spent)
    outcome: str
    sentence: str
    notes: list[str] = field(default_factory=list)
    technique: tuple[str, bool | None] | None = None  # an exercise's check: (technique, shown in the edited loop)

    @property
    def ratio(self) -> float:
        return verdict(self.before_speed, self.after_speed).ratio

    def text(self) -> str:
        head = (f"{self.after[0].label.rsplit(' #', 1)[0]} against {self.before[0].label.rsplit(' #', 1)[0]}, "
                f"{len(self.before)} run(s) each, in turns: {self.outcome}")
        return "\n".join([head, f"  training images/s: {self.sentence}", *(f"  {n}" for n in self.notes)])


LoopFn = Callable[[Watch], Any]


def compare_loops(before: LoopFn, after: LoopFn, repeats: int = 3, *, labels: tuple[str, str] = ("before", "after"),
                  **options: Any) -> LoopComparison:
    """Run your loop's two versions in turns, each under a new watch it is given (`def before(w): ...`), and
    compare their speed with fastlab.verdicts' noise rule. options: as for fastlab.watch. Inside a part held to the
    notebook's budget (fastlab.budget), a turn is not started once the budget is spent: no comparison, said so."""
    positive_int("compare_loops: repeats", repeats)
    for name, fn in zip(labels, (before, after)):
        if not callable(fn):
            raise TypeError(f"compare_loops: {name} must be a function that takes a watch and runs the loop "
                            f"under it, got {type(fn).__name__}")
    runs: dict[str, list[RunResult]] = {labels[0]: [], labels[1]: []}
    for i, side in turns(2, repeats):  # a drift in the machine's load falls on both sides alike
        name, fn = labels[side], (before, after)[side]
        label = f"{name} #{i + 1}" if repeats > 1 else name
        if (refused := budget.refusal(label)) is not None:
            if said := budget.say_refusal(label, refused):
                print(said, flush=True)
            runs[name].append(RunResult({}, label=label, status="time_limited", error=refused,
                                        extras={"budget": "not started"}))
            continue
        w = Watch(label, **options)
        fn(w)
        runs[name].append(w.result())
    return judge_loops(runs[labels[0]], runs[labels[1]])


def judge_loops(before: list[RunResult], after: list[RunResult]) -> LoopComparison:
    """The verdict on two sides' watched runs (measured or built): diverged and empty runs first, then speed."""
    nan = Spread.of([])
    if (d := next((r for r in after if r.status == "diverged"), None)) is not None:
        return LoopComparison(before, after, nan, nan, "diverged",
                              f"{d.label} diverged ({d.error}): its speed is not credited")
    if (d := next((r for r in before if r.status == "diverged"), None)) is not None:
        fine = all(r.ok for r in after)
        return LoopComparison(before, after, nan, Spread.of([x for r in after for x in r.window_throughput]),
                              "fixed" if fine else "failed",
                              f"{d.label} diverged ({d.error}); " + ("no run of the other side diverged: no speed-up "
                                                                     "over a diverged run is claimed" if fine else
                                                                     "the other side did not finish either"))
    if (r := next((r for r in before + after if r.extras.get("budget") == "not started"), None)) is not None:
        return LoopComparison(before, after, nan, nan, "not run", f"{r.label} did not run ({r.error}): no comparison")
    if (r := next((r for r in before + after if not r.ok or not r.window_throughput), None)) is not None:
        reason = r.error or ("no timed window finished: more steps than warmup_steps + window_steps are needed"
                             if r.ok else r.status)
        return LoopComparison(before, after, nan, nan, "failed", f"{r.label}: {r.status} ({reason}); no comparison")
    # each run's own windows too: the noise rule pairs the repeats, which ran back to back
    b = Spread.of([x for r in before for x in r.window_throughput], [r.window_throughput for r in before])
    a = Spread.of([x for r in after for x in r.window_throughput], [r.window_throughput for r in after])
    c = verdict(b, a)
    outcome = {"noise": "no measurable difference", "better": "faster", "worse": "slower"}.get(c.direction, "failed")
    notes = [f"{r.label}: {n}" for r in before[:1] + after[:1] for n in r.extras.get("watch", {}).get("notes", [])]
    if len(before) < 2:
        notes.append("one run each: a drift in the machine's load between them is not averaged out (repeats=3)")
    return LoopComparison(before, after, b, a, outcome, c.words, notes)
