"""What a TrainConfig builds: backend flags, data, model, optimiser, schedule, precision and compilation.

Plain functions of a config, shared by the single-process run, the DDP worker and the lessons, so that every
knob means the same thing wherever it is used. `no_ops` is the run's record of knobs that do nothing on this
machine (knob -> why); the builders add to it.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from .config import TrainConfig
from .data import DeviceLoader, ImageSet, dataset_loader, load_images, make_dataloader
from .measure import bf16_supported

NoOps = dict[str, str]
ModelArg = nn.Module | Callable[[], nn.Module] | None
Data = ImageSet | tuple[Dataset, Dataset]


def load_data(cfg: TrainConfig, dataset_arg: Data | None, preloaded: ImageSet | None = None
              ) -> tuple[Data, dict[str, Any]]:
    """The run's images (or the caller's Datasets) and the description every result carries. preloaded: the
    images load_images gives for cfg, already loaded (a run's process gets them from its caller's cache)."""
    if isinstance(dataset_arg, tuple):
        train, held_out = dataset_arg
        if cfg.loader == "device":
            raise ValueError("TrainConfig.loader='device' needs the images as arrays: pass a fastlab.ImageSet, "
                             "or use loader='dataloader' with torch Datasets")
        return dataset_arg, {"name": type(train).__name__, "synthetic": bool(getattr(train, "synthetic", False)),
                             "source": "Datasets passed to fastlab.run", "train_images": len(train),
                             "eval_images": len(held_out)}
    images = dataset_arg or preloaded or load_images(cfg.dataset, cfg.train_images, cfg.eval_images,
                                                     allow_download=cfg.profile != "smoke")
    return images, {"name": images.name, "synthetic": images.synthetic, "source": images.source,
                    "train_images": len(images.train_labels), "eval_images": len(images.eval_labels)}


def train_batches(cfg: TrainConfig, data: Data, device: torch.device, no_ops: NoOps):
    """The training batches: a DataLoader (per-image transforms) or the device-resident loader."""
    if device.type == "cuda" and cfg.non_blocking and not cfg.pin_memory and cfg.loader == "dataloader":
        no_ops["non_blocking"] = "a copy from pageable (unpinned) memory is synchronous; set pin_memory=True"
    pin = cfg.pin_memory and device.type == "cuda"  # pinned (page-locked) memory only helps a copy to a CUDA GPU
    if cfg.loader == "device":
        for knob in ("pin_memory", "non_blocking"):
            if getattr(cfg, knob):
                no_ops[knob] = "the device loader keeps the data on the device: there is no copy to speed up"
        return DeviceLoader(data.train_images, data.train_labels, batch_size=cfg.batch_size, train=True,
                            device=device, seed=cfg.seed, channels_last=cfg.channels_last)
    workers = dict(num_workers=cfg.num_workers, pin_memory=pin, persistent_workers=cfg.persistent_workers,
                   prefetch_factor=cfg.prefetch_factor, seed=cfg.seed)
    if isinstance(data, tuple):
        return dataset_loader(data[0], batch_size=cfg.batch_size, train=True, **workers)
    return make_dataloader(data.train_images, data.train_labels, batch_size=cfg.batch_size, train=True, **workers)


OPT_IMPL_KWARGS = {"default": {}, "for-loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}
OPTIMIZERS = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}


def build_optimizer(cfg: TrainConfig, params: Any, no_ops: NoOps) -> torch.optim.Optimizer:
    """The optimiser; an implementation this machine lacks falls back to torch's default, recorded as a no-op."""
    params = list(params)
    cls = OPTIMIZERS[cfg.optimizer]
    kwargs: dict[str, Any] = {"lr": cfg.lr, "weight_decay": cfg.weight_decay}
    if cfg.optimizer == "sgd":
        kwargs.update(momentum=cfg.momentum, nesterov=True)
    try:
        return cls(params, **kwargs, **OPT_IMPL_KWARGS[cfg.opt_impl])
    except (RuntimeError, ValueError) as e:
        no_ops["opt_impl"] = f"{cfg.opt_impl} {cfg.optimizer} is not available here ({e}); used torch's default"
        return cls(params, **kwargs)


def build_scheduler(cfg: TrainConfig, opt: torch.optim.Optimizer, total_steps: int):
    if cfg.scheduler == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total_steps)
    if cfg.scheduler == "onecycle":
        return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.lr, total_steps=total_steps)
    return None


@contextlib.contextmanager
def cold_compile_caches(cfg: TrainConfig) -> Iterator[None]:
    """torch.compile with its on-disk caches off for a compiled config (no-op otherwise). A metric that counts
    compilation (time to accuracy) then charges every seed what a first run pays: with the caches on, the first
    seed compiled the compact net in ~50 s on a 2-core CPU and the next seeds reused its kernels in ~2 s."""
    import torch._inductor.config as inductor_config

    if cfg.compile == "off" or not hasattr(inductor_config, "force_disable_caches"):
        yield
        return
    with inductor_config.patch(force_disable_caches=True), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*force_disable_caches")  # dynamo's note that it is on
        yield


def amp_dtype(cfg: TrainConfig, device: torch.device, no_ops: NoOps, notes: list[str] | None = None) -> torch.dtype | None:
    """The autocast dtype, or None for fp32."""
    if cfg.amp == "bf16" and not bf16_supported(device):
        if device.type == "cuda":  # runs, emulated: slower than fp16 there, which the run's notes say
            if notes is not None:
                notes.append("bf16 is emulated on this GPU (compute capability below 8.0): fp16 with GradScaler "
                             "is its native half precision")
        elif device.type == "cpu":  # every CPU runs bf16 autocast; without bf16 instructions it is the known trap
            if notes is not None:
                notes.append("this CPU has no native bf16 instructions: bf16 autocast ran emulated (converted to "
                             "and from fp32 around every op)")
        else:
            no_ops["amp"] = f"bf16 autocast is not supported on {device.type}; ran in fp32"
            return None
    return {"off": None, "fp16": torch.float16, "bf16": torch.bfloat16}[cfg.amp]


class CudaGraphSkips(logging.Handler):
    """Counts (and keeps the reasons of) the times inductor skipped CUDA graphs while it is attached."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.reasons: list[str] = []
        self._before = 0

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
