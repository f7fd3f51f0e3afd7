"""The harness around fastlab.training.train: data, the reader's model checked before any timing, the config as
it runs here, and a watch under its RunLimits (fastlab.run_limits). A run ends with a status, never an exception."""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from .clocks import Checkpoints
from .config import TrainConfig, as_run_here
from .data import Data, load_data
from .measure import environment, is_out_of_memory, resolve_device
from .models import ModelArg
from .models import build_model as build_named_model
from .preflight import preflight
from .results import RunResult
from .run_limits import RunEnded, RunLimits, waiting_for
from .training import train
from .watch import Watch

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
        self.preloaded = None  # the config's own images, loaded by the caller (fastlab.isolation hands them over)
        self.waiting = None  # set by fastlab.isolation in a run's process: when the loop began waiting for a batch

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
        return res

    def _train(self) -> None:
        cfg, dev, res, par = self.cfg, self.device, self.result, self.parallel
        data, res.dataset = load_data(cfg, self.dataset_arg, self.preloaded)
        if par is None and (self.model_arg is not None or self.dataset_arg is not None):
            # the reader's own model or data: a wrong shape or label is named before any timing, not mid-run
            with waiting_for(self.waiting, paused=False):  # reading its sample is waiting for data too
                preflight(self.model_arg if self.model_arg is not None else (lambda: build_named_model(cfg.model)),
                          data, cfg)
        runs, no_ops, notes = as_run_here(cfg, dev)  # the result keeps the config as asked
        self.no_ops.update(no_ops)
        if notes:
            res.extras["notes"] = notes
        if cfg.compile != "off":
            torch.compiler.reset()  # fresh compiler caches: the warm-up holds this run's own compilation
        bar = progress_bar(cfg.warmup_steps + cfg.steps, res.label, self.progress)
        checkpoints = self.checkpoints

        def on_step(done: int, total: int) -> None:
            bar.update(1)
            if self.on_step is not None:
                self.on_step(done, total)

        limits = RunLimits(steps=cfg.steps, windows=cfg.windows, max_seconds=cfg.max_seconds, stops=tuple(self.stops),
                           checkpoint_every=checkpoints.every if checkpoints else 0,
                           target_accuracy=checkpoints.target if checkpoints else None,
                           max_training_seconds=checkpoints.max_training_seconds if checkpoints else None,
                           agree=par.agree if par else None, on_step=on_step, sample_parts=cfg.compile == "off",
                           evaluate_after_trap=checkpoints is None, result=res, waiting=self.waiting)
        w = Watch(res.label, device=dev, warmup_steps=cfg.warmup_steps, log_every=cfg.log_every, limits=limits)
        graphs = CudaGraphSkips() if cfg.compile != "off" and dev.type == "cuda" else contextlib.nullcontext()
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
            if isinstance(graphs, CudaGraphSkips) and graphs.count:
                self.no_ops["cuda_graphs"] = graphs.reason()
        if net is not None and res.status in ("ok", "time_limited") and res.steps_done:
            w.divergence.parameters(res.steps_done - 1, net)  # a non-finite weight, whatever the last loss said
        if par is not None and net is not None and res.status != "interrupted":
            par.finish(net, res)


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
            res.losses.append((step, float(entry["loss"])))  # kept as read: a run ended mid-step keeps them
            w.divergence.loss(step, entry["loss"])  # (the watch's end rewrites the list whole, the same values)
        if "grad_scale" in entry:
            res.grad_scale.append(float(entry["grad_scale"]))
            w.divergence.grad_scale(step, float(entry["grad_scale"]))
        if "kept_loss_tensors" in entry:
            res.kept_loss_tensors = entry["kept_loss_tensors"]

    return log


@contextlib.contextmanager
def _backend_flags_restored() -> Iterator[None]:
    """Stock flags for the run (the training function sets what its config changes); a run in a thread leaves none."""
    cudnn = torch.backends.cudnn
    # cudnn.conv.fp32_precision, not the legacy cudnn.allow_tf32: reading the legacy flag raises once the new one
    # was set (torch 2.9+, the API torch asks for)
    saved = (cudnn.benchmark, cudnn.conv.fp32_precision, torch.get_float32_matmul_precision())
    cudnn.benchmark, cudnn.conv.fp32_precision = False, "tf32"  # torch's stock settings
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        cudnn.benchmark, cudnn.conv.fp32_precision = saved[:2]
        torch.set_float32_matmul_precision(saved[2])


@contextlib.contextmanager
def run_guard(result: RunResult, batch_size: int) -> Iterator[None]:
    """Ctrl-C ends the run as interrupted; an out-of-memory error as failed; the steps done are kept either way.
    Only the error's message is kept: its traceback would hold the failed step's tensors alive."""
    failure = None
    try:
        yield
    except KeyboardInterrupt:
        result.status = "interrupted"
    except Exception as e:
        if not is_out_of_memory(e):
            raise
        failure = str(e).splitlines()[0] if str(e) else type(e).__name__
    if failure is not None:
        result.status = "failed"
        result.error = f"out of memory at batch_size={batch_size} ({failure})"


def progress_bar(total: int, label: str, enabled: bool) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=label, unit="step", leave=False, mininterval=0.5, disable=not enabled)


@contextlib.contextmanager
def cold_compile_caches(cfg: TrainConfig) -> Iterator[None]:
    """torch.compile with its on-disk caches off for a compiled config (no-op otherwise): a metric that counts
    compilation (time to accuracy) then charges every seed what a first run pays."""
    import torch._inductor.config as inductor_config

    if cfg.compile == "off" or not hasattr(inductor_config, "force_disable_caches"):
        yield
        return
    with inductor_config.patch(force_disable_caches=True), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*force_disable_caches")  # dynamo's note that it is on
        yield


class CudaGraphSkips(logging.Handler):
    """Counts (and keeps the reasons of) the times inductor skipped CUDA graphs while it is attached."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.reasons: list[str] = []
        self._before = self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.reasons.append(record.getMessage())

    def __enter__(self) -> CudaGraphSkips:
        from torch._dynamo.utils import counters

        self._before = counters["inductor"]["cudagraph_skips"]
        self._logger = logging.getLogger("torch._inductor.cudagraph_utils.__cudagraphs")
        self._logger.addHandler(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        from torch._dynamo.utils import counters

        self._logger.removeHandler(self)
        self.count = counters["inductor"]["cudagraph_skips"] - self._before

    def reason(self) -> str:
        why = "; ".join(dict.fromkeys(self.reasons)) or "run with TORCH_LOGS=cudagraphs for dynamo's reason"
        return f"CUDA graphs were skipped {self.count} time(s): {why}"
