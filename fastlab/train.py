"""The one training loop. It honours every TrainConfig knob and measures as it goes.

What is inside the timer: everything a training step does (waiting for the batch, the
host-to-device copy, forward, backward, optimiser and scheduler step, loss logging). Evaluation
and warm-up are timed apart. Within a step, data wait is the wait for `next(batches)` alone; the
host-to-device copy (and channels_last conversion) is booked apart as copy time: without non_blocking the
copy ends in a stream sync, so it also waits for the previous step's GPU work, which is compute, not data.
On CUDA the clock is read only after a synchronise, at the end of warm-up and at the end of every timed
window, so queued GPU work is always counted.

    throughput of a window = images per step x steps in the window / window wall time
    images per step        = batch_size x grad_accum_steps

Every run starts from fresh state and executes the same way: in a fresh process (fastlab.isolation: cuDNN's
plan caches, forward and backward, CUDA-graph trees, OpenMP teams, the allocator and every global a run sets are
new by construction), one run at a time per caller. A run that cannot go to a child process (a model defined in a
notebook cell) runs in a fresh thread, with the allocator's cache emptied and torch.compile's caches reset, and
says so.
"""

from __future__ import annotations

import contextlib
import gc
import math
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from . import builders, isolation
from .builders import Data, ModelArg
from .config import TrainConfig, comparison_repeats
from .data import DeviceLoader, ImageSet, dataset_loader, forever
from .measure import GpuUtilSampler, MemoryMeter, environment, now, resolve_device, synchronize
from .models import build_model as build_named_model
from .preflight import preflight
from .results import RunResult, merge_repeats

StepCallback = Callable[[int, int], None]
DatasetArg = Data | None

# Below fp16's smallest subnormal a GradScaler scale means every recent step overflowed: the run has diverged.
MIN_GRAD_SCALE = 2.0**-24


class _Stopped(Exception):
    """Raised inside the loop when the caller's stop event is set."""


class _OverBudget(Exception):
    """Raised inside the loop when the run has used up config.max_seconds."""


class _Diverged(Exception):
    def __init__(self, step: int, what: str) -> None:
        super().__init__(what)
        self.step, self.what = step, what


class _Reached(Exception):
    """Raised at an evaluation checkpoint when held-out accuracy reached the target."""


# ------------------------------------------------------------------ one run at a time (the in-process path: a fresh thread)

_RUN_LOCK = threading.Lock()
_active_label: list[str] = []


def active_run() -> str | None:
    """The label of the run in progress in this process, or None when none is."""
    return _active_label[0] if _active_label else None


def run_in_fresh_thread(fn: Callable[..., Any], *args: Any, stop: threading.Event | None = None, **kwargs: Any) -> Any:
    """fn(*args, **kwargs) in a new thread; the caller waits. Ctrl-C while waiting sets `stop` (which fn must
    watch) and still waits for fn to return, so its partial result is kept. fn's exception is re-raised."""
    box: dict[str, Any] = {}
    done = threading.Event()

    def target() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as e:  # handed to the caller's thread below
            box["error"] = e
        finally:
            done.set()

    thread = threading.Thread(target=target, name="fastlab-run", daemon=True)
    thread.start()
    # An Event, not Thread.join: a KeyboardInterrupt inside join() can leave the thread marked finished early.
    while not done.is_set():
        try:
            done.wait(0.1)
        except KeyboardInterrupt:
            if stop is None:
                raise
            stop.set()
    thread.join()
    if "error" in box:
        raise box.pop("error")
    return box["value"]


@contextlib.contextmanager
def exclusive_run(label: str) -> Iterator[None]:
    """Serialise runs in this process: two runs at once would each time the other's contention."""
    while not _RUN_LOCK.acquire(timeout=0.1):  # a timeout keeps Ctrl-C working while waiting
        pass
    _active_label.append(label)
    try:
        yield
    finally:
        _active_label.clear()
        _RUN_LOCK.release()


# ------------------------------------------------------------------ the public harness


def run(config: TrainConfig, *, label: str = "run", model: ModelArg = None, dataset: DatasetArg = None,
        progress: bool = True, stop: threading.Event | None = None, on_step: StepCallback | None = None,
        comparison: str | None = None) -> RunResult:
    """Train with `config` and return what was measured.

    model: a module (or a function that builds one) to train instead of `config.model`.
    dataset: instead of `config.dataset`, an ImageSet (uint8 images: works with both loaders), or a pair
        (train, held_out) of map-style torch Datasets yielding (image tensor, int label) (loader="dataloader").
    comparison: the name of the comparison this run belongs to (matched against bundled reference results).
    stop: set it (from another thread) to end the run early; the result is marked interrupted.
    on_step: called as on_step(steps_done, total_steps) after each step (for progress widgets).
    Out-of-memory and KeyboardInterrupt end the run with a result marked failed / interrupted; a run whose
    timed steps (warm-up excluded) take over config.max_seconds ends marked time_limited; a run whose loss,
    gradient scale or parameters become non-finite ends marked diverged. Each keeps the steps it finished.
    """
    return _run(TrainingRun(config, label, model, dataset, progress, stop, on_step), comparison)


def _run(training: TrainingRun, comparison: str | None = None, cold_compile_caches: bool = False) -> RunResult:
    """One run, alone in this process's queue, in a fresh process (fastlab.isolation) or, where it cannot go to
    one, a fresh thread."""
    with exclusive_run(training.result.label):
        result = isolation.execute(training, cold_compile_caches)
    if comparison:
        result.extras["comparison"] = comparison
    return result


def compare(base: TrainConfig, *, progress: bool = True, comparison: str | None = None, repeats: int | None = None,
            **changes: Any) -> list[RunResult]:
    """Run `base` and `base` with `changes`, interleaved (see interleave); returns [baseline, changed]. When every
    change is a no-op on this device, the changed arm is not trained: its result (status "no_op") says why."""
    changed = base.replace(**changes)
    return interleave([("baseline", base), (describe_changes(changes), changed)], repeats=repeats, progress=progress,
                      comparison=comparison)


def _idle_arm(base: TrainConfig, arm: TrainConfig, label: str, comparison: str | None) -> RunResult | None:
    """The not-trained result of an arm that can teach nothing on this device (arm_plans.plan_arm), else None."""
    from .arm_plans import not_trained, plan_arm

    plan = plan_arm(base, arm)
    if plan.kind != "no-op":
        return None
    result = not_trained(arm, label, plan.reason)
    if comparison:
        result.extras["comparison"] = comparison
    return result


def sweep(knob: str, values: list[Any], base: TrainConfig, *, progress: bool = True,
          comparison: str | None = None, repeats: int | None = None) -> list[RunResult]:
    """One arm per value of `knob`, interleaved (see interleave); stops early, keeping what ran, if a run is
    interrupted. A value whose change from the first is a no-op on this device is not trained (see interleave)."""
    configs = [base.replace(**{knob: v}) for v in values]  # validate every value before running any
    return interleave([(f"{knob}={v}", cfg) for v, cfg in zip(values, configs)], repeats=repeats, progress=progress,
                      comparison=comparison)


def interleave(arms: list[tuple[str, TrainConfig]], *, repeats: int | None = None, progress: bool = True,
               comparison: str | None = None) -> list[RunResult]:
    """Each arm `repeats` times (default: the profile's comparison_repeats), in turn: A B, then B A, then A B...
    so that a machine that slows down mid-comparison slows every arm alike (the order alternates, so a steady
    drift does not favour the arm that runs first). Each run starts in a fresh process. Returns one result per
    arm, its repeats merged (results.merge_repeats): the noise rule then pairs the repeats (measure.is_noise).
    An interrupted run ends the comparison, keeping every arm that ran."""
    rounds = repeats if repeats is not None else comparison_repeats(arms[0][1])
    # an arm whose every change from the first arm is a no-op on this device is not trained: it says why instead
    idle = {i: r for i, (label, cfg) in enumerate(arms) if i
            and (r := _idle_arm(arms[0][1], cfg, label, comparison)) is not None}
    ran: dict[int, list[RunResult]] = {i: [] for i in range(len(arms))}

    def merged() -> list[RunResult]:
        return [idle[j] if j in idle else merge_repeats(ran[j]) for j in range(len(arms)) if j in idle or ran[j]]

    for r in range(max(1, rounds)):
        order = range(len(arms)) if r % 2 == 0 else reversed(range(len(arms)))
        for i in order:
            if i in idle:
                continue
            label, cfg = arms[i]
            result = run(cfg, label=label, progress=progress, comparison=comparison)
            result.extras["repeat"] = r
            ran[i].append(result)
            if result.status == "interrupted":
                return merged()
    return merged()


def describe_changes(changes: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in changes.items()) or "baseline"


# cuBLAS and cuDNN report a failed allocation in their own words; each is an out-of-memory all the same.
OOM_MARKERS = ("out of memory", "can't allocate memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED")


def is_out_of_memory(error: BaseException) -> bool:
    if isinstance(error, torch.cuda.OutOfMemoryError):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and any(m in text for m in OOM_MARKERS)


# ------------------------------------------------------------------ clocks and checks


def window_ends(warmup: int, steps: int, windows: int) -> dict[int, int]:
    """Step count at the end of each timed window -> steps in that window (the last takes the remainder)."""
    size = steps // windows
    ends, start = {}, warmup
    for i in range(windows):
        end = warmup + steps if i == windows - 1 else start + size
        ends[end] = end - start
        start = end
    return ends


class WindowClock:
    """Warm-up, then timed windows. The clock is read after a synchronise at the end of warm-up and of each
    window, never in between (a sync per step would change what is measured). Time spent inside paused()
    (evaluation checkpoints) counts nowhere."""

    def __init__(self, result: RunResult, device: torch.device, cfg: TrainConfig) -> None:
        self.res, self.device = result, device
        self.warmup, self.total, self.max_seconds = cfg.warmup_steps, cfg.warmup_steps + cfg.steps, cfg.max_seconds
        self.ends = window_ends(cfg.warmup_steps, cfg.steps, cfg.windows)
        self.t_start = self.window_start = 0.0

    def start(self) -> None:
        self.t_start = self.window_start = now(self.device)

    def is_boundary(self, done: int) -> bool:
        return done == self.warmup or done in self.ends

    def step_done(self, done: int, t0: float, wait: float, memory_mb: float, copy: float = 0.0) -> float:
        """Book step `done` (1-based) that began at t0; returns the clock read at its end."""
        res = self.res
        if self.is_boundary(done):
            synchronize(self.device)
        t1 = time.perf_counter()
        res.step_seconds.append(t1 - t0)
        res.data_wait_seconds.append(wait)
        res.copy_seconds.append(copy)
        res.memory_trace_mb.append(memory_mb)
        res.steps_done = done
        if done == self.warmup:
            res.warmup_seconds = t1 - self.t_start
            self.window_start = t1
        elif done in self.ends:
            res.extras.setdefault("window_seconds", []).append(t1 - self.window_start)
            res.window_throughput.append(res.images_per_step * self.ends[done] / (t1 - self.window_start))
            res.timed_seconds += t1 - self.window_start
            self.window_start = t1
        return t1

    def over_budget(self, done: int, t1: float) -> bool:
        """Whether the timed steps (warm-up excluded) have used up max_seconds, with steps left to run."""
        if not self.max_seconds or done <= self.warmup or done >= self.total:
            return False
        return t1 - self.window_start + self.res.timed_seconds > self.max_seconds

    def training_seconds(self) -> float:
        """Wall time of every training step so far, warm-up included, pauses excluded (after a sync)."""
        return now(self.device) - self.t_start

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        synchronize(self.device)
        t = time.perf_counter()
        try:
            yield
        finally:
            synchronize(self.device)
            gap = time.perf_counter() - t
            self.t_start += gap
            self.window_start += gap


class DivergenceWatch:
    """Checks the values a run reads anyway (the logged losses, the GradScaler scale) for non-finite ones;
    adds no host-device sync of its own during timed steps."""

    def __init__(self, result: RunResult, agree: Callable[[bool], bool] | None = None) -> None:
        self.res = result
        self.agree = agree  # with several processes, all must stop together: any one's divergence ends all

    def _check(self, bad: bool, step: int, what: str) -> None:
        if self.agree is not None:
            mine, bad = bad, self.agree(bad)
            if bad and not mine:
                what = f"another rank diverged at step {step}"
        if bad:
            raise _Diverged(step, what)

    def loss(self, step: int, value: float) -> None:
        self._check(not math.isfinite(value), step, f"the training loss became {value} at step {step}")
        if math.isfinite(value):
            self.res.last_finite_loss = value

    def grad_scale(self, step: int, value: float) -> None:
        self._check(not math.isfinite(value) or value < MIN_GRAD_SCALE, step,
                    f"GradScaler's scale collapsed to {value:g} by step {step}: every recent step overflowed")

    def parameters(self, step: int, net: nn.Module) -> None:
        """Once, after the timed steps: a non-finite weight means the run diverged, whatever the last loss said."""
        params = [p.detach() for p in net.parameters() if p.is_floating_point()]
        bad = bool(params) and not bool(torch.stack([torch.isfinite(p).all() for p in params]).all())
        self._check(bad, step, f"a parameter was non-finite after step {step}")


class Parallel(Protocol):
    """What data-parallel training (fastlab.parallel.DDPMode) changes in the one loop; None in a single process."""

    evaluates: bool  # whether this process measures held-out accuracy (rank 0 alone: the replicas are identical)

    def wrap(self, net: nn.Module) -> nn.Module: ...  # the model that trains (DDP around the bare net)

    def batches(self, cfg: TrainConfig, data: Data, device: torch.device, no_ops: dict[str, str]) -> Iterator: ...

    def accumulate(self, model: nn.Module, last: bool) -> contextlib.AbstractContextManager: ...

    def agree(self, flag: bool) -> bool: ...  # True on every process when it is True on any (a collective)

    def finish(self, net: nn.Module, result: RunResult) -> None: ...  # after the steps, before evaluation


@dataclass(frozen=True)
class Checkpoints:
    """Evaluate held-out accuracy every `every` steps (time kept apart) and stop once it reaches `target`;
    stop as time_limited once `max_training_seconds` of training (warm-up included) pass without reaching it."""

    every: int
    target: float
    max_training_seconds: float | None = None


# ------------------------------------------------------------------ one run


class TrainingRun:
    """One training run. `run()` is the way in; execute() runs it in the calling thread."""

    def __init__(self, config: TrainConfig, label: str, model: ModelArg, dataset: DatasetArg, progress: bool,
                 stop: threading.Event | None, on_step: StepCallback | None,
                 checkpoints: Checkpoints | None = None, parallel: Parallel | None = None) -> None:
        self.cfg = config
        self.device = resolve_device(config.device)
        self.model_arg = model
        self.dataset_arg = dataset
        self.progress = progress
        self.stops = [e for e in (stop,) if e is not None]
        self.halt = threading.Event()  # set by run() on Ctrl-C in the caller's thread
        self.stops.append(self.halt)
        self.on_step = on_step
        self.checkpoints = checkpoints
        self.parallel = parallel
        self.result = RunResult(config=config.to_dict(), label=label,
                                env=environment(self.device, config.profile),
                                images_per_step=config.batch_size * config.grad_accum_steps)
        self.no_ops = self.result.no_ops
        self.notes: list[str] = []
        self.preloaded = None  # the config's own images, loaded by the caller (fastlab.isolation hands them over)

    def _build_optimizer(self, net: nn.Module) -> torch.optim.Optimizer:
        """The optimiser this config builds (kept for the optimiser micro-benchmark)."""
        return builders.build_optimizer(self.cfg, net.parameters(), self.no_ops)

    def execute(self) -> RunResult:
        res = self.result
        failure = None  # only the message: the exception's traceback would keep the failed step's tensors alive
        try:
            with builders.backend_flags(self.cfg, self.device, self.no_ops):
                self._train_and_evaluate()
        except _Stopped:
            res.status = "interrupted"
        except KeyboardInterrupt:
            res.status = "interrupted"
        except Exception as e:
            if not is_out_of_memory(e):
                raise
            failure = str(e).splitlines()[0] if str(e) else type(e).__name__
        finally:
            self._release()
        if failure is not None:
            res.status = "failed"
            res.error = f"out of memory at batch_size={self.cfg.batch_size} ({failure})"
        if self.notes:
            res.extras["notes"] = self.notes
        return res

    def _release(self) -> None:
        """Drop every tensor of this run and return cached device memory, so the next run starts clean."""
        # the scheduler with the optimiser: it holds the optimiser (and so Adam's state) until it goes too
        for name in ("net", "model", "compiled", "sched", "opt", "batches", "loader", "scaler", "data"):
            self.__dict__.pop(name, None)
        if self.cfg.compile != "off":
            torch.compiler.reset()  # frees compiled code and CUDA-graph pools; the next compiled run compiles anew
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _train_and_evaluate(self) -> None:
        cfg, dev, res = self.cfg, self.device, self.result
        self.data, res.dataset = builders.load_data(cfg, self.dataset_arg, self.preloaded)
        par = self.parallel
        if par is None and (self.model_arg is not None or self.dataset_arg is not None):
            # the reader's own model or data: a wrong shape or label is named before any timing, not mid-run
            preflight(self.model_arg if self.model_arg is not None else (lambda: build_named_model(cfg.model)),
                      self.data, cfg)
        self.net = builders.build_model(cfg, dev, self.model_arg)
        self.model = par.wrap(self.net) if par else self.net
        self.opt = builders.build_optimizer(cfg, self.model.parameters(), self.no_ops)
        self.sched = builders.build_scheduler(cfg, self.opt, cfg.warmup_steps + cfg.steps)
        self.compiled = builders.compile_model(cfg, self.model, dev, self.no_ops)
        self.amp = builders.amp_dtype(cfg, dev, self.no_ops, self.notes)
        self.scaler = torch.amp.GradScaler(dev.type, enabled=self.amp == torch.float16)
        if par:
            self.batches = par.batches(cfg, self.data, dev, self.no_ops)
        else:
            self.loader = builders.train_batches(cfg, self.data, dev, self.no_ops)
            self.batches = forever(self.loader)
        meter = MemoryMeter(dev)
        res.memory_kind = meter.kind
        res.peak_memory_mb = meter.peak()
        util = GpuUtilSampler(dev)
        watch = DivergenceWatch(res, par.agree if par else None)
        graphs = builders.CudaGraphSkips() if cfg.compile != "off" and dev.type == "cuda" else contextlib.nullcontext()
        try:
            with util, graphs:
                self._steps(meter, watch)
        except _Diverged as d:
            res.status, res.diverged_step, res.error = "diverged", d.step, d.what
        except _Reached:
            pass
        finally:
            res.gpu_util = util.samples
            if util.unavailable and dev.type == "cuda":
                res.extras["gpu_util_note"] = util.unavailable
            res.peak_memory_mb = meter.peak()
            if isinstance(graphs, builders.CudaGraphSkips) and getattr(graphs, "count", 0):
                self.no_ops["cuda_graphs"] = graphs.reason()
            self.batches = None
            self.loader = None
        if par:
            par.finish(self.net, res)
        # a time-to-accuracy run that diverged or ran out of time has its checkpoints' accuracies; one more pass over
        # the held-out set on such weights (NaN, or a precision 10x slower here) would cost more than it tells
        trap = self.checkpoints is not None and res.status in ("diverged", "time_limited")
        if (par is None or par.evaluates) and res.eval_accuracy is None and not trap:
            self._evaluate(meter)

    def _steps(self, meter: MemoryMeter, watch: DivergenceWatch) -> None:
        """The step loop: warm-up, then the timed windows."""
        cfg, dev, res = self.cfg, self.device, self.result
        clock = WindowClock(res, dev, cfg)
        kept_losses: list[torch.Tensor] = []  # loss tensors kept with their graphs (log_loss="tensor")
        bar = _progress_bar(clock.total, res.label, self.progress)
        loss = None
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*lr_scheduler.step.*")
                self.net.train()
                clock.start()
                for step in range(clock.total):
                    if any(e.is_set() for e in self.stops):
                        raise _Stopped
                    t0 = time.perf_counter()
                    loss, wait = self._one_step(step, sample=0 < step < cfg.warmup_steps)
                    if cfg.log_loss == "tensor":
                        kept_losses.append(loss)  # the pitfall: keeps this step's whole graph alive
                    if (step + 1) % cfg.log_every == 0:
                        self._read_loss(step, loss, watch)
                    t1 = clock.step_done(step + 1, t0, wait, meter.sample(), self.copy_s)
                    bar.update(1)
                    if self.on_step is not None:
                        self.on_step(step + 1, clock.total)
                    if self.checkpoints and (step + 1) % self.checkpoints.every == 0:
                        self._checkpoint(step, clock, meter)
                    if self._over_training_budget(clock, t1):
                        res.error = (f"stopped after {t1 - clock.t_start:.0f} s of training without reaching the "
                                     f"target (its budget: {self.checkpoints.max_training_seconds:.0f} s)")
                        res.extras["stopped_by"] = "max_training_seconds"  # a trap limit (outcomes.TrapLimits)
                        raise _OverBudget
                    if self._over_budget(clock, step + 1, t1):
                        raise _OverBudget
            self._final_check(clock.total - 1, loss, watch)
        except _OverBudget:
            res.status = "time_limited"
            res.extras.setdefault("stopped_by", "max_seconds")  # the harness's own budget: never a trap
            res.error = res.error or (f"stopped at its max_seconds={cfg.max_seconds:g} budget after "
                                      f"{res.steps_done} steps")
            self._final_check(res.steps_done - 1, loss, watch)
        finally:
            bar.close()
            if cfg.log_loss == "tensor":
                res.extras["kept_loss_tensors"] = len(kept_losses)
                kept = [(s, float(v)) for s, v in res.extras.pop("_logged", [])]
                res.losses.extend(kept)
            kept_losses.clear()

    def _over_training_budget(self, clock: WindowClock, t1: float) -> bool:
        """A time-to-accuracy run's budget, warm-up included: read from the step's own clock (no extra sync; on a
        GPU it may lag the queued work by a step, which is fine for a budget)."""
        limit = self.checkpoints.max_training_seconds if self.checkpoints else None
        return bool(limit) and t1 - clock.t_start > limit

    def _over_budget(self, clock: WindowClock, done: int, t1: float) -> bool:
        if self.parallel is None:
            return clock.over_budget(done, t1)
        # every process must stop at the same step, or the others wait forever in the next all-reduce:
        # decided together, at window ends (where each has synchronised anyway)
        return clock.is_boundary(done) and done < clock.total and self.parallel.agree(clock.over_budget(done, t1))

    def _one_step(self, step: int, sample: bool) -> tuple[torch.Tensor, float]:
        """One optimiser step over grad_accum_steps micro-batches; returns (the last loss, seconds of data wait)
        and leaves the step's copy-to-device seconds in self.copy_s.
        Warm-up steps after the first (sample=True) are bracketed by syncs to sample the shares of the forward,
        the backward and the optimiser step (each micro-batch's forward and backward also bracketed)."""
        cfg, dev, res = self.cfg, self.device, self.result
        non_blocking = cfg.non_blocking and cfg.pin_memory and dev.type == "cuda"
        if sample:
            synchronize(dev)
        t0 = time.perf_counter()
        wait, self.copy_s = 0.0, 0.0
        fwd = bwd = 0.0
        self.opt.zero_grad(set_to_none=cfg.set_to_none)
        for micro in range(cfg.grad_accum_steps):
            tw = time.perf_counter()
            x, y = next(self.batches)  # data wait: this call alone
            tc = time.perf_counter()
            wait += tc - tw
            # the copy is apart: without non_blocking it ends in a stream sync, so it also waits for the
            # previous step's queued kernels (GPU compute, not data)
            x, y = to_device(x, y, dev, non_blocking, cfg.channels_last)
            self.copy_s += time.perf_counter() - tc
            last = micro == cfg.grad_accum_steps - 1
            if sample:  # an async copy ends at this sync (all else was synchronised): its wait is the copy's
                t_sync = time.perf_counter()
                synchronize(dev)
                t_fwd = time.perf_counter()
                self.copy_s += t_fwd - t_sync
            with self.parallel.accumulate(self.model, last) if self.parallel else contextlib.nullcontext():
                with builders.autocast(dev, self.amp):
                    loss = nn.functional.cross_entropy(self.compiled(x), y) / cfg.grad_accum_steps
                if sample:
                    synchronize(dev)
                    t_bwd = time.perf_counter()
                    fwd += t_bwd - t_fwd
                self.scaler.scale(loss).backward()
                if sample:
                    synchronize(dev)
                    bwd += time.perf_counter() - t_bwd
        if sample:
            synchronize(dev)
            t_opt = time.perf_counter()
        self.scaler.step(self.opt)
        self.scaler.update()
        if sample:
            synchronize(dev)
            res.optimizer_step_seconds.append(time.perf_counter() - t_opt)
            res.sampled_step_seconds.append(time.perf_counter() - t0)
            res.forward_seconds.append(fwd)
            res.backward_seconds.append(bwd)
        if self.sched is not None:
            self.sched.step()
        return loss, wait

    def _read_loss(self, step: int, loss: torch.Tensor, watch: DivergenceWatch) -> None:
        """The loss read of a logging step (a host-device sync with log_loss="item"), checked for divergence."""
        cfg, res = self.cfg, self.result
        if cfg.log_loss == "item":
            value = loss.item() * cfg.grad_accum_steps
            res.losses.append((step, value))
            watch.loss(step, value)
        else:  # kept as a tensor, read after the run: no sync here
            res.extras.setdefault("_logged", []).append((step, loss.detach() * cfg.grad_accum_steps))
        if self.scaler.is_enabled():
            scale = float(self.scaler.get_scale())
            res.grad_scale.append(scale)
            watch.grad_scale(step, scale)

    def _final_check(self, step: int, loss: torch.Tensor | None, watch: DivergenceWatch) -> None:
        """After the timed steps: the losses kept as tensors, the last loss (if not read) and the parameters."""
        res = self.result
        for s, v in res.extras.get("_logged", []):
            watch.loss(s, float(v))
        logged_last = bool(res.losses) and res.losses[-1][0] == step
        if loss is not None and not logged_last:
            watch.loss(step, float(loss.detach()) * self.cfg.grad_accum_steps)
        watch.parameters(step, self.net)

    def _checkpoint(self, step: int, clock: WindowClock, meter: MemoryMeter) -> None:
        """A time-to-accuracy checkpoint: held-out accuracy, with its time kept out of the training clock."""
        res = self.result
        with clock.paused():
            seconds = clock.training_seconds()
            accuracy, eval_seconds = self._accuracy()
            self.net.train()
        curve = res.extras.setdefault("tta_curve", [])
        curve.append([seconds, step + 1, accuracy])
        if accuracy >= self.checkpoints.target:
            # the run ends on these weights: this evaluation is its held-out accuracy (no second pass)
            res.eval_accuracy, res.eval_seconds = accuracy, eval_seconds
            raise _Reached

    def _eval_batches(self):
        cfg, dev, data = self.cfg, self.device, self.data
        if isinstance(data, tuple):
            return dataset_loader(data[1], batch_size=cfg.batch_size, train=False), len(data[1])
        loader = DeviceLoader(data.eval_images, data.eval_labels, batch_size=cfg.batch_size, train=False,
                              device=dev, channels_last=cfg.channels_last)
        return loader, len(data.eval_labels)

    def _accuracy(self, meter: MemoryMeter | None = None) -> tuple[float, float]:
        """Held-out accuracy of the current weights and the seconds it took (synchronised)."""
        cfg, dev = self.cfg, self.device
        loader, n_eval = self._eval_batches()
        mode = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode,
                "autograd": contextlib.nullcontext}[cfg.eval_mode]
        self.net.eval()
        t0 = now(dev)
        correct = 0
        with mode():
            for x, y in loader:
                x, y = x.to(dev), y.to(dev)
                if cfg.channels_last:
                    x = x.contiguous(memory_format=torch.channels_last)
                with builders.autocast(dev, self.amp):
                    logits = self.net(x)
                correct += (logits.argmax(1) == y).sum()
                if meter is not None:
                    meter.sample()
        return int(correct) / n_eval, now(dev) - t0

    def _evaluate(self, meter: MemoryMeter) -> None:
        res = self.result
        meter.reset()
        res.eval_accuracy, res.eval_seconds = self._accuracy(meter)
        res.eval_peak_memory_mb = meter.peak()
        self.net.train()


def to_device(x: torch.Tensor, y: torch.Tensor, device: torch.device, non_blocking: bool,
              channels_last: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch's host-to-device copy (and NHWC conversion): timed as its own part of the step, not as data wait."""
    x = x.to(device, non_blocking=non_blocking)
    y = y.to(device, non_blocking=non_blocking)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    return x, y


def _progress_bar(total: int, label: str, enabled: bool):
    if not enabled:
        return _NoBar()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=label, unit="step", leave=False, mininterval=0.5)


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


__all__ = ["run", "compare", "sweep", "interleave", "active_run", "exclusive_run", "run_in_fresh_thread", "TrainingRun", "WindowClock",
           "DivergenceWatch", "Checkpoints", "window_ends", "is_out_of_memory", "describe_changes", "ImageSet"]
