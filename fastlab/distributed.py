"""Data-parallel training with DistributedDataParallel (DDP), launched by torchrun.

What runs where: `torchrun --nproc-per-node N` starts N copies of this module (one process per GPU, or per
CPU core). Each process is a *rank*: it builds the same model from the same seed, trains on its own shard
of the data, and in backward DDP averages the gradients of all ranks with an all-reduce (nccl between GPUs,
gloo between CPU processes), so every rank takes the same optimiser step and the replicas stay identical.

    per-rank batch = TrainConfig.batch_size (options.batch="per_rank"), or batch_size / N (batch="global")
    global batch   = per-rank batch x grad_accum_steps x N   (the images one optimiser step learns from)
    throughput     = global batch x steps in a window / the slowest rank's wall time for that window

Run it yourself (every TrainConfig field is a flag):

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m fastlab.distributed --profile smoke --out ddp-out

From Python (a notebook, a test) call `launch` / `run_ddp`: they build that command, run it with a timeout and
raise DistributedRunError naming the failing rank, its exit code and the log tail when a rank crashes.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as _dt
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import TrainConfig
from .results import RunResult, load_document, save_results

BATCH_MODES = ("per_rank", "global")
LR_SCALINGS = ("none", "linear", "sqrt")
BACKENDS = ("auto", "gloo", "nccl")
RESULT_LAYOUT = "results[0] is the whole job (all ranks); results[1:] are the ranks in order"


class DistributedRunError(RuntimeError):
    """A torchrun launch that failed or timed out; names the failing rank and carries the log tail."""

    def __init__(self, message: str, *, rank: int | None = None, exit_code: int | None = None,
                 timed_out: bool = False, log_tail: str = "") -> None:
        super().__init__(message)
        self.rank = rank
        self.exit_code = exit_code
        self.timed_out = timed_out
        self.log_tail = log_tail


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
        for name, allowed in (("batch", BATCH_MODES), ("lr_scaling", LR_SCALINGS), ("backend", BACKENDS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"DDPOptions.{name}={getattr(self, name)!r} is not allowed: choose one of "
                                 + ", ".join(repr(a) for a in allowed))
        for name in ("sync_batchnorm", "no_sync"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"DDPOptions.{name}={getattr(self, name)!r} is not allowed: True or False")
        cap = self.bucket_cap_mb
        if isinstance(cap, bool) or not isinstance(cap, (int, float)) or cap <= 0:
            raise ValueError(f"DDPOptions.bucket_cap_mb={cap!r} is not allowed: a number > 0")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class DDPJob:
    """One training run under DDP: what one launch's ranks train together."""

    config: TrainConfig
    options: DDPOptions = DDPOptions()
    label: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config.to_dict(), "options": self.options.to_dict(), "label": self.label}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DDPJob:
        return cls(TrainConfig.from_dict(data["config"]), DDPOptions(**data.get("options", {})), data.get("label", ""))


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
    """Per-rank and global batch, and the learning rate, for `config` spread over `world_size` ranks.

    The reference batch is what one process would use: batch_size x grad_accum_steps. lr_scaling scales
    config.lr by (global batch / reference batch): linearly (Goyal et al.'s rule for SGD) or by its square
    root (often used with Adam). In "global" mode the global batch equals the reference, so lr stays.
    """
    options = options or DDPOptions()
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size={world_size!r} is not allowed: an integer >= 1 (the number of processes)")
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
    """This rank's share of n examples for the device-resident loader: every world_size-th index from rank.

    Every rank gets the same number (n // world_size; the remainder is left out) so that no rank runs out of
    batches before the others, and the shards are disjoint.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} is not allowed: 0 <= rank < world_size={world_size}")
    per_rank = n // world_size
    if per_rank == 0:
        raise ValueError(f"{n} training images cannot be shared by {world_size} ranks: raise train_images")
    return list(range(rank, per_rank * world_size, world_size))


def compare_across_ranks(vectors: Sequence[Any]) -> dict[str, Any]:
    """How far each rank's flattened tensor is from rank 0's: max |difference|, and per-rank checksums.

    `identical` means bit-for-bit equal, which is what DDP promises for parameters: every rank applies
    the same averaged gradient to the same starting weights.
    """
    if not vectors:
        raise ValueError("compare_across_ranks needs one tensor per rank, got none")
    import torch

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


# ------------------------------------------------------------------ the launcher (called from Python)


@dataclass
class DDPRun:
    """What one DDP job measured: the whole job, each rank, and how the launch went."""

    result: RunResult  # all ranks together: global throughput, rank 0's losses and accuracy
    ranks: list[RunResult]  # each rank's own measurement (its share of the images)
    path: Path | None = None
    log: str = ""
    command: list[str] = field(default_factory=list)
    launch_seconds: float = 0.0  # wall time of the whole launch: process start, imports, every job

    @property
    def parameters(self) -> dict[str, Any]:
        return self.result.extras["ddp"]["parameters"]

    @property
    def buffers(self) -> dict[str, Any]:
        return self.result.extras["ddp"]["buffers"]

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> DDPRun:
        doc = load_document(path)
        results = [RunResult.from_dict(r) for r in doc["results"]]
        return cls(results[0], results[1:], Path(path))


def default_nproc() -> int:
    """One process per GPU when there are at least two, else two CPU processes."""
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return n if n >= 2 else 2


def torchrun_command(nproc: int, worker_args: Sequence[str]) -> list[str]:
    """The torchrun command line, run by this interpreter (so the venv's torch and fastlab are used).

    --standalone starts a rendezvous store on a free port, so launches running side by side never collide;
    --max-restarts 0: a crashed rank ends the job instead of restarting the group.
    """
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc={nproc!r} is not allowed: an integer >= 1 (processes to start)")
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "--max-restarts=0", "--monitor-interval=0.5", "-m", "fastlab.distributed", *worker_args]


def launch(jobs: Sequence[DDPJob], nproc: int | None = None, *, out_dir: str | os.PathLike | None = None,
           timeout_s: float = 300.0, crash_rank: int | None = None, crash_step: int = 0,
           stop: threading.Event | None = None, quiet: bool = True) -> list[DDPRun]:
    """Run `jobs` one after another in one torchrun launch of `nproc` processes; one DDPRun per job.

    Processes start once (importing torch costs seconds per process), then train each job in turn.
    timeout_s bounds the whole launch: past it the processes are killed and DistributedRunError is raised,
    as it is when any rank fails (naming the rank, its exit code and the end of the log).
    crash_rank / crash_step make that rank raise at that step (to see what a crash looks like).
    stop: set it from another thread to kill the launch (raises DistributedRunError).
    """
    if not jobs:
        raise ValueError("launch needs at least one DDPJob")
    nproc = default_nproc() if nproc is None else nproc
    if crash_rank is not None and not 0 <= crash_rank < nproc:
        raise ValueError(f"crash_rank={crash_rank!r} is not allowed: a rank from 0 to {nproc - 1}, or None")
    if timeout_s <= 0:
        raise ValueError(f"timeout_s={timeout_s!r} is not allowed: a number of seconds > 0")
    out = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="fastlab-ddp-"))
    out.mkdir(parents=True, exist_ok=True)
    for stale in [*out.glob("job[0-9]*.json"), *out.glob("rank*.error")]:
        stale.unlink()
    jobs_file = out / "jobs.json"
    jobs_file.write_text(json.dumps([j.to_dict() for j in jobs], indent=1))
    args = ["--jobs", str(jobs_file), "--out", str(out), "--collective-timeout", str(max(30, int(timeout_s)))]
    if crash_rank is not None:
        args += ["--crash-rank", str(crash_rank), "--crash-step", str(crash_step)]
    cmd = torchrun_command(nproc, args)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if not _uses_cuda(jobs[0].config):
        # N processes share the cores: one thread each, or they fight over them (torchrun would set this too).
        env.setdefault("OMP_NUM_THREADS", "1")
    log_path = out / "launch.log"
    t0 = time.perf_counter()
    code, timed_out, stopped = run_with_timeout(cmd, log_path, timeout_s, env=env, stop=stop)
    seconds = time.perf_counter() - t0
    log = log_path.read_text(errors="replace")
    if code != 0 or timed_out or stopped:
        raise _launch_error(out, log, code, timed_out, stopped, timeout_s, nproc)
    runs = []
    for i in range(len(jobs)):
        path = out / f"job{i}.json"
        if not path.is_file():
            raise DistributedRunError(f"torchrun exited 0 but wrote no result for job {i} ({path}); log tail:\n"
                                      f"{_tail(log)}", exit_code=0, log_tail=_tail(log))
        run = DDPRun.from_file(path)
        run.log, run.command, run.launch_seconds = log, cmd, seconds
        runs.append(run)
    if not quiet:
        print(f"torchrun: {nproc} process(es), {len(jobs)} job(s), {seconds:.1f} s wall time (start-up included)")
    return runs


def run_ddp(config: TrainConfig, nproc: int | None = None, *, options: DDPOptions | None = None,
            label: str = "", **launch_kwargs: Any) -> DDPRun:
    """One DDP job in one launch (see `launch` for the keyword arguments)."""
    return launch([DDPJob(config, options or DDPOptions(), label)], nproc, **launch_kwargs)[0]


def run_with_timeout(cmd: Sequence[str], log_path: Path, timeout_s: float, *, env: dict[str, str] | None = None,
                     stop: threading.Event | None = None) -> tuple[int | None, bool, bool]:
    """Run cmd with its output in log_path; kill its whole process group past timeout_s or when stop is set.

    Returns (exit code, timed out, stopped). The command runs in a new session, so killing the group also
    ends the worker processes torchrun started, not just torchrun.
    """
    deadline = time.monotonic() + timeout_s
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            while True:
                try:
                    return proc.wait(timeout=0.2), False, False
                except subprocess.TimeoutExpired:
                    pass
                if stop is not None and stop.is_set():
                    _kill_group(proc)
                    return proc.returncode, False, True
                if time.monotonic() > deadline:
                    _kill_group(proc)
                    return proc.returncode, True, False
        except BaseException:  # KeyboardInterrupt in a notebook: never leave the workers behind
            _kill_group(proc)
            raise


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the process group (torchrun forwards it to its workers), then SIGKILL what is left."""
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=grace)
            # torchrun may be gone while a worker lingers: sweep the group once more
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue
        return


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _launch_error(out: Path, log: str, code: int | None, timed_out: bool, stopped: bool, timeout_s: float,
                  nproc: int) -> DistributedRunError:
    tail = _tail(log)
    if stopped:
        return DistributedRunError(f"the DDP launch was stopped; its {nproc} processes were killed", exit_code=code,
                                   log_tail=tail)
    # torchrun's root-cause report names the first rank to fail; the others usually fail after it, when
    # their next all-reduce finds the peer gone ("Connection closed by peer")
    # (after a timeout, the report only says who our SIGTERM reached first: ignore it then)
    root = log[log.find("Root Cause"):] if "Root Cause" in log and not timed_out else ""
    m = re.search(r"rank\s*:\s*(\d+)", root)
    rank = int(m.group(1)) if m else None
    m = re.search(r"exitcode\s*:\s*(-?\d+)", root)
    rank_code = int(m.group(1)) if m else None
    reports = {int(p.stem[4:]): p for p in out.glob("rank*.error")}  # each failing worker's own traceback
    if rank is None and reports:  # no usable report from torchrun: the earliest error file
        rank = min(reports, key=lambda r: reports[r].stat().st_mtime_ns)
    why = ""
    if rank in reports:
        lines = reports[rank].read_text(errors="replace").strip().splitlines()
        why = lines[-1] if lines else ""
    if timed_out:
        head = f"the DDP launch of {nproc} processes did not finish within timeout_s={timeout_s:g} s and was killed"
        if rank is not None:
            head += f"; rank {rank} had failed ({why})"
        return DistributedRunError(head + f"\nlog tail:\n{tail}", rank=rank, exit_code=code, timed_out=True,
                                   log_tail=tail)
    who = f"rank {rank}" if rank is not None else "a rank (which one is not in the log)"
    detail = f" with exit code {rank_code}" if rank_code is not None else ""
    return DistributedRunError(f"{who} failed{detail}{': ' + why if why else ''}; torchrun exited with code {code} "
                               f"and stopped the other ranks.\nlog tail:\n{tail}", rank=rank, exit_code=code,
                               log_tail=tail)


def _uses_cuda(config: TrainConfig) -> bool:
    import torch

    return config.device != "cpu" and torch.cuda.is_available()


# ------------------------------------------------------------------ the worker (one per rank, under torchrun)


@dataclass
class _Rank:
    rank: int
    world: int
    local_rank: int
    device: Any  # torch.device
    backend: str


def _pick_device(config: TrainConfig, local_rank: int, backend: str):
    import torch

    if config.device == "mps":
        raise ValueError("TrainConfig.device='mps' is not allowed with DDP: use 'cpu' (gloo) or 'cuda' (nccl)")
    if config.device != "cpu" and torch.cuda.is_available():
        if local_rank >= torch.cuda.device_count():
            raise ValueError(f"rank with local_rank {local_rank} has no GPU: this machine has "
                             f"{torch.cuda.device_count()}; launch at most that many processes per node")
        device = torch.device("cuda", local_rank)  # one GPU per process: cuda:N in the config is replaced
        torch.cuda.set_device(device)
        return device, ("nccl" if backend == "auto" else backend)
    if config.device.startswith("cuda"):
        raise ValueError(f"TrainConfig.device={config.device!r} is not allowed here: CUDA is not available")
    if backend == "nccl":
        raise ValueError("DDPOptions.backend='nccl' is not allowed on CPU: nccl needs CUDA; use 'gloo' or 'auto'")
    return torch.device("cpu"), "gloo"


def _flat(tensors: Sequence[Any]):
    import torch

    parts = [t.detach().reshape(-1).to(torch.float64) for t in tensors]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)


def _gather_compare(vec, ctx: _Rank) -> dict[str, Any]:
    """Each rank's flattened tensor gathered on every rank, then compared (collective: all ranks call it)."""
    import torch
    import torch.distributed as dist

    vec = vec.to(ctx.device)
    gathered = [torch.empty_like(vec) for _ in range(ctx.world)]
    dist.all_gather(gathered, vec)
    return compare_across_ranks([g.cpu() for g in gathered])


class _CommCounter:
    """Counts the gradient all-reduces DDP launches and their bytes (via a communication hook)."""

    def __init__(self) -> None:
        self.calls = 0
        self.bytes = 0

    def hook(self):
        """A DDP comm hook that counts each bucket, then does DDP's usual all-reduce (average) of it."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        def counting_allreduce_hook(state, bucket):  # unannotated: DDP checks annotations against GradBucket
            buf = bucket.buffer()
            self.calls += 1
            self.bytes += buf.numel() * buf.element_size()
            return default_hooks.allreduce_hook(state, bucket)

        return counting_allreduce_hook


def _epochs(loader, sampler) -> Iterator:
    """Batches epoch after epoch; DistributedSampler.set_epoch reshuffles each epoch (same order on all ranks)."""
    epoch = 0
    while True:
        if sampler is not None:
            sampler.set_epoch(epoch)
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise ValueError("a rank's share of the training set is smaller than one batch: lower batch_size "
                             "or raise train_images")
        epoch += 1


def _train_job(job: DDPJob, ctx: _Rank, crash_rank: int | None, crash_step: int) -> RunResult:
    """Train one job on this rank; collective calls keep the ranks in step. Returns this rank's RunResult."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    from . import builders
    from .data import CifarLikeDataset, DeviceLoader, load_images
    from .measure import MemoryMeter, environment, now, synchronize
    from .models import build_model
    from .train import window_ends

    plan = plan_batches(job.config, ctx.world, job.options)
    cfg = job.config.replace(batch_size=plan.per_rank_batch, lr=plan.lr, device=str(ctx.device))
    dev = ctx.device
    # fastlab.builders gives the same optimiser, scheduler, autocast and backend-flag handling (and no-op notes)
    # as fastlab.run.
    res = RunResult(config=cfg.to_dict(), label=f"rank {ctx.rank}", env=environment(dev, cfg.profile),
                    images_per_step=plan.per_rank_batch * plan.grad_accum_steps)
    no_ops = res.no_ops
    with builders.backend_flags(cfg, dev, no_ops):
        # Rank 0 fetches the data first (it may download); the others then load what rank 0 got.
        names = [None]
        if ctx.rank == 0:
            images = load_images(cfg.dataset, cfg.train_images, cfg.eval_images, allow_download=cfg.profile != "smoke")
            names = [images.name]
        dist.broadcast_object_list(names, src=0)
        if ctx.rank != 0:
            images = load_images(names[0], cfg.train_images, cfg.eval_images, allow_download=False)
        res.dataset = {"name": images.name, "synthetic": images.synthetic, "source": images.source,
                       "train_images": len(images.train_labels), "eval_images": len(images.eval_labels)}

        sampler = None
        if cfg.loader == "device":
            for knob in ("pin_memory", "non_blocking"):
                if getattr(cfg, knob):
                    no_ops[knob] = "the device loader keeps the data on the device: there is no copy to speed up"
            idx = shard_indices(len(images.train_labels), ctx.rank, ctx.world)
            # a different seed per rank: each rank augments its own shard differently
            loader = DeviceLoader(images.train_images[idx], images.train_labels[idx], batch_size=cfg.batch_size,
                                  train=True, device=dev, seed=cfg.seed + ctx.rank, channels_last=cfg.channels_last)
        else:
            if dev.type != "cuda":
                for knob in ("pin_memory", "non_blocking"):
                    if getattr(cfg, knob):
                        no_ops[knob] = f"pinned memory and async copies only help copies to a CUDA GPU; this is {dev.type}"
            dataset = CifarLikeDataset(images.train_images, images.train_labels, train=True)
            sampler = DistributedSampler(dataset, num_replicas=ctx.world, rank=ctx.rank, shuffle=True, seed=cfg.seed,
                                         drop_last=True)
            extra: dict[str, Any] = {}
            if cfg.num_workers:
                extra = {"persistent_workers": cfg.persistent_workers}
                if cfg.prefetch_factor is not None:
                    extra["prefetch_factor"] = cfg.prefetch_factor
            loader = DataLoader(dataset, batch_size=cfg.batch_size, sampler=sampler, drop_last=True,
                                num_workers=cfg.num_workers, pin_memory=cfg.pin_memory and dev.type == "cuda", **extra)
        batches = _epochs(loader, sampler)

        torch.manual_seed(cfg.seed)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
        net = build_model(cfg.model)
        sync_bn = job.options.sync_batchnorm
        if sync_bn and dev.type != "cuda":
            no_ops["sync_batchnorm"] = (f"SyncBatchNorm works only on GPU modules in torch {torch.__version__}; "
                                        f"each rank normalised with its own batch statistics")
            sync_bn = False
        if sync_bn:
            net = nn.SyncBatchNorm.convert_sync_batchnorm(net)
        net = net.to(dev)
        if cfg.channels_last:
            net = net.to(memory_format=torch.channels_last)
        model = DDP(net, device_ids=[dev.index] if dev.type == "cuda" else None,
                    bucket_cap_mb=job.options.bucket_cap_mb)
        comm = _CommCounter()
        model.register_comm_hook(None, comm.hook())
        opt = builders.build_optimizer(cfg, model.parameters(), no_ops)
        total = cfg.warmup_steps + cfg.steps
        sched = builders.build_scheduler(cfg, opt, total)
        compiled = builders.compile_model(cfg, model, dev, no_ops)
        amp_dtype = builders.amp_dtype(cfg, dev, no_ops)
        scaler = torch.amp.GradScaler(dev.type, enabled=amp_dtype == torch.float16)
        start_params = _flat(list(net.parameters())).cpu()

        meter = MemoryMeter(dev)
        res.memory_kind = meter.kind
        loss_fn = nn.CrossEntropyLoss()
        non_blocking = cfg.non_blocking and cfg.pin_memory and dev.type == "cuda"
        ends = window_ends(cfg.warmup_steps, cfg.steps, cfg.windows)
        window_seconds: list[float] = []
        calls_timed = bytes_timed = 0
        model.train()
        t_start = window_start = now(dev)
        for step in range(total):
            if crash_rank == ctx.rank and step == crash_step:
                raise RuntimeError(f"deliberate crash on rank {ctx.rank} at step {step} (--crash-rank/--crash-step)")
            if step == cfg.warmup_steps:
                calls_timed, bytes_timed = comm.calls, comm.bytes
            t0 = time.perf_counter()
            wait = 0.0
            opt.zero_grad(set_to_none=cfg.set_to_none)
            for micro in range(cfg.grad_accum_steps):
                tw = time.perf_counter()
                x, y = next(batches)
                x, y = x.to(dev, non_blocking=non_blocking), y.to(dev, non_blocking=non_blocking)
                if cfg.channels_last:
                    x = x.contiguous(memory_format=torch.channels_last)
                wait += time.perf_counter() - tw
                last = micro == cfg.grad_accum_steps - 1
                # no_sync: gradients just accumulate locally; only the last micro-batch's backward all-reduces
                sync = model.no_sync() if job.options.no_sync and not last else contextlib.nullcontext()
                with sync:
                    with torch.autocast(dev.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
                        loss = loss_fn(compiled(x), y) / cfg.grad_accum_steps
                    scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            if sched is not None:
                sched.step()
            if ctx.rank == 0 and (step + 1) % cfg.log_every == 0:
                res.losses.append((step, loss.item() * cfg.grad_accum_steps))  # rank 0's micro-batch loss
            boundary = step + 1 == cfg.warmup_steps or step + 1 in ends
            if boundary:
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
                window_seconds.append(t1 - window_start)
                res.window_throughput.append(res.images_per_step * ends[step + 1] / (t1 - window_start))
                res.timed_seconds += t1 - window_start
                window_start = t1
            if boundary and cfg.max_seconds and step + 1 < total:
                # every rank must stop at the same step, or the others wait forever in the next all-reduce;
                # the budget counts timed steps only (warm-up and compile excluded), as in fastlab.run
                over = torch.tensor([float(res.timed_seconds > cfg.max_seconds)], device=dev)
                dist.all_reduce(over, op=dist.ReduceOp.MAX)
                if over.item():
                    res.status = "time_limited"
                    res.error = f"stopped at its max_seconds={cfg.max_seconds:g} budget after {res.steps_done} steps"
                    break
        synchronize(dev)
        timed_steps = max(res.steps_done - cfg.warmup_steps, 1)
        res.peak_memory_mb = meter.peak()
        params = _gather_compare(_flat(list(net.parameters())), ctx)
        params["max_change_from_start"] = float((_flat(list(net.parameters())).cpu() - start_params).abs().max())
        buffers = _gather_compare(_flat([b for b in net.buffers() if b.is_floating_point()]), ctx)
        if ctx.rank == 0:
            _evaluate(net, images, cfg, dev, res, amp_dtype)
        res.no_ops = dict(no_ops)
        res.extras["window_seconds"] = window_seconds
        res.extras["ddp"] = {
            "world_size": ctx.world, "rank": ctx.rank, "backend": ctx.backend, "options": job.options.to_dict(),
            "per_rank_batch": plan.per_rank_batch, "grad_accum_steps": plan.grad_accum_steps,
            "global_batch": plan.global_batch, "base_lr": plan.base_lr, "lr": plan.lr,
            "allreduce_calls_per_step": (comm.calls - calls_timed) / timed_steps,
            "allreduce_mb_per_step": (comm.bytes - bytes_timed) / timed_steps / 2**20,
            "gradient_mb": sum(p.numel() * p.element_size() for p in net.parameters()) / 2**20,
            "parameters": params, "buffers": buffers, "sync_batchnorm_used": sync_bn,
        }
        return res


def _evaluate(net: Any, images: Any, cfg: TrainConfig, dev: Any, res: RunResult, amp_dtype: Any) -> None:
    """Held-out accuracy of the trained replica (identical on every rank, so rank 0 alone measures it)."""
    import torch

    from .data import DeviceLoader
    from .measure import now

    loader = DeviceLoader(images.eval_images, images.eval_labels, batch_size=cfg.batch_size, train=False, device=dev,
                          channels_last=cfg.channels_last)
    net.eval()
    t0 = now(dev)
    correct = 0
    with torch.no_grad():
        for x, y in loader:
            with torch.autocast(dev.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
                correct += int((net(x).argmax(1) == y).sum())
    res.eval_accuracy = correct / len(images.eval_labels)
    res.eval_seconds = now(dev) - t0
    net.train()


def combine(rank_results: Sequence[RunResult], label: str) -> RunResult:
    """The whole job as one RunResult: global images per step over the slowest rank's window times.

    Losses, accuracy and the per-step lists are rank 0's; peak memory is the largest of any one process.
    """
    first = rank_results[0]
    ddp = dict(first.extras["ddp"])
    ddp.pop("rank")
    ddp["per_rank_throughput"] = [r.throughput.median for r in rank_results]
    windows = [len(r.extras["window_seconds"]) for r in rank_results]
    n_windows = min(windows)
    cfg = first.config
    steps = list(_window_steps(cfg["warmup_steps"], cfg["steps"], cfg["windows"]))[:n_windows]
    seconds = [r.extras["window_seconds"][:n_windows] for r in rank_results]
    env = dict(first.env, world_size=ddp["world_size"], backend=ddp["backend"])
    statuses = {r.status for r in rank_results}
    return RunResult(
        config=cfg, label=label, status="time_limited" if "time_limited" in statuses else first.status,
        error=first.error, steps_done=min(r.steps_done for r in rank_results), images_per_step=ddp["global_batch"],
        window_throughput=window_throughput(ddp["global_batch"], steps, seconds),
        warmup_seconds=max(r.warmup_seconds for r in rank_results), timed_seconds=sum(map(max, zip(*seconds))),
        step_seconds=first.step_seconds, data_wait_seconds=first.data_wait_seconds, losses=first.losses,
        eval_accuracy=first.eval_accuracy, eval_seconds=first.eval_seconds,
        peak_memory_mb=max(r.peak_memory_mb for r in rank_results), memory_kind=first.memory_kind,
        memory_trace_mb=first.memory_trace_mb, no_ops=first.no_ops, env=env, dataset=first.dataset,
        extras={"ddp": ddp, "window_seconds": [max(s) for s in zip(*seconds)]})


def _window_steps(warmup: int, steps: int, windows: int) -> list[int]:
    from .train import window_ends

    return list(window_ends(warmup, steps, windows).values())


def _write_error(out: Path, rank: int) -> None:
    """The failing rank's own account, which the launcher reads to name it (torchrun's report is for people)."""
    try:
        (out / f"rank{rank}.error").write_text(traceback.format_exc())
    except OSError:
        pass  # the launcher then falls back to torchrun's root-cause report


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    from .__main__ import add_config_flags
    from .config import PROFILES

    p = argparse.ArgumentParser(prog="python -m torch.distributed.run ... -m fastlab.distributed",
                                description="One rank of a DDP run (start it with torchrun).")
    p.add_argument("--jobs", help="a JSON file of DDPJob dicts (what fastlab.distributed.launch writes)")
    p.add_argument("--out", default="ddp-results",
                   help="folder for job<i>.json results (rank 0 writes them; default: ddp-results)")
    p.add_argument("--profile", choices=PROFILES, help="without --jobs: the profile to train (default: the active one)")
    p.add_argument("--label", default="", help="without --jobs: the result's label")
    p.add_argument("--batch", choices=BATCH_MODES, default="per_rank", help="DDPOptions.batch")
    p.add_argument("--lr-scaling", choices=LR_SCALINGS, default="none", help="DDPOptions.lr_scaling")
    p.add_argument("--sync-batchnorm", action="store_true", help="DDPOptions.sync_batchnorm")
    p.add_argument("--no-no-sync", dest="no_sync", action="store_false",
                   help="all-reduce on every micro-batch (the pitfall DDPOptions.no_sync avoids)")
    p.add_argument("--backend", choices=BACKENDS, default="auto", help="DDPOptions.backend")
    p.add_argument("--crash-rank", type=int, default=None, help="debug: this rank raises at --crash-step")
    p.add_argument("--crash-step", type=int, default=0)
    p.add_argument("--collective-timeout", type=int, default=300,
                   help="seconds a collective may wait for the other ranks before it fails")
    add_config_flags(p)
    return p.parse_args(argv)


def _jobs_from_args(args: argparse.Namespace) -> list[DDPJob]:
    if args.jobs:
        return [DDPJob.from_dict(d) for d in json.loads(Path(args.jobs).read_text())]
    from .config import config_for, field_names

    changes = {k: v for k, v in vars(args).items() if k in field_names() - {"profile"} and v is not None}
    options = DDPOptions(batch=args.batch, lr_scaling=args.lr_scaling, sync_batchnorm=args.sync_batchnorm,
                         no_sync=args.no_sync, backend=args.backend)
    return [DDPJob(config_for(args.profile, **changes), options, args.label)]


def _rank_env() -> tuple[int, int, int]:
    missing = [k for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK") if k not in os.environ]
    if missing:
        raise SystemExit(f"fastlab.distributed: {', '.join(missing)} not set; start it with torchrun "
                         f"(python -m torch.distributed.run --standalone --nproc-per-node 2 -m fastlab.distributed ...)"
                         f" or call fastlab.distributed.launch() from Python")
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])


def main(argv: Sequence[str] | None = None) -> int:
    """One rank: join the process group, train every job, rank 0 writes job<i>.json; errors are reported."""
    args = _parse_args(argv)
    rank, world, local_rank = _rank_env()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        return _main(args, rank, world, local_rank, out)
    except BaseException:
        _write_error(out, rank)
        raise


def _main(args: argparse.Namespace, rank: int, world: int, local_rank: int, out: Path) -> int:
    import torch.distributed as dist

    jobs = _jobs_from_args(args)
    backend = jobs[0].options.backend
    device, backend = _pick_device(jobs[0].config, local_rank, backend)
    kwargs: dict[str, Any] = {"timeout": _dt.timedelta(seconds=args.collective_timeout)}
    if device.type == "cuda":
        kwargs["device_id"] = device  # binds the process group to this GPU (eager NCCL init)
    dist.init_process_group(backend, **kwargs)
    ctx = _Rank(rank, world, local_rank, device, backend)
    for i, job in enumerate(jobs):
        label = job.label or f"DDP x{world} ({backend})"
        if rank == 0:
            plan = plan_batches(job.config, world, job.options)
            print(f"[rank 0] job {i}: {label}: {plan.describe()}", flush=True)
        mine = _train_job(job, ctx, args.crash_rank, args.crash_step)
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, mine.to_dict())
        if rank == 0:  # only rank 0 logs and writes results: N processes, one file
            ranks = [RunResult.from_dict(d) for d in gathered]
            whole = combine(ranks, label)
            meta = {"kind": "fastlab.distributed", "job": i, "layout": RESULT_LAYOUT, "world_size": world,
                    "backend": backend, "parameters": whole.extras["ddp"]["parameters"]}
            save_results(out / f"job{i}.json", [whole, *ranks], meta=meta)
            print(f"[rank 0] {whole.summary()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    from torch.distributed.elastic.multiprocessing.errors import record

    sys.exit(record(main)())
