"""The training run: one function, plain PyTorch in the order a person writes it. Every knob of TrainConfig is an
`if cfg.x:` or a value where it acts; the measuring goes only through the watch `w` a reader puts in their own
loop. What a script does not need (Ctrl-C, out-of-memory, time budgets, progress) is in fastlab.harness.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

from .config import TrainConfig
from .data import CifarLikeDataset, DeviceLoader, ImageSet, forever
from .measure import resolve_device
from .models import build_model


def evaluate(cfg: TrainConfig, model: nn.Module, loader: Any, device: torch.device) -> float:
    """Held-out accuracy: no augmentation, in order, the model in eval mode."""
    if cfg.eval_mode == "no_grad":
        grad_mode = torch.no_grad()  # no graph is recorded: less memory, less time
    elif cfg.eval_mode == "inference_mode":
        grad_mode = torch.inference_mode()  # like no_grad, and its tensors skip autograd's version counters
    else:
        grad_mode = contextlib.nullcontext()  # the pitfall: autograd records every op of evaluation
    model.eval()
    correct = seen = 0
    with grad_mode:
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            if cfg.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            with torch.autocast(device.type, dtype=AMP_DTYPES[cfg.amp], enabled=cfg.amp != "off"):
                logits = model(x)
            correct += (logits.argmax(1) == y).sum()
            seen += len(y)
    model.train()
    return int(correct) / seen


def make_optimizer(cfg: TrainConfig, params: Any) -> torch.optim.Optimizer:
    """The optimiser, as cfg says."""
    impl: dict[str, bool] = {}
    if cfg.opt_impl == "for-loop":
        impl["foreach"] = False  # one parameter at a time
    elif cfg.opt_impl == "foreach":
        impl["foreach"] = True  # one multi-tensor kernel per operation over all parameters
    elif cfg.opt_impl == "fused":
        impl["fused"] = True  # the update in a few fused kernels
    if cfg.optimizer == "sgd":
        optimizer = torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, nesterov=True,
                                    weight_decay=cfg.weight_decay, **impl)
    elif cfg.optimizer == "adam":
        optimizer = torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay, **impl)
    else:
        optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, **impl)
    return optimizer


def make_scheduler(cfg: TrainConfig, optimizer: torch.optim.Optimizer, total_steps: int) -> Any:
    """The learning-rate schedule over total_steps (cfg.scheduler is not "none")."""
    if cfg.scheduler == "cosine":
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps)
    else:
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=cfg.lr, total_steps=total_steps)
    return scheduler


AMP_DTYPES = {"off": None, "fp16": torch.float16, "bf16": torch.bfloat16}


def train(cfg: TrainConfig, w: Any, data: ImageSet | tuple[Dataset, Dataset], *,
          make_model: Callable[[], nn.Module] | None = None, parallel: Any = None,
          log: Callable[[dict[str, Any]], None] = print, eval_every: int = 0) -> nn.Module:
    """Train a model as `cfg` says and return it. data: the images (an ImageSet), or the reader's own
    (train, held_out) Datasets; make_model: the reader's own model; parallel: this rank's data-parallel setup
    (fastlab.parallel.DDPMode); log: takes a dict of what the loop logs (print, or the harness's recorder);
    eval_every: held-out accuracy every so many steps (time to accuracy)."""
    device = resolve_device(cfg.device)

    # ---- backend flags (they hold for the whole process: fastlab.run gives each run a fresh one)
    if cfg.cudnn_benchmark:
        torch.backends.cudnn.benchmark = True  # cuDNN times its algorithms per input shape, keeps the fastest
    if not cfg.tf32:
        torch.backends.cudnn.conv.fp32_precision = "ieee"  # full fp32 convolutions (torch's default: TF32 on Ampere+)
    if cfg.matmul_precision != "highest":
        torch.set_float32_matmul_precision(cfg.matmul_precision)  # fp32 matmuls may use TF32 (or bf16 on a CPU)

    # ---- data
    if isinstance(data, tuple):  # the reader's own Datasets
        train_set, eval_set = data
        eval_loader = DataLoader(eval_set, batch_size=cfg.batch_size)
    else:  # uint8 images: the held-out ones normalised on the device, in order
        eval_loader = DeviceLoader(data.eval_images, data.eval_labels, batch_size=cfg.batch_size, train=False,
                                   device=device)
    sampler = None
    if cfg.loader == "device":  # the whole set on the device, augmented a batch at a time: no copy, no workers
        images, labels = data.train_images, data.train_labels
        if parallel is not None:  # this rank's shard, augmented with its own seed
            images, labels = parallel.shard(images), parallel.shard(labels)
        loader = DeviceLoader(images, labels, batch_size=cfg.batch_size, train=True, device=device,
                              seed=cfg.seed + (parallel.rank if parallel is not None else 0),
                              channels_last=cfg.channels_last)
    else:
        if not isinstance(data, tuple):
            train_set = CifarLikeDataset(data.train_images, data.train_labels, train=True)  # per-image transforms
        if parallel is not None:  # each rank a different part of every epoch
            sampler = torch.utils.data.DistributedSampler(train_set, num_replicas=parallel.world, rank=parallel.rank,
                                                          shuffle=True, seed=cfg.seed, drop_last=True)
        loader = DataLoader(train_set, batch_size=cfg.batch_size, shuffle=sampler is None, drop_last=True,
                            sampler=sampler,
                            num_workers=cfg.num_workers,  # worker processes decode and augment in parallel
                            persistent_workers=cfg.persistent_workers and cfg.num_workers > 0,  # kept between epochs
                            prefetch_factor=cfg.prefetch_factor if cfg.num_workers else None,  # batches loaded ahead
                            pin_memory=cfg.pin_memory and device.type == "cuda",  # page-locked: async copies to a GPU
                            generator=torch.Generator().manual_seed(cfg.seed))
    batches = forever(loader, sampler=sampler)  # epoch after epoch (a new shuffle each epoch)

    # ---- model
    torch.manual_seed(cfg.seed)  # the same initial weights for every run of this seed
    if make_model is None:
        raw_model = build_model(cfg.model).to(device)
    else:
        raw_model = make_model().to(device)
    if cfg.channels_last:
        raw_model = raw_model.to(memory_format=torch.channels_last)  # NHWC weights: what tensor cores want
    if parallel is not None and parallel.sync_batchnorm:
        raw_model = nn.SyncBatchNorm.convert_sync_batchnorm(raw_model)  # BatchNorm statistics over the global batch
    model = raw_model
    if parallel is not None:  # one process per device; DDP all-reduces the gradients in buckets during backward
        ddp_model = model = DDP(raw_model, device_ids=[device.index] if device.type == "cuda" else None,
                                bucket_cap_mb=parallel.bucket_cap_mb)
        parallel.watch(ddp_model)  # fastlab counts the all-reduces (a comm hook): a script leaves this line out

    # ---- optimiser and schedule
    optimizer = make_optimizer(cfg, model.parameters())
    total_steps = cfg.warmup_steps + cfg.steps
    if cfg.scheduler != "none":
        scheduler = make_scheduler(cfg, optimizer, total_steps)  # the learning rate, step by step

    # ---- compilation and precision
    if cfg.compile == "default":
        model = torch.compile(model)  # compiled on the first steps (warm-up)
    elif cfg.compile != "off":
        model = torch.compile(model, mode=cfg.compile)  # "reduce-overhead": CUDA graphs too
    if cfg.amp == "fp16":
        scaler = torch.amp.GradScaler(device.type)  # scales the loss so fp16 gradients do not underflow

    # ---- the loop
    if cfg.log_loss == "tensor":
        kept_losses: list[torch.Tensor] = []  # the pitfall below: `total_loss += loss` keeps as much
    step = 0
    micro = 0  # micro-batches since the optimiser's last step
    raw_model.train()
    for x, y in w(batches):  # the watch ends it early on Ctrl-C, a time budget, divergence or a reached target
        # the copy queues behind the previous step's kernels; non_blocking: the host does not wait for it (from
        # pinned memory only: from pageable memory it waits all the same)
        x, y = x.to(device, non_blocking=cfg.non_blocking), y.to(device, non_blocking=cfg.non_blocking)
        if cfg.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        if parallel is not None:  # all-reduce the gradients only on the last micro-batch of a step
            ddp_model.require_backward_grad_sync = micro == cfg.grad_accum_steps - 1 or not parallel.no_sync
        with torch.autocast(device.type, dtype=AMP_DTYPES[cfg.amp], enabled=cfg.amp != "off"):  # per op
            loss = F.cross_entropy(model(x), y)
        if cfg.amp == "fp16":
            scaler.scale(loss / cfg.grad_accum_steps).backward()
        else:
            (loss / cfg.grad_accum_steps).backward()
        if cfg.grad_accum_steps > 1:
            micro += 1
            if micro < cfg.grad_accum_steps:
                continue  # gradients add up; the optimiser steps after the last micro-batch
            micro = 0
        if cfg.amp == "fp16":
            scaler.step(optimizer)  # checks the gradients for inf/NaN (a sync); skips the step if it finds any
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=cfg.set_to_none)  # set_to_none frees the gradients instead of zeroing
        if cfg.scheduler != "none":
            scheduler.step()  # per step, not per epoch
        if cfg.log_loss == "tensor":
            kept_losses.append(loss)  # the pitfall: a kept loss keeps its step's whole graph alive
        elif (step + 1) % cfg.log_every == 0:
            logged = {"step": step, "loss": loss.item()}  # .item(): a float, the graph freed (a host-device sync)
            if cfg.amp == "fp16":
                logged["grad_scale"] = scaler.get_scale()
            log(logged)
        w.step_done(cfg.batch_size * cfg.grad_accum_steps, loss=loss)
        step += 1
        if eval_every and step % eval_every == 0:
            with w.paused() as p:  # held-out accuracy on the way: not training time
                p.accuracy = evaluate(cfg, raw_model, eval_loader, device)
        if step == total_steps:
            break
    if cfg.log_loss == "tensor":  # read after the run: no sync per step, but every step's graph was kept till now
        for i, kept in enumerate(kept_losses):
            if (i + 1) % cfg.log_every == 0:
                log({"step": i, "loss": kept.item()})
        log({"kept_loss_tensors": len(kept_losses)})
        kept_losses.clear()

    # ---- held-out accuracy
    evaluates = parallel is None or parallel.evaluates  # one process evaluates: the replicas are identical
    evaluated = eval_every > 0 and step % eval_every == 0  # a checkpoint evaluated it at this very step
    if evaluates and not evaluated:
        with w.paused() as p:
            p.accuracy = evaluate(cfg, raw_model, eval_loader, device)
        log({"held_out_accuracy": p.accuracy})
    return raw_model
