"""Data-parallel training as a mode of the one loop (DDPMode: what differs from one process), and its arithmetic:

    per-rank batch = TrainConfig.batch_size (options.batch="per_rank"), or batch_size / N (batch="global")
    global batch   = per-rank batch x grad_accum_steps x N   (the images one optimiser step learns from)
    throughput     = global batch x steps in a window / the slowest rank's wall time for that window
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from .config import TrainConfig, positive_int
from .results import RunResult


class Parallel(Protocol):
    """What data-parallel training (DDPMode) changes in fastlab.training.train; None in a single process."""

    evaluates: bool  # whether this process measures held-out accuracy (rank 0 alone: the replicas are identical)
    rank: int
    world: int
    no_sync: bool  # accumulation micro-batches but the last skip the gradient all-reduce
    sync_batchnorm: bool  # BatchNorm statistics over the global batch (GPU modules only)
    bucket_cap_mb: float  # gradients are all-reduced in buckets of this size, overlapping backward

    def watch(self, model: nn.Module) -> None: ...  # fastlab's count of the all-reduces (a comm hook)

    def shard(self, array: Any) -> Any: ...  # this rank's part of the training set (the device loader)

    def agree(self, flag: bool) -> bool: ...  # True on every process when it is True on any (a collective)

    def finish(self, net: nn.Module, result: RunResult) -> None: ...  # after the steps


BATCH_MODES = ("per_rank", "global")
LR_SCALINGS = ("none", "linear", "sqrt")
BACKENDS = ("auto", "gloo", "nccl")


@dataclass(frozen=True)
class DDPOptions:
    """How a TrainConfig is spread over the ranks (the knobs that only exist with more than one process)."""

    batch: str = "per_rank"  # "per_rank": each rank takes batch_size (global grows with N); "global": batch_size is split
    lr_scaling: str = "none"  # lr x (global batch / single-process batch): "linear", its square root ("sqrt"), or not
    sync_batchnorm: bool = False  # BatchNorm statistics over the global batch (an all-reduce per BN layer; GPU only)
    no_sync: bool = True  # skip the gradient all-reduce on accumulation micro-batches but the last
    bucket_cap_mb: float = 25.0  # gradients are all-reduced in buckets of this size, overlapping backward
    backend: str = "auto"  # "auto": nccl on CUDA, gloo on CPU

    def __post_init__(self) -> None:
        for name, allowed in (("batch", BATCH_MODES), ("lr_scaling", LR_SCALINGS), ("backend", BACKENDS),
                              ("sync_batchnorm", (True, False)), ("no_sync", (True, False))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"DDPOptions.{name}={getattr(self, name)!r} is not allowed: choose one of "
                                 + ", ".join(repr(a) for a in allowed))
        cap = self.bucket_cap_mb
        if isinstance(cap, bool) or not isinstance(cap, (int, float)) or cap <= 0:
            raise ValueError(f"DDPOptions.bucket_cap_mb={cap!r} is not allowed: a number > 0")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ------------------------------------------------------------------ arithmetic (pure, unit-tested)


@dataclass(frozen=True)
class BatchPlan:
    world_size: int
    per_rank_batch: int  # images per micro-batch on one rank
    grad_accum_steps: int
    global_batch: int  # images per optimiser step, all ranks together
    base_lr: float  # TrainConfig.lr: tuned for the single-process batch
    lr: float  # the learning rate the ranks use

    def describe(self) -> str:
        return (f"per-rank batch {self.per_rank_batch} x {self.grad_accum_steps} accumulation step(s) x "
                f"{self.world_size} rank(s) = global batch {self.global_batch}; learning rate {self.base_lr:g} -> "
                f"{self.lr:g}")


def plan_batches(config: TrainConfig, world_size: int, options: DDPOptions | None = None) -> BatchPlan:
    """Per-rank and global batch, and the learning rate, for `config` over `world_size` ranks; lr_scaling scales
    config.lr by global batch / one process's batch, linearly (SGD) or by its square root (Adam)."""
    options = options or DDPOptions()
    positive_int("world_size", world_size, why=" (the number of processes)")
    per_rank = config.batch_size
    if options.batch == "global":
        if config.batch_size % world_size:
            raise ValueError(f"TrainConfig.batch_size={config.batch_size} is not allowed with DDPOptions.batch="
                             f"'global' over {world_size} ranks: a multiple of {world_size}, so every rank gets "
                             f"an equal share")
        per_rank = config.batch_size // world_size
    global_batch = per_rank * config.grad_accum_steps * world_size
    factor = global_batch / (config.batch_size * config.grad_accum_steps)
    scale = {"none": 1.0, "linear": factor, "sqrt": math.sqrt(factor)}[options.lr_scaling]
    return BatchPlan(world_size, per_rank, config.grad_accum_steps, global_batch, config.lr, config.lr * scale)


def shard_indices(n: int, rank: int, world_size: int) -> list[int]:
    """Every world_size-th of n indices from rank, n // world_size on each, so no rank runs out of batches first."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} is not allowed: 0 <= rank < world_size={world_size}")
    per_rank = n // world_size
    if per_rank == 0:
        raise ValueError(f"{n} training images cannot be shared by {world_size} ranks: raise train_images")
    return list(range(rank, per_rank * world_size, world_size))


def compare_across_ranks(vectors: Sequence[Any]) -> dict[str, Any]:
    """Each rank's flat tensor against rank 0's: max |difference|, checksums, bit-for-bit `identical` or not."""
    ref = vectors[0].double()
    diffs = [float((v.double() - ref).abs().max()) if v.numel() else 0.0 for v in vectors]
    return {"max_abs_diff": max(diffs), "per_rank_max_abs_diff": diffs,
            "checksums": [float(v.double().sum()) for v in vectors],
            "identical": all(torch.equal(v, vectors[0]) for v in vectors), "elements": int(vectors[0].numel())}


def window_throughput(images_per_step: int, window_steps: Sequence[int],
                      seconds_per_rank: Sequence[Sequence[float]]) -> list[float]:
    """Images/s of each timed window, all ranks together: the slowest rank's time sets the pace."""
    out = []
    for i, steps in enumerate(window_steps):
        slowest = max(rank_seconds[i] for rank_seconds in seconds_per_rank)
        out.append(images_per_step * steps / slowest)
    return out


@dataclass
class Rank:
    rank: int
    world: int
    local_rank: int
    device: Any  # torch.device
    backend: str


def _flat(tensors: Sequence[Any]):
    parts = [t.detach().reshape(-1).to(torch.float64) for t in tensors]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)


def _gather_compare(vec, ctx: Rank) -> dict[str, Any]:
    """Each rank's flattened tensor gathered on every rank, then compared (collective: all ranks call it)."""
    import torch.distributed as dist

    vec = vec.to(ctx.device)
    gathered = [torch.empty_like(vec) for _ in range(ctx.world)]
    dist.all_gather(gathered, vec)
    return compare_across_ranks([g.cpu() for g in gathered])


class DDPMode:
    """fastlab.harness.Parallel for DistributedDataParallel: one instance per rank and job."""

    def __init__(self, ctx: Rank, options: DDPOptions, plan: BatchPlan) -> None:
        self.ctx, self.options, self.plan = ctx, options, plan
        self.rank, self.world, self.no_sync = ctx.rank, ctx.world, options.no_sync
        self.evaluates = ctx.rank == 0
        # SyncBatchNorm works on GPU modules only: elsewhere each rank keeps its own statistics (a no-op, in finish)
        self.sync_batchnorm = options.sync_batchnorm and ctx.device.type == "cuda"
        self.bucket_cap_mb = options.bucket_cap_mb
        self.calls = self.bytes = 0  # gradient all-reduces (buckets) and their bytes, counted by a comm hook
        self.calls_timed = self.bytes_timed = 0  # the counts when the timed steps began

    def watch(self, model) -> None:
        """Before the first step: the parameters as DDP broadcast them, and a comm hook that counts the all-reduces."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        def counting_allreduce_hook(state, bucket):  # unannotated: DDP checks annotations against GradBucket
            buf = bucket.buffer()
            self.calls += 1
            self.bytes += buf.numel() * buf.element_size()
            return default_hooks.allreduce_hook(state, bucket)  # DDP's usual all-reduce (average)

        self.start_params = _flat(list(model.module.parameters())).cpu()
        model.register_comm_hook(None, counting_allreduce_hook)

    def shard(self, array: Any) -> Any:
        """This rank's part of an array of the whole training set."""
        return array[shard_indices(len(array), self.ctx.rank, self.ctx.world)]

    def agree(self, flag: bool) -> bool:
        import torch.distributed as dist

        t = torch.tensor([float(flag)], device=self.ctx.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def on_step(self, cfg: TrainConfig, crash_rank: int | None, crash_step: int) -> Callable[[int, int], None]:
        """Counts the all-reduces of the timed steps; raises on the chosen rank and step (--crash-rank)."""

        def hook(done: int, total: int) -> None:
            if done == cfg.warmup_steps:
                self.calls_timed, self.bytes_timed = self.calls, self.bytes
            if crash_rank == self.ctx.rank and done == crash_step + 1:
                raise RuntimeError(f"deliberate crash on rank {crash_rank} at step {crash_step} "
                                   f"(--crash-rank/--crash-step)")

        return hook

    def finish(self, net, res: RunResult) -> None:
        """After the steps, on every rank: do the replicas agree, and what did communication cost."""
        ctx, plan = self.ctx, self.plan
        if self.options.sync_batchnorm and not self.sync_batchnorm:
            res.no_ops["sync_batchnorm"] = (f"SyncBatchNorm works only on GPU modules in torch {torch.__version__}; "
                                            f"each rank normalised with its own batch statistics")
        cfg = res.config
        timed_steps = max(res.steps_done - cfg["warmup_steps"], 1)
        params = _gather_compare(_flat(list(net.parameters())), ctx)
        params["max_change_from_start"] = float((_flat(list(net.parameters())).cpu() - self.start_params).abs().max())
        buffers = _gather_compare(_flat([b for b in net.buffers() if b.is_floating_point()]), ctx)
        res.extras["ddp"] = {
            "world_size": ctx.world, "rank": ctx.rank, "backend": ctx.backend, "options": self.options.to_dict(),
            "per_rank_batch": plan.per_rank_batch, "grad_accum_steps": plan.grad_accum_steps,
            "global_batch": plan.global_batch, "base_lr": plan.base_lr, "lr": plan.lr,
            "allreduce_calls_per_step": (self.calls - self.calls_timed) / timed_steps,
            "allreduce_mb_per_step": (self.bytes - self.bytes_timed) / timed_steps / 2**20,
            "gradient_mb": sum(p.numel() * p.element_size() for p in net.parameters()) / 2**20,
            "parameters": params, "buffers": buffers, "sync_batchnorm_used": self.sync_batchnorm,
        }
