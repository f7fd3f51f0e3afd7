"""The one training loop. It honours every TrainConfig knob and measures as it goes.

What is inside the timer: everything a training step does (waiting for the batch, the
host-to-device copy, forward, backward, optimiser and scheduler step, loss logging). Evaluation
and warm-up are timed apart. On CUDA the clock is read only after a synchronise, at the end of
warm-up and at the end of every timed window, so queued GPU work is always counted.

    throughput of a window = images per step x steps in the window / window wall time
    images per step        = batch_size x grad_accum_steps
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from .config import TrainConfig
from .data import DeviceLoader, ImageSet, dataset_loader, forever, load_images, make_dataloader
from .measure import GpuUtilSampler, MemoryMeter, bf16_supported, environment, now, resolve_device, synchronize
from .models import build_model
from .results import RunResult

StepCallback = Callable[[int, int], None]


class _Stopped(Exception):
    """Raised inside the loop when the caller's stop event is set."""


class _OverBudget(Exception):
    """Raised inside the loop when the run has used up config.max_seconds."""


DatasetArg = ImageSet | tuple[Dataset, Dataset] | None


def run(config: TrainConfig, *, label: str = "run", model: nn.Module | Callable[[], nn.Module] | None = None,
        dataset: DatasetArg = None, progress: bool = True, stop: threading.Event | None = None,
        on_step: StepCallback | None = None, comparison: str | None = None) -> RunResult:
    """Train with `config` and return what was measured.

    model: a module (or a function that builds one) to train instead of `config.model`.
    dataset: instead of `config.dataset`, an ImageSet (uint8 images: works with both loaders), or a pair
        (train, held_out) of map-style torch Datasets yielding (image tensor, int label) (loader="dataloader").
    comparison: the name of the comparison this run belongs to (matched against bundled reference results).
    stop: set it (from another thread) to end the run early; the result is marked interrupted.
    on_step: called as on_step(steps_done, total_steps) after each step (for progress widgets).
    Out-of-memory and KeyboardInterrupt end the run with a result marked failed / interrupted; a run whose
    timed steps (warm-up excluded) take over config.max_seconds ends marked time_limited. Each keeps the
    steps it finished.
    """
    result = TrainingRun(config, label, model, dataset, progress, stop, on_step).execute()
    if comparison:
        result.extras["comparison"] = comparison
    return result


def compare(base: TrainConfig, *, progress: bool = True, comparison: str | None = None,
            **changes: Any) -> list[RunResult]:
    """Run `base`, then `base` with `changes`; returns [baseline, changed]."""
    changed = base.replace(**changes)
    results = [run(base, label="baseline", progress=progress, comparison=comparison)]
    if results[-1].status != "interrupted":
        results.append(run(changed, label=describe_changes(changes), progress=progress, comparison=comparison))
    return results


def sweep(knob: str, values: list[Any], base: TrainConfig, *, progress: bool = True,
          comparison: str | None = None) -> list[RunResult]:
    """One run per value of `knob`; stops early (keeping what ran) if a run is interrupted."""
    configs = [base.replace(**{knob: v}) for v in values]  # validate every value before running any
    results = []
    for value, cfg in zip(values, configs):
        results.append(run(cfg, label=f"{knob}={value}", progress=progress, comparison=comparison))
        if results[-1].status == "interrupted":
            break
    return results


def describe_changes(changes: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in changes.items()) or "baseline"


def is_out_of_memory(error: BaseException) -> bool:
    if isinstance(error, torch.cuda.OutOfMemoryError):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


class TrainingRun:
    """One training run. `run()` is the way in; the _build_* methods and the backend-flag handling are
    reused by the DDP worker and the optimiser micro-benchmark so that every knob means the same there."""

    def __init__(self, config: TrainConfig, label: str, model, dataset: ImageSet | None, progress: bool,
                 stop: threading.Event | None, on_step: StepCallback | None) -> None:
        self.cfg = config
        self.device = resolve_device(config.device)
        self.model_arg = model
        self.dataset_arg = dataset
        self.progress = progress
        self.stop = stop
        self.on_step = on_step
        self.result = RunResult(config=config.to_dict(), label=label,
                                env=environment(self.device, config.profile),
                                images_per_step=config.batch_size * config.grad_accum_steps)
        self.no_ops = self.result.no_ops

    # ------------------------------------------------------------ setup

    def _apply_backend_flags(self) -> dict[str, bool]:
        cfg, dev = self.cfg, self.device
        saved = {"benchmark": torch.backends.cudnn.benchmark,
                 "matmul_tf32": torch.backends.cuda.matmul.allow_tf32,
                 "cudnn_tf32": torch.backends.cudnn.allow_tf32}
        torch.backends.cudnn.benchmark = cfg.cudnn_benchmark
        torch.backends.cuda.matmul.allow_tf32 = cfg.tf32
        torch.backends.cudnn.allow_tf32 = cfg.tf32
        if dev.type != "cuda":
            if cfg.cudnn_benchmark:
                self.no_ops["cudnn_benchmark"] = f"cuDNN runs only on NVIDIA GPUs; this run is on {dev.type}"
            if cfg.tf32:
                self.no_ops["tf32"] = f"TF32 is a mode of NVIDIA Ampere-or-newer GPUs; this run is on {dev.type}"
        elif cfg.tf32 and torch.cuda.get_device_capability(dev)[0] < 8:
            self.no_ops["tf32"] = "TF32 needs an Ampere-or-newer GPU (compute capability 8.0+)"
        return saved

    @staticmethod
    def _restore_backend_flags(saved: dict[str, bool]) -> None:
        torch.backends.cudnn.benchmark = saved["benchmark"]
        torch.backends.cuda.matmul.allow_tf32 = saved["matmul_tf32"]
        torch.backends.cudnn.allow_tf32 = saved["cudnn_tf32"]

    def _load_data(self) -> ImageSet | tuple[Dataset, Dataset]:
        cfg = self.cfg
        if isinstance(self.dataset_arg, tuple):
            train, held_out = self.dataset_arg
            if cfg.loader == "device":
                raise ValueError("TrainConfig.loader='device' needs the images as arrays: pass a fastlab.ImageSet, "
                                 "or use loader='dataloader' with torch Datasets")
            self.result.dataset = {"name": type(train).__name__, "synthetic": bool(getattr(train, "synthetic", False)),
                                   "source": "Datasets passed to fastlab.run", "train_images": len(train),
                                   "eval_images": len(held_out)}
            return self.dataset_arg
        images = self.dataset_arg or load_images(cfg.dataset, cfg.train_images, cfg.eval_images,
                                                 allow_download=cfg.profile != "smoke")
        self.result.dataset = {"name": images.name, "synthetic": images.synthetic, "source": images.source,
                               "train_images": len(images.train_labels), "eval_images": len(images.eval_labels)}
        return images

    def _train_batches(self, images: ImageSet | tuple[Dataset, Dataset]):
        cfg, dev = self.cfg, self.device
        if dev.type != "cuda":
            if cfg.pin_memory:
                self.no_ops["pin_memory"] = f"pinned host memory only speeds copies to a CUDA GPU; this run is on {dev.type}"
            if cfg.non_blocking:
                self.no_ops["non_blocking"] = f"asynchronous copies need a CUDA GPU; this run is on {dev.type}"
        elif cfg.non_blocking and not cfg.pin_memory and cfg.loader == "dataloader":
            self.no_ops["non_blocking"] = "a copy from pageable (unpinned) memory is synchronous; set pin_memory=True"
        if cfg.loader == "device":
            for knob in ("pin_memory", "non_blocking"):
                if getattr(cfg, knob):
                    self.no_ops[knob] = "the device loader keeps the data on the device: there is no copy to speed up"
            return DeviceLoader(images.train_images, images.train_labels, batch_size=cfg.batch_size, train=True,
                                device=dev, seed=cfg.seed, channels_last=cfg.channels_last)
        if isinstance(images, tuple):
            return dataset_loader(images[0], batch_size=cfg.batch_size, train=True, num_workers=cfg.num_workers,
                                  pin_memory=cfg.pin_memory and dev.type == "cuda",
                                  persistent_workers=cfg.persistent_workers, prefetch_factor=cfg.prefetch_factor,
                                  seed=cfg.seed)
        return make_dataloader(images.train_images, images.train_labels, batch_size=cfg.batch_size, train=True,
                               num_workers=cfg.num_workers, pin_memory=cfg.pin_memory and dev.type == "cuda",
                               persistent_workers=cfg.persistent_workers, prefetch_factor=cfg.prefetch_factor,
                               seed=cfg.seed)

    def _build_model(self) -> nn.Module:
        cfg = self.cfg
        torch.manual_seed(cfg.seed)
        arg = self.model_arg
        net = arg() if callable(arg) and not isinstance(arg, nn.Module) else arg
        net = net if net is not None else build_model(cfg.model)
        net = net.to(self.device)
        if cfg.channels_last:
            net = net.to(memory_format=torch.channels_last)
        return net

    def _build_optimizer(self, net: nn.Module) -> torch.optim.Optimizer:
        cfg = self.cfg
        impl = {"default": {}, "for-loop": {"foreach": False}, "foreach": {"foreach": True},
                "fused": {"fused": True}}[cfg.opt_impl]
        cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[cfg.optimizer]
        kwargs: dict[str, Any] = {"lr": cfg.lr, "weight_decay": cfg.weight_decay}
        if cfg.optimizer == "sgd":
            kwargs.update(momentum=cfg.momentum, nesterov=True)
        try:
            return cls(net.parameters(), **kwargs, **impl)
        except (RuntimeError, ValueError) as e:
            self.no_ops["opt_impl"] = f"{cfg.opt_impl} {cfg.optimizer} is not available here ({e}); used torch's default"
            return cls(net.parameters(), **kwargs)

    def _build_scheduler(self, opt: torch.optim.Optimizer, total: int):
        cfg = self.cfg
        if cfg.scheduler == "cosine":
            return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total)
        if cfg.scheduler == "onecycle":
            return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.lr, total_steps=total)
        return None

    def _compile(self, net: nn.Module) -> nn.Module:
        cfg, dev = self.cfg, self.device
        if cfg.compile == "off":
            return net
        if cfg.compile == "reduce-overhead" and dev.type != "cuda":
            self.no_ops["compile"] = "reduce-overhead adds CUDA graphs, which need a CUDA GPU; compiled without them"
        return torch.compile(net, mode=None if cfg.compile == "default" else cfg.compile)

    def _amp_dtype(self) -> torch.dtype | None:
        cfg, dev = self.cfg, self.device
        if cfg.amp == "bf16" and not bf16_supported(dev):
            self.no_ops["amp"] = f"bf16 is not supported on {self.result.env['device_name']}; ran in fp32"
            return None
        return {"off": None, "fp16": torch.float16, "bf16": torch.bfloat16}[cfg.amp]

    # ------------------------------------------------------------ the run

    def execute(self) -> RunResult:
        saved = self._apply_backend_flags()
        failure: BaseException | None = None
        try:
            self._train_and_evaluate()
        except _Stopped:
            self.result.status = "interrupted"
        except _OverBudget:
            self.result.status = "time_limited"
            self.result.error = (f"stopped at its max_seconds={self.cfg.max_seconds:g} budget after "
                                 f"{self.result.steps_done} steps")
        except KeyboardInterrupt:
            self.result.status = "interrupted"
        except Exception as e:
            if not is_out_of_memory(e):
                raise
            failure = e
        finally:
            self._restore_backend_flags(saved)
            self._release()
        if failure is not None:
            self.result.status = "failed"
            self.result.error = f"out of memory at batch_size={self.cfg.batch_size} ({str(failure).splitlines()[0]})"
        return self.result

    def _release(self) -> None:
        """Drop every tensor of this run and return cached device memory, so the next run starts clean."""
        for name in ("net", "compiled", "opt", "batches", "loader", "scaler"):
            self.__dict__.pop(name, None)
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _train_and_evaluate(self) -> None:
        cfg, dev, res = self.cfg, self.device, self.result
        images = self._load_data()
        self.net = self._build_model()
        self.opt = self._build_optimizer(self.net)
        total = cfg.warmup_steps + cfg.steps
        sched = self._build_scheduler(self.opt, total)
        self.compiled = self._compile(self.net)
        amp_dtype = self._amp_dtype()
        self.scaler = torch.amp.GradScaler(dev.type, enabled=amp_dtype == torch.float16)
        self.loader = self._train_batches(images)
        self.batches = forever(self.loader)
        meter = MemoryMeter(dev)
        res.memory_kind = meter.kind
        res.peak_memory_mb = meter.peak()
        self.net.train()
        loss_fn = nn.CrossEntropyLoss()
        non_blocking = cfg.non_blocking and cfg.pin_memory and dev.type == "cuda"
        ends = window_ends(cfg.warmup_steps, cfg.steps, cfg.windows)
        kept_losses: list[torch.Tensor] = []  # loss tensors kept with their graphs (log_loss="tensor")
        logged: list[tuple[int, torch.Tensor]] = []
        bar = _progress_bar(total, res.label, self.progress)
        util = GpuUtilSampler(dev)
        try:
            with util, warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*lr_scheduler.step.*")
                t_start = now(dev)
                window_start = t_start
                for step in range(total):
                    if self.stop is not None and self.stop.is_set():
                        raise _Stopped
                    # Warm-up steps after the first are bracketed by syncs to sample the optimiser's share
                    # of a step; timed steps never are (a sync per step would change what is measured).
                    sample = 0 < step < cfg.warmup_steps
                    if sample:
                        synchronize(dev)
                    t0 = time.perf_counter()
                    wait = 0.0
                    self.opt.zero_grad(set_to_none=cfg.set_to_none)
                    for _ in range(cfg.grad_accum_steps):
                        tw = time.perf_counter()
                        x, y = next(self.batches)
                        x = x.to(dev, non_blocking=non_blocking)
                        y = y.to(dev, non_blocking=non_blocking)
                        if cfg.channels_last:
                            x = x.contiguous(memory_format=torch.channels_last)
                        wait += time.perf_counter() - tw
                        with torch.autocast(dev.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
                            loss = loss_fn(self.compiled(x), y) / cfg.grad_accum_steps
                        self.scaler.scale(loss).backward()
                    if sample:
                        synchronize(dev)
                        t_opt = time.perf_counter()
                    self.scaler.step(self.opt)
                    self.scaler.update()
                    if sample:
                        synchronize(dev)
                        res.optimizer_step_seconds.append(time.perf_counter() - t_opt)
                        res.sampled_step_seconds.append(time.perf_counter() - t0)
                    if sched is not None:
                        sched.step()
                    if cfg.log_loss == "tensor":
                        kept_losses.append(loss)  # the pitfall: keeps this step's whole graph alive
                    if (step + 1) % cfg.log_every == 0:
                        if cfg.log_loss == "item":
                            res.losses.append((step, loss.item() * cfg.grad_accum_steps))
                        else:
                            logged.append((step, loss.detach() * cfg.grad_accum_steps))
                        if self.scaler.is_enabled():
                            res.grad_scale.append(float(self.scaler.get_scale()))
                    if step + 1 == cfg.warmup_steps or step + 1 in ends:
                        synchronize(dev)
                    t1 = time.perf_counter()
                    res.step_seconds.append(t1 - t0)
                    res.data_wait_seconds.append(wait)
                    res.memory_trace_mb.append(meter.sample())
                    res.steps_done = step + 1
                    if step + 1 == cfg.warmup_steps:
                        res.warmup_seconds = t1 - t_start
                        window_start = t1
                    elif step + 1 in ends:
                        n_steps = ends[step + 1]
                        res.window_throughput.append(res.images_per_step * n_steps / (t1 - window_start))
                        res.timed_seconds += t1 - window_start
                        window_start = t1
                    bar.update(1)
                    if self.on_step is not None:
                        self.on_step(step + 1, total)
                    timed_so_far = t1 - window_start + res.timed_seconds if step + 1 > cfg.warmup_steps else 0.0
                    if cfg.max_seconds and timed_so_far > cfg.max_seconds and step + 1 < total:
                        raise _OverBudget
        finally:
            bar.close()
            res.gpu_util = util.samples
            res.peak_memory_mb = meter.peak()
            res.losses.extend((s, float(v)) for s, v in logged)
            if cfg.log_loss == "tensor":
                res.extras["kept_loss_tensors"] = len(kept_losses)
            kept_losses.clear()
            self.batches = None
            self.loader = None
        self._evaluate(images, meter)

    def _evaluate(self, images: ImageSet | tuple[Dataset, Dataset], meter: MemoryMeter) -> None:
        cfg, dev, res = self.cfg, self.device, self.result
        if isinstance(images, tuple):
            loader = dataset_loader(images[1], batch_size=cfg.batch_size, train=False)
            n_eval = len(images[1])
        else:
            loader = DeviceLoader(images.eval_images, images.eval_labels, batch_size=cfg.batch_size, train=False,
                                  device=dev, channels_last=cfg.channels_last)
            n_eval = len(images.eval_labels)
        mode = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode,
                "autograd": contextlib.nullcontext}[cfg.eval_mode]
        amp_dtype = self._amp_dtype()
        self.net.eval()
        meter.reset()
        t0 = now(dev)
        correct = 0
        with mode():
            for x, y in loader:
                x, y = x.to(dev), y.to(dev)
                if cfg.channels_last:
                    x = x.contiguous(memory_format=torch.channels_last)
                with torch.autocast(dev.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
                    logits = self.net(x)
                correct += (logits.argmax(1) == y).sum()
                meter.sample()
        res.eval_accuracy = int(correct) / n_eval
        res.eval_seconds = now(dev) - t0
        res.eval_peak_memory_mb = meter.peak()
        self.net.train()


def window_ends(warmup: int, steps: int, windows: int) -> dict[int, int]:
    """Step count at the end of each timed window -> steps in that window (the last takes the remainder)."""
    size = steps // windows
    ends, start = {}, warmup
    for i in range(windows):
        end = warmup + steps if i == windows - 1 else start + size
        ends[end] = end - start
        start = end
    return ends


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
