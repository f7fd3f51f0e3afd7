"""The one training loop: what a training step does under every TrainConfig knob, in one file.

Read `_build` for what each knob builds (fastlab.builders: one function per knob, its "no-op here, because"
beside it), `_one_step` for a step, `_steps` for the loop. The measuring touches are few and named: `clock`
(fastlab.clocks: the clock is read after a synchronise at the end of warm-up and of each timed window, never in
between), `wait` (the `next(batches)` call alone is data wait), `copy` (the host-to-device copy is timed apart:
without non_blocking it ends in a stream sync, so it also waits for the previous step's GPU work) and `watch`
(divergence, fastlab.watch's rule too: on the losses the loop logs anyway and the last step's). Warm-up steps after the first are also bracketed by
syncs to sample the shares of forward, backward and optimiser step. Evaluation and warm-up are timed apart.

The loop ends with a status, never an exception: "ok", "interrupted", "time_limited" or "diverged". The harness
(fastlab.harness, fastlab.isolation) runs it in a fresh process; Ctrl-C and out-of-memory keep the steps done.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

from . import builders
from .builders import Data, ModelArg
from .clocks import Checkpoints, DivergenceWatch, WindowClock
from .config import TrainConfig
from .data import forever
from .harness import progress_bar, run_guard
from .measure import GpuUtilSampler, MemoryMeter, environment, now, resolve_device, synchronize
from .models import build_model as build_named_model
from .preflight import preflight
from .results import RunResult

if TYPE_CHECKING:
    from .parallel import Parallel

StepCallback = Callable[[int, int], None]


class TrainingRun:
    """One training run. `fastlab.run()` is the way in; execute() runs it in the calling thread."""

    def __init__(self, config: TrainConfig, label: str, model: ModelArg, dataset: Data | None, progress: bool,
                 stop: threading.Event | None, on_step: StepCallback | None,
                 checkpoints: Checkpoints | None = None, parallel: Parallel | None = None) -> None:
        self.cfg, self.model_arg, self.dataset_arg = config, model, dataset
        self.device = resolve_device(config.device)
        self.progress, self.on_step, self.checkpoints, self.parallel = progress, on_step, checkpoints, parallel
        self.halt = threading.Event()  # set by the harness on Ctrl-C in the caller's thread
        self.stops = [e for e in (stop, self.halt) if e is not None]
        self.result = RunResult(config=config.to_dict(), label=label, env=environment(self.device, config.profile),
                                images_per_step=config.batch_size * config.grad_accum_steps)
        self.no_ops = self.result.no_ops  # knob -> why it does nothing here (the builders add to it)
        self.notes: list[str] = []
        self.preloaded = None  # the config's own images, loaded by the caller (fastlab.isolation hands them over)

    def execute(self) -> RunResult:
        try:
            with run_guard(self.result, self.cfg.batch_size), builders.backend_flags(self.cfg, self.device,
                                                                                    self.no_ops):
                self._train_and_evaluate()
        finally:
            self._release()
        if self.notes:
            self.result.extras["notes"] = self.notes
        return self.result

    def _build(self) -> None:
        """Every knob becomes an object here: data, model, optimiser, schedule, compiled model, precision, batches."""
        cfg, dev, par = self.cfg, self.device, self.parallel
        self.data, self.result.dataset = builders.load_data(cfg, self.dataset_arg, self.preloaded)
        if par is None and (self.model_arg is not None or self.dataset_arg is not None):
            # the reader's own model or data: a wrong shape or label is named before any timing, not mid-run
            preflight(self.model_arg if self.model_arg is not None else (lambda: build_named_model(cfg.model)),
                      self.data, cfg)
        self.net = builders.build_model(cfg, dev, self.model_arg)            # seeded; channels_last
        self.model = par.wrap(self.net) if par else self.net                  # DDP around it
        self.opt = builders.build_optimizer(cfg, self.model.parameters(), self.no_ops)  # optimizer, opt_impl
        self.sched = builders.build_scheduler(cfg, self.opt, cfg.warmup_steps + cfg.steps)  # scheduler
        self.compiled = builders.compile_model(cfg, self.model, dev, self.no_ops)  # compile
        self.amp = builders.amp_dtype(cfg, dev, self.no_ops, self.notes)     # amp: the autocast dtype
        self.scaler = torch.amp.GradScaler(dev.type, enabled=self.amp == torch.float16)  # fp16 needs a scaler
        self.batches = (par.batches(cfg, self.data, dev, self.no_ops) if par else
                        forever(builders.train_batches(cfg, self.data, dev, self.no_ops)))  # loader, workers, pin
        self.non_blocking = builders.copies_async(cfg, dev)                   # non_blocking (needs pinned memory)

    def _train_and_evaluate(self) -> None:
        cfg, dev, res, par = self.cfg, self.device, self.result, self.parallel
        self._build()
        meter, util = MemoryMeter(dev), GpuUtilSampler(dev)
        res.memory_kind, res.peak_memory_mb = meter.kind, meter.peak()
        graphs = builders.CudaGraphSkips() if cfg.compile != "off" and dev.type == "cuda" else contextlib.nullcontext()
        try:
            with util, graphs:
                self._steps(meter, DivergenceWatch(res, par.agree if par else None))
        finally:
            res.gpu_util, res.peak_memory_mb = util.samples, meter.peak()
            if util.unavailable and dev.type == "cuda":
                res.extras["gpu_util_note"] = util.unavailable
            if isinstance(graphs, builders.CudaGraphSkips) and getattr(graphs, "count", 0):
                self.no_ops["cuda_graphs"] = graphs.reason()
            self.batches = None  # ends the DataLoader's workers
        if res.status == "interrupted":
            return
        if par:
            par.finish(self.net, res)
        # a time-to-accuracy run that diverged or ran out of time has its checkpoints' accuracies; one more pass over
        # the held-out set on such weights (NaN, or a precision 10x slower here) would cost more than it tells
        trap = self.checkpoints is not None and res.status in ("diverged", "time_limited")
        if (par is None or par.evaluates) and res.eval_accuracy is None and not trap:
            meter.reset()
            res.eval_accuracy, res.eval_seconds = self._accuracy(meter)
            res.eval_peak_memory_mb = meter.peak()

    def _steps(self, meter: MemoryMeter, watch: DivergenceWatch) -> None:
        """The loop: warm-up, then the timed windows; it ends with the result's status set."""
        cfg, res = self.cfg, self.result
        clock = WindowClock(res, self.device, cfg)
        kept_losses: list[torch.Tensor] = []  # log_loss="tensor": each step's loss kept with its graph
        bar = progress_bar(clock.total, res.label, self.progress)
        loss, done = None, 0
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*lr_scheduler.step.*")
                self.net.train()
                clock.start()
                for step in range(clock.total):
                    if any(e.is_set() for e in self.stops):
                        res.status = "interrupted"
                        break
                    t0 = time.perf_counter()
                    loss, wait, copy = self._one_step(sample=0 < step < cfg.warmup_steps)
                    done = step + 1
                    if step == 0:  # the blow-up rule's reference, taken before any update; read with a later loss
                        watch.first_loss(loss.detach() * cfg.grad_accum_steps)
                    if cfg.log_loss == "tensor":
                        kept_losses.append(loss)  # the pitfall: keeps this step's whole graph alive
                    if done % cfg.log_every == 0 and self._log_loss(step, loss, watch):
                        break  # diverged
                    t1 = clock.step_done(done, t0, wait, meter.sample(), copy)
                    bar.update(1)
                    if self.on_step is not None:
                        self.on_step(done, clock.total)
                    if self.checkpoints and done % self.checkpoints.every == 0 and self._reached_target(step, clock):
                        break
                    if self._over_budget(clock, done, t1):
                        res.status = "time_limited"
                        break
        finally:
            bar.close()
            if cfg.log_loss == "tensor":  # read now, after the timed steps: no sync during them
                res.extras["kept_loss_tensors"] = len(kept_losses)
                res.losses.extend((s, float(v)) for s, v in res.extras.pop("_logged", []))
            kept_losses.clear()
        if res.status in ("ok", "time_limited") and done:
            self._final_check(done - 1, loss, watch)

    def _one_step(self, sample: bool) -> tuple[torch.Tensor, float, float]:
        """One optimiser step over grad_accum_steps micro-batches; returns (the last loss, data wait, copy time).
        sample=True brackets each part by syncs, to sample the shares of forward, backward and optimiser step."""
        cfg, dev, res = self.cfg, self.device, self.result
        sync = synchronize if sample else (lambda device: None)
        sync(dev)
        t_step = time.perf_counter()
        wait = copy = fwd = bwd = 0.0
        self.opt.zero_grad(set_to_none=cfg.set_to_none)
        for micro in range(cfg.grad_accum_steps):
            t = time.perf_counter()
            x, y = next(self.batches)                                          # data wait: this call alone
            wait += time.perf_counter() - t
            t = time.perf_counter()
            x, y = to_device(x, y, dev, self.non_blocking, cfg.channels_last)  # the copy (and NHWC), timed apart
            sync(dev)  # when sampling, an async copy ends here (all else was synchronised): its wait is the copy's
            copy += time.perf_counter() - t
            last = micro == cfg.grad_accum_steps - 1
            with self.parallel.accumulate(self.model, last) if self.parallel else contextlib.nullcontext():
                t = time.perf_counter()
                with builders.autocast(dev, self.amp):                         # amp: fp16 / bf16 autocast
                    loss = nn.functional.cross_entropy(self.compiled(x), y) / cfg.grad_accum_steps
                sync(dev)
                fwd += time.perf_counter() - t
                t = time.perf_counter()
                self.scaler.scale(loss).backward()                             # scaled only with fp16
                sync(dev)
                bwd += time.perf_counter() - t
        t = time.perf_counter()
        self.scaler.step(self.opt)                                             # skipped if fp16 overflowed
        self.scaler.update()
        if sample:
            sync(dev)
            res.optimizer_step_seconds.append(time.perf_counter() - t)
            res.sampled_step_seconds.append(time.perf_counter() - t_step)
            res.forward_seconds.append(fwd)
            res.backward_seconds.append(bwd)
        if self.sched is not None:
            self.sched.step()                                                  # per batch, not per epoch
        return loss, wait, copy

    def _log_loss(self, step: int, loss: torch.Tensor, watch: DivergenceWatch) -> bool:
        """A logging step's loss read (a host-device sync with log_loss="item"); True when the run diverged."""
        cfg, res = self.cfg, self.result
        diverged = False
        if cfg.log_loss == "item":
            value = loss.item() * cfg.grad_accum_steps                         # .item(): a float, the graph freed
            res.losses.append((step, value))
            diverged = watch.loss(step, value)
        else:  # kept as a tensor, read after the run: no sync here
            res.extras.setdefault("_logged", []).append((step, loss.detach() * cfg.grad_accum_steps))
        if self.scaler.is_enabled():
            scale = float(self.scaler.get_scale())
            res.grad_scale.append(scale)
            diverged = watch.grad_scale(step, scale) or diverged
        return diverged

    def _final_check(self, step: int, loss: torch.Tensor | None, watch: DivergenceWatch) -> None:
        """After the timed steps: the losses kept as tensors, the last loss (if not read) and the parameters."""
        res, cfg = self.result, self.cfg
        if cfg.log_loss == "tensor" and any(watch.loss(s, v) for s, v in res.losses):
            return
        logged_last = bool(res.losses) and res.losses[-1][0] == step
        if loss is not None and not logged_last and watch.loss(step, float(loss.detach()) * cfg.grad_accum_steps):
            return
        watch.parameters(step, self.net)

    def _over_budget(self, clock: WindowClock, done: int, t1: float) -> bool:
        """max_seconds of timed steps used up, or a time-to-accuracy run's training budget (warm-up included)."""
        res, limit = self.result, self.checkpoints.max_training_seconds if self.checkpoints else None
        if limit and t1 - clock.t_start > limit:  # the step's own clock: no extra sync (it may lag by a step)
            res.error = (f"stopped after {t1 - clock.t_start:.0f} s of training without reaching the target (its "
                         f"budget: {limit:.0f} s)")
            res.extras["stopped_by"] = "max_training_seconds"  # a trap limit (outcomes.TrapLimits)
            return True
        if self.parallel is None:
            over = clock.over_budget(done, t1)
        else:  # every process must stop at the same step, or the others wait forever in the next all-reduce
            over = clock.is_boundary(done) and done < clock.total and self.parallel.agree(clock.over_budget(done, t1))
        if over:
            res.extras["stopped_by"] = "max_seconds"  # the harness's own budget: never a trap
            res.error = f"stopped at its max_seconds={self.cfg.max_seconds:g} budget after {done} steps"
        return over

    def _reached_target(self, step: int, clock: WindowClock) -> bool:
        """A time-to-accuracy checkpoint: held-out accuracy, its time kept out of the training clock."""
        res = self.result
        with clock.paused():
            seconds = clock.training_seconds()
            accuracy, eval_seconds = self._accuracy()
        res.extras.setdefault("tta_curve", []).append([seconds, step + 1, accuracy])
        if accuracy < self.checkpoints.target:
            return False
        res.eval_accuracy, res.eval_seconds = accuracy, eval_seconds  # these weights end the run: no second pass
        return True

    def _accuracy(self, meter: MemoryMeter | None = None) -> tuple[float, float]:
        """Held-out accuracy of the current weights and the seconds it took (synchronised)."""
        cfg, dev = self.cfg, self.device
        loader, n_eval = builders.eval_batches(cfg, self.data, dev)
        mode = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode,
                "autograd": contextlib.nullcontext}[cfg.eval_mode]           # eval_mode: no_grad, or the pitfall
        self.net.eval()
        t0, correct = now(dev), 0
        with mode():
            for x, y in loader:
                x, y = to_device(x, y, dev, False, cfg.channels_last)
                with builders.autocast(dev, self.amp):
                    logits = self.net(x)
                correct += (logits.argmax(1) == y).sum()
                if meter is not None:
                    meter.sample()
        accuracy = int(correct) / n_eval
        self.net.train()
        return accuracy, now(dev) - t0

    def _release(self) -> None:
        """Drop every tensor of this run and return cached device memory, so the next run starts clean."""
        # the scheduler with the optimiser: it holds the optimiser (and so Adam's state) until it goes too
        for name in ("net", "model", "compiled", "sched", "opt", "batches", "scaler", "data"):
            self.__dict__.pop(name, None)
        if self.cfg.compile != "off":
            torch.compiler.reset()  # frees compiled code and CUDA-graph pools; the next compiled run compiles anew
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def to_device(x: torch.Tensor, y: torch.Tensor, device: torch.device, non_blocking: bool,
              channels_last: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch's host-to-device copy (and NHWC conversion): timed as its own part of the step, not as data wait."""
    x = x.to(device, non_blocking=non_blocking)
    y = y.to(device, non_blocking=non_blocking)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    return x, y
