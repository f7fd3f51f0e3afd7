"""The harness around the one training function: fastlab.training.train, measured by a fastlab.watch.

TrainingRun loads the data, checks the reader's own model and data before any timing, runs a knob that cannot
apply here at its stock setting (recording why), and calls train(cfg, w, data) with a watch under a Budget.
The run ends with a status, never an exception: "ok", "interrupted", "time_limited", "diverged" or "failed".
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from . import builders
from .builders import Data, ModelArg
from .clocks import Checkpoints
from .config import TrainConfig
from .device_support import no_op_reasons
from .harness import progress_bar, run_guard
from .measure import environment, resolve_device
from .models import build_model as build_named_model
from .preflight import preflight
from .results import RunResult
from .training import train
from .watch import Budget, RunEnded, Watch

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
        self.no_ops = self.result.no_ops  # knob -> why it does nothing here
        self.notes: list[str] = []
        self.preloaded = None  # the config's own images, loaded by the caller (fastlab.isolation hands them over)

    def execute(self) -> RunResult:
        cfg, res = self.cfg, self.result
        try:
            with run_guard(res, cfg.batch_size), _backend_flags_restored():
                self._train()
        finally:
            if cfg.compile != "off":
                torch.compiler.reset()  # frees compiled code and CUDA-graph pools: the next run compiles anew
            gc.collect()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()  # the next run starts from an empty cache
        if self.notes:
            res.extras["notes"] = self.notes
        return res

    def _train(self) -> None:
        cfg, dev, res, par = self.cfg, self.device, self.result, self.parallel
        data, res.dataset = builders.load_data(cfg, self.dataset_arg, self.preloaded)
        if par is None and (self.model_arg is not None or self.dataset_arg is not None):
            # the reader's own model or data: a wrong shape or label is named before any timing, not mid-run
            preflight(self.model_arg if self.model_arg is not None else (lambda: build_named_model(cfg.model)),
                      data, cfg)
        runs = self._as_run_here()
        bar = progress_bar(cfg.warmup_steps + cfg.steps, res.label, self.progress)
        checkpoints = self.checkpoints

        def on_step(done: int, total: int) -> None:
            bar.update(1)
            if self.on_step is not None:
                self.on_step(done, total)

        budget = Budget(steps=cfg.steps, windows=cfg.windows, max_seconds=cfg.max_seconds, stops=tuple(self.stops),
                        checkpoint_every=checkpoints.every if checkpoints else 0,
                        target_accuracy=checkpoints.target if checkpoints else None,
                        max_training_seconds=checkpoints.max_training_seconds if checkpoints else None,
                        agree=par.agree if par else None, on_step=on_step, sample_parts=cfg.compile == "off",
                        evaluate_after_trap=checkpoints is None, result=res)
        w = Watch(res.label, device=dev, warmup_steps=cfg.warmup_steps, log_every=cfg.log_every, budget=budget)
        graphs = builders.CudaGraphSkips() if cfg.compile != "off" and dev.type == "cuda" else contextlib.nullcontext()
        net = None
        try:
            with graphs:
                net = train(runs, w, data, make_model=_model_factory(self.model_arg), parallel=par,
                            log=_recorder(w, res), eval_every=checkpoints.every if checkpoints else 0)
        except RunEnded:
            pass  # stopped (Ctrl-C), or a time-to-accuracy trap: its checkpoints' accuracies are its result
        finally:
            bar.close()
            w.result()
            if isinstance(graphs, builders.CudaGraphSkips) and getattr(graphs, "count", 0):
                self.no_ops["cuda_graphs"] = graphs.reason()
        if net is not None and res.status in ("ok", "time_limited") and res.steps_done:
            w.divergence.parameters(res.steps_done - 1, net)  # a non-finite weight, whatever the last loss said
        if par is not None and net is not None and res.status != "interrupted":
            par.finish(net, res)

    def _as_run_here(self) -> TrainConfig:
        """The config as it runs on this machine: a knob that cannot apply here is set to its stock value, and
        self.no_ops says why (the result keeps the config as asked)."""
        cfg, dev, no_ops = self.cfg, self.device, self.no_ops
        no_ops.update(no_op_reasons(cfg, dev))
        changes: dict[str, Any] = {}
        if cfg.loader == "device":
            for knob in ("pin_memory", "non_blocking"):
                if getattr(cfg, knob):
                    no_ops[knob] = "the device loader keeps the data on the device: there is no copy to speed up"
        elif dev.type == "cuda" and cfg.non_blocking and not cfg.pin_memory:
            no_ops["non_blocking"] = "a copy from pageable (unpinned) memory is synchronous; set pin_memory=True"
        if cfg.opt_impl != "default":  # an implementation this machine lacks: torch's default, recorded
            probe = [torch.zeros(1, device=dev, requires_grad=True)]
            had = "opt_impl" in no_ops
            builders.build_optimizer(cfg, probe, no_ops)  # records a no-op when this machine lacks the implementation
            if had or "opt_impl" in no_ops:
                changes["opt_impl"] = "default"
        if cfg.amp != "off" and builders.amp_dtype(cfg, dev, no_ops, self.notes) is None:
            changes["amp"] = "off"
        if cfg.compile != "off":
            torch.compiler.reset()  # fresh compiler caches: the warm-up holds this run's own compilation
        return cfg.replace(**changes) if changes else cfg


def _model_factory(model: ModelArg) -> Callable[[], torch.nn.Module] | None:
    if model is None or (callable(model) and not isinstance(model, torch.nn.Module)):
        return model  # type: ignore[return-value]
    return lambda: model


def _recorder(w: Watch, res: RunResult) -> Callable[[dict[str, Any]], None]:
    """The training function's log: a loss it read (judged at once, so a diverged run stops at the next
    batch), GradScaler's scale, the loss tensors it kept."""

    def log(entry: dict[str, Any]) -> None:
        step = entry.get("step", res.steps_done)
        if "loss" in entry:
            w.divergence.loss(step, entry["loss"])
        if "grad_scale" in entry:
            res.grad_scale.append(float(entry["grad_scale"]))
            w.divergence.grad_scale(step, float(entry["grad_scale"]))
        if "kept_loss_tensors" in entry:
            res.kept_loss_tensors = entry["kept_loss_tensors"]

    return log


@contextlib.contextmanager
def _backend_flags_restored() -> Iterator[None]:
    """Stock flags for the run (the training function sets what its config changes); a run in a thread leaves none."""
    saved = (torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision())
    torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32 = False, True  # torch's stock settings
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32 = saved[0], saved[1]
        torch.set_float32_matmul_precision(saved[2])
