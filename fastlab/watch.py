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
import math
import operator
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from . import budget
from .clocks import DivergenceWatch, KeptLosses, StepClock
from .config import positive_int
from .loop_instruments import MemoryLog, StepProfiler, SyncCounter
from .loop_record import LoopRecord
from .measure import GpuUtilSampler, Spread, resolve_device, synchronize
from .results import RunResult
from .run_limits import OwnLoop, RunLimits, waiting_for
from .step_parts import StepParts
from .verdicts import Comparison, runs_verdict, turns, verdict

# the timed steps after the untimed ones whose memory is sampled at every step (fastlab.loop_instruments.MemoryLog)
MEMORY_DENSE_STEPS = 16


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
    """What w(loader) returns: the time to get each batch is the watch's data wait (wall and process CPU time, so
    torch's intra-op threads count too); the time between epochs is left out of the steps. Every other attribute is
    the loader's own."""

    def __init__(self, watch: Watch, loader: Iterable) -> None:
        self._watch, self.loader = watch, loader

    def __iter__(self) -> Iterator:
        w = self._watch
        w._start()
        if w._epoch_end is not None:  # evaluation, checkpoints, logging between epochs: not a step's time
            w.clock.exclude(time.perf_counter() - w._epoch_end)
            w._epoch_end = None
        it = self._fetch(iter, self.loader)  # an epoch's start (DataLoader workers starting) is data wait too
        w.record.epochs.append(0)
        try:
            while not w.limits.must_stop(w.res):
                w._parts.fetch_started()
                try:
                    batch = self._fetch(next, it)
                except StopIteration:
                    return
                w._parts.fetch_ended()
                w.record.fetched(batch)
                yield batch
        finally:  # the loader ran out, or the loop left it (break, an error): the epoch ends here
            if not w._finished:  # (an iterator closed after result() has nothing left to book)
                w._sync()  # the last step's queued work belongs to the epoch, not to the time between epochs
                w._epoch_end = time.perf_counter()
                w.record.epoch_ended(self.loader, it)

    def _fetch(self, get: Callable[[Any], Any], source: Any) -> Any:
        w = self._watch
        t, cpu = time.perf_counter(), time.process_time()
        profiled = w._prof.fetching() if w._prof is not None else contextlib.nullcontext()
        # the first batch's making, for an exercise's check
        with waiting_for(w.limits.waiting, paused=False), profiled, w.record.fetching(get, w.record_facts):
            got = get(source)
        wall = time.perf_counter() - t
        w._wait += wall
        w.record.fetch_wall += wall
        w.record.fetch_cpu += time.process_time() - cpu
        return got

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]  # a loader without len() says so itself

    def __getattr__(self, name: str) -> Any:
        if name == "loader":  # not set yet (copying, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)


@dataclass(slots=True)
class Pause:
    """What `with w.paused() as p:` hands the block: set `p.accuracy = ...` for a held-out accuracy."""

    accuracy: float | None = None


class Watch:
    """Measures a loop you wrote (see this module's docstring). config: what you know about the loop, e.g.
    {"amp": "bf16", "lr": 1e-3}; limits: fastlab.run's harness's own (fastlab.run_limits), never a reader's (whose
    loop is an OwnLoop)."""

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
        self.limits = limits if limits is not None else OwnLoop()
        self.res = self.limits.result if self.limits.result is not None else RunResult({}, label=label)
        self.record = LoopRecord()  # the loader, epochs, batches and misuse: what a reader's result describes
        self._finished = False
        self._thread: int | None = None  # the thread of the first touch (started): one watch, one loop, one thread
        self._steps = 0
        self._wait = 0.0
        self.clock = StepClock()
        self._last_step: Step | None = None
        self._inside: str | None = None  # "step" or "pause": in a `with w.step(...)` or `with w.paused()` block
        self.limits.start(self.warmup_steps)
        self.divergence = DivergenceWatch(self.res, self.limits.agree)
        self.losses = KeptLosses(self.log_every, self.divergence)
        self._parts = StepParts(self.device, self.limits.sample_parts and self.warmup_steps >= 2)
        self.memory: MemoryLog | None = None  # started with the loop
        self._util: GpuUtilSampler | None = None
        self._syncs: SyncCounter | None = None
        self._prof: Any = None
        self._epoch_end: float | None = None  # when the last epoch's batches ran out
        self.record_facts = bool(facts)  # what the first step did (fastlab.loop_facts), for an exercise's check

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
        self.limits.describe_data(self.res, self.record.describe_loader(loader))

    @contextlib.contextmanager
    def paused(self) -> Iterator[Pause]:
        """Time inside is not the loop's; set `p.accuracy` in `with w.paused() as p:` to record a held-out accuracy."""
        self.limits.check_pause(self.res)
        self._start()
        self._sync()
        self.memory.pause_started()
        p = Pause()
        t = time.perf_counter()
        self._inside = "pause"
        try:
            # a hung evaluation is bounded too; pauses counted
            with waiting_for(self.limits.waiting, paused=True), self.memory.sampling(), self.record.pausing():
                yield p
        finally:
            self._inside = None
            self._sync()
            seconds = time.perf_counter() - t
            peak = self.memory.pause_ended(self._steps)
            if p.accuracy is not None:
                self._evaluated(p.accuracy, seconds, t, peak)
            self.clock.exclude(seconds)

    def _evaluated(self, accuracy: float, seconds: float, t: float, peak_mb: float) -> None:
        """A held-out accuracy: the run's (the last one given), or under RunLimits a time-to-accuracy checkpoint."""
        training = self.clock.training_seconds(t)
        if self.limits.checkpoint(self.res, self._steps, accuracy, training):
            self.res.eval_accuracy, self.res.eval_seconds = float(accuracy), seconds
            self.res.eval_peak_memory_mb = peak_mb

    def batch_ready(self) -> None:
        """For trainers that fetch batches themselves: the time since the last step ended was spent waiting."""
        self._start()
        self.record.ready += 1
        self._wait += time.perf_counter() - self.clock.last

    @contextlib.contextmanager
    def step(self, batch_size: int, loss: Any = None) -> Iterator[Step]:
        """Wrap one training step; batch_size: the images it trained on. Set `s.loss = loss` inside the block (the
        loss does not exist yet when it starts)."""
        s = Step(_images(batch_size), loss)
        self._check_open()  # before the body: a finished watch does not run (and then refuse) a training step
        self._refuse_nested("with w.step(...)")
        self._last_step = s
        seen = self.record.step_facts(self._steps, self.device.type) if self.record_facts else contextlib.nullcontext()
        self._inside = "step"
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
            self._inside = None
        self.step_done(s.batch_size, s.loss)

    def _refuse_nested(self, call: str) -> None:
        """A step counted inside a `with w.step(...)` would be counted again when the block ends: the images/s
        doubled without a word; one inside a `with w.paused()` would be timed with none of its own time (a negative
        or inflated speed). Both refused in one line."""
        if self._inside == "pause":
            raise RuntimeError(f"fastlab.watch: {call} inside a `with w.paused()` block: paused time is left out of "
                               "the clock, so a training step there has no time of its own; pause only what is not "
                               "training (a held-out evaluation), outside the step")
        if self._inside == "step":
            raise RuntimeError(f"fastlab.watch: {call} inside a `with w.step(...)` block counts every step twice: "
                               "mark each step once, with either `with w.step(n)` or `w.step_done(n)`")

    def step_done(self, batch_size: int, loss: Any = None) -> None:
        """Call after each step instead of `with w.step(n)`. loss: optionally the step's loss (read at the end)."""
        self._refuse_nested("w.step_done(...)")
        n = self.record.images(_images(batch_size))
        self._start()
        self._steps += 1
        k = self._steps
        if self.record_facts and self._prof is None:  # whether a profiler's schedule records this step
            self.record.profiler_on.append(torch.autograd._profiler_enabled())
        if loss is not None:
            self.losses.keep(k, loss)
        timed = k > self.untimed
        own = k == self.untimed or (timed and (self.clock.window_steps + 1) % self.window_steps == 0)
        boundary = k == self.warmup_steps or self.limits.window_end(k, own)
        if self._parts.active:
            self._parts.end(self.res)
        if boundary:
            self._sync()
        t = time.perf_counter()
        self.res.step_seconds.append(self.clock.step(t, n, timed, boundary))
        self.res.data_wait_seconds.append(self._wait)
        self.memory.step(self.res, k, t, boundary)
        self._wait = 0.0
        if self._prof is not None:
            self._prof.step()
        if k == self.warmup_steps:
            self.res.warmup_seconds = t - self.clock.start
            self._after_warmup()
        if 2 <= k + 1 <= self.warmup_steps:
            self._parts.begin()  # the next step is sampled (where the harness asks: limits.sample_parts)
        self.limits.after_step(self.res, k, boundary, timed=k > self.warmup_steps,
                               training_seconds=self.clock.training_seconds(t), timed_seconds=self.clock.timed_seconds(t))
        if k == self.untimed:
            self._stop_profiler()
            self.clock.restart(time.perf_counter())  # the analysis is not the loop's time

    def _start(self) -> None:
        self._check_open()
        if self._thread is not None:
            if self._thread != threading.get_ident():
                raise RuntimeError("fastlab.watch: one watch measures one loop in one thread; this one was started "
                                   "in another thread: make a fastlab.watch per thread")
            return
        self._thread = threading.get_ident()
        self.memory = MemoryLog(self.device, self.untimed + MEMORY_DENSE_STEPS, every_step=self.limits.harness)
        self.res.memory_kind = self.memory.kind
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
        if self.clock.window_steps and not self.limits.harness:  # the harness's steps after its last window: untimed
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
        res.peak_memory_mb = self.memory.training_peak(self._steps)
        res.steps_done = self._steps
        if self.limits.harness:  # the harness's run: its config, environment and data description stay
            return self.limits.finish(res, self.clock.window_seconds(), self.losses)
        settings = {"warmup_steps": min(self.untimed, self._steps), "window_steps": self.window_steps,
                    "log_every": self.log_every, "profile_steps": self.profile_steps, "sync_debug": self.sync_debug}
        self.record.describe(res, self.device, self.known, settings, self.untimed)
        watch_extras.update(memory_steps=self.memory.steps, excluded_seconds=self.clock.excluded)
        self.losses.read(res)
        last = self._last_step
        self.record.check_use(res, self._steps, self.losses.given, last is not None and last.loss is not None)
        if self.record_facts:
            watch_extras["facts"] = self.record.facts_seen(res, self.device)
        self.record.remember(res)
        return res

watch = Watch  # fastlab.watch(label, ...): watch a training loop you wrote


@dataclass
class LoopComparison:
    """A watched "before" and "after" of your loop, run in turns: their training images/s judged by
    fastlab.verdicts (`speed`), and, where a side has no speed to credit, what its runs did instead (`not_compared`)."""

    before: list[RunResult]
    after: list[RunResult]
    speed: Comparison  # after against before; not_comparable, with its reason, where a side has no credited speed
    # why the speeds were not compared, in a word Comparison has not: "diverged" (the after side), "fixed" (the before
    # side diverged, the after side ran), "failed", or "not run" (the notebook's budget was spent); "" when compared
    not_compared: str = ""
    notes: list[str] = field(default_factory=list)
    technique: tuple[str, bool | None] | None = None  # an exercise's check: (technique, shown in the edited loop)

    @property
    def outcome(self) -> str:
        """In a word: the comparison's direction ("better", "worse", "noise"), or why there was none."""
        return self.not_compared or self.speed.direction

    @property
    def sentence(self) -> str:
        return self.speed.words

    def text(self) -> str:
        head = (f"{self.after[0].label.rsplit(' #', 1)[0]} against {self.before[0].label.rsplit(' #', 1)[0]}, "
                f"{len(self.before)} run(s) each, in turns: {self.outcome}")
        return "\n".join([head, f"  training images/s: {self.speed.words}", *(f"  {n}" for n in self.notes)])


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
            budget.say_refusal(label, refused)
            runs[name].append(RunResult({}, label=label, status="time_limited", error=refused,
                                        budget_cut=budget.NOT_STARTED))
            continue
        w = Watch(label, **options)
        fn(w)
        runs[name].append(w.result())
    return judge_loops(runs[labels[0]], runs[labels[1]])


def judge_loops(before: list[RunResult], after: list[RunResult]) -> LoopComparison:
    """The verdict on two sides' watched runs (measured or built): a run the budget did not start first, then
    fastlab.verdicts on their timed windows (runs_verdict: the runs it cannot credit), each run one repeat."""
    notes = [f"{r.label}: {n}" for r in before[:1] + after[:1] for n in r.extras.get("watch", {}).get("notes", [])]
    if (r := next((r for r in before + after if r.not_started), None)) is not None:
        nan = Spread.of([])
        return LoopComparison(before, after, Comparison("not_comparable", math.nan, nan, nan,
                                                        reason=f"{r.label} did not run ({r.error})"), "not run", notes)
    speed = runs_verdict(before, after)
    if speed.comparable:  # each run one repeat, a run alone too: a single pair cannot tell drift from an effect
        speed = verdict(*(Spread.of([x for r in runs for x in r.window_throughput], [r.window_throughput for r in runs])
                          for runs in (before, after)))
        if len(before) < 2:
            notes.append("one run each: a drift in the machine's load between them is not averaged out (repeats=3)")
        return LoopComparison(before, after, speed, "", notes)
    if any(r.ok and not r.window_throughput for r in before + after):
        notes.append("no timed window finished: more steps than warmup_steps + window_steps are needed")
    if speed.status != "diverged":
        state = "failed"
    elif speed.side == "other":
        state = "diverged"
    else:  # the after side, judged first, ran: over a diverged run no speed-up is claimed
        state = "fixed" if all(r.ok for r in after) else "failed"
    return LoopComparison(before, after, speed, state, notes)
