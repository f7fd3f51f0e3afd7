"""DistributedDataParallel (DDP) under torchrun, as a reader runs it. Each rank trains fastlab's one loop
(fastlab.training.train) in DDP mode (fastlab.parallel.DDPMode), measured by its watch, and writes what it measured
to OUT/rank<r>.json; `read_ranks(OUT)` reads them back as one result. Every TrainConfig field is a flag:

    torchrun --standalone --nproc-per-node 2 -m fastlab.distributed --profile smoke --out ddp-out

torchrun starts the ranks, gives each its RANK / LOCAL_RANK / WORLD_SIZE and rendezvous, and stops them all when
one fails; fastlab adds only what torchrun does not do: the ranks' results, read and combined.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime as _dt
import os
import signal
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .clocks import window_ends
from .config import PROFILES, TrainConfig, add_config_flags, config_for, field_names
from .parallel import BACKENDS, BATCH_MODES, LR_SCALINGS, DDPMode, DDPOptions, Rank, plan_batches, window_throughput
from .profiles import profile_of
from .results import RunResult, load_document, save_results


class DistributedRunError(RuntimeError):
    """A DDP run whose ranks did not all finish: names the first failing rank and what it said."""

    def __init__(self, message: str, *, rank: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank


@dataclass
class DDPRun:
    """What one DDP run measured: the whole job, and each rank's own measurement (its share of the images)."""

    result: RunResult  # all ranks together: global throughput, rank 0's losses and accuracy
    ranks: list[RunResult]

    @property
    def parameters(self) -> dict[str, Any]:
        return self.result.extras["ddp"]["parameters"]


# ------------------------------------------------------------------ reading the ranks' results back


def rank_file(out: str | os.PathLike, rank: int) -> Path:
    return Path(out) / f"rank{rank}.json"


def read_ranks(out: str | os.PathLike, label: str = "") -> DDPRun:
    """The ranks' results in `out` as one DDPRun, labelled `label` (else as the ranks were); DistributedRunError, naming the first failing rank, where a rank
    failed or wrote nothing (torchrun stops the others when one fails)."""
    paths = sorted(Path(out).glob("rank[0-9]*.json"), key=lambda p: p.stat().st_mtime_ns)  # the first written first
    docs = {int(p.stem[4:]): load_document(p) for p in paths}
    if not docs:
        raise DistributedRunError(f"no rank wrote a result in {out}: torchrun's own output says why")
    meta = next(iter(docs.values()))["meta"]
    world, label = meta["world_size"], label or meta.get("label", "")
    ranks = {r: RunResult.from_dict(d["results"][0]) for r, d in docs.items()}
    failed = [r for r in ranks if ranks[r].status == "failed"]  # the first to fail is the cause, the rest lost a peer
    if failed or len(ranks) < world:
        first = failed[0] if failed else None
        said = f"rank {first} failed: {ranks[first].error}" if first is not None else "a rank failed"
        missing = sorted(set(range(world)) - set(ranks))
        if missing:
            said += f"; rank(s) {', '.join(map(str, missing))} wrote no result (stopped by torchrun)"
        raise DistributedRunError(said, rank=first)
    ordered = [ranks[r] for r in range(world)]
    return DDPRun(combine(ordered, label or f"DDP x{world} ({ordered[0].extras['ddp']['backend']})"), ordered)


def combine(rank_results: Sequence[RunResult], label: str) -> RunResult:
    """The whole job as one RunResult: global images per step over the slowest rank's window times; losses,
    accuracy and per-step lists are rank 0's, peak memory the largest of any one process."""
    first = rank_results[0]
    ddp = dict(first.extras["ddp"])
    ddp.pop("rank")
    ddp["per_rank_throughput"] = [r.throughput.median for r in rank_results]
    n_windows = min(len(r.window_seconds) for r in rank_results)
    cfg = first.config
    steps = list(window_ends(cfg["warmup_steps"], cfg["steps"], cfg["windows"]).values())[:n_windows]
    seconds = [r.window_seconds[:n_windows] for r in rank_results]
    env = dict(first.env, world_size=ddp["world_size"], backend=ddp["backend"])
    statuses = {r.status for r in rank_results}
    return RunResult(
        config=cfg, label=label, status="time_limited" if "time_limited" in statuses else first.status,
        error=first.error, diverged_step=first.diverged_step, last_finite_loss=first.last_finite_loss,
        steps_done=min(r.steps_done for r in rank_results), images_per_step=ddp["global_batch"],
        window_throughput=window_throughput(ddp["global_batch"], steps, seconds),
        warmup_seconds=max(r.warmup_seconds for r in rank_results), timed_seconds=sum(map(max, zip(*seconds))),
        step_seconds=first.step_seconds, data_wait_seconds=first.data_wait_seconds,
        copy_seconds=first.copy_seconds, losses=first.losses,
        eval_accuracy=first.eval_accuracy, eval_seconds=first.eval_seconds,
        peak_memory_mb=max(r.peak_memory_mb for r in rank_results), memory_kind=first.memory_kind,
        memory_trace_mb=first.memory_trace_mb, no_ops=first.no_ops, env=env, dataset=first.dataset,
        window_seconds=[max(s) for s in zip(*seconds)], extras={"ddp": ddp})


def flags(config: TrainConfig, options: DDPOptions | None = None) -> list[str]:
    """The command-line flags that make this module train `config` with `options`: its profile, and each field
    and option that differs from the profile's and the default."""
    args = ["--profile", config.profile]
    for name, value in config_for(config.profile).diff(config).items():
        args += ["--" + name.replace("_", "-"), "none" if value is None else str(value).lower()
                 if isinstance(value, bool) else str(value)]
    given, default = (options or DDPOptions()).to_dict(), DDPOptions().to_dict()
    for name in ("batch", "lr_scaling", "backend"):
        if given[name] != default[name]:
            args += ["--" + name.replace("_", "-"), given[name]]
    if given["sync_batchnorm"]:
        args.append("--sync-batchnorm")
    if not given["no_sync"]:
        args.append("--no-no-sync")
    return args


# ------------------------------------------------------------------ one rank (this module, under torchrun)


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


def _train(config: TrainConfig, options: DDPOptions, label: str, ctx: Rank, crash_rank: int | None,
           crash_step: int) -> RunResult:
    """Train on this rank through fastlab's one loop, in DDP mode. Returns this rank's RunResult."""
    import torch.distributed as dist

    from .data import load_images
    from .harness import TrainingRun

    plan = plan_batches(config, ctx.world, options)
    cfg = config.replace(batch_size=plan.per_rank_batch, lr=plan.lr, device=str(ctx.device))
    # Rank 0 fetches the data first (it may download); the others then load what rank 0 got.
    names = [None]
    if ctx.rank == 0:
        names = [load_images(cfg.dataset, cfg.train_images, cfg.eval_images, allow_download=profile_of(cfg).downloads).name]
    dist.broadcast_object_list(names, src=0)
    images = load_images(names[0], cfg.train_images, cfg.eval_images, allow_download=False)
    mode = DDPMode(ctx, options, plan)
    if ctx.rank == 0:
        print(f"[rank 0] {label}: {plan.describe()}", flush=True)
    run = TrainingRun(cfg, f"rank {ctx.rank}", None, images, False, None, mode.on_step(cfg, crash_rank, crash_step),
                      parallel=mode)
    return run.execute()


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="torchrun --standalone --nproc-per-node N -m fastlab.distributed",
                                description="One rank of a DDP run (start it with torchrun).")
    p.add_argument("--out", default="ddp-results", help="folder each rank writes rank<r>.json in (default: ddp-results)")
    p.add_argument("--profile", choices=PROFILES, help="the profile to train (default: the active one)")
    p.add_argument("--label", default="", help="the result's label")
    p.add_argument("--batch", choices=BATCH_MODES, default="per_rank", help="DDPOptions.batch")
    p.add_argument("--lr-scaling", choices=LR_SCALINGS, default="none", help="DDPOptions.lr_scaling")
    p.add_argument("--sync-batchnorm", action="store_true", help="DDPOptions.sync_batchnorm")
    p.add_argument("--no-no-sync", dest="no_sync", action="store_false",
                   help="all-reduce on every micro-batch (the pitfall DDPOptions.no_sync avoids)")
    p.add_argument("--backend", choices=BACKENDS, default="auto", help="DDPOptions.backend")
    p.add_argument("--crash-rank", type=int, default=None, help="a demonstration: this rank raises at --crash-step")
    p.add_argument("--crash-step", type=int, default=0)
    p.add_argument("--collective-timeout", type=int, default=300,
                   help="seconds a collective may wait for the other ranks before it fails")
    add_config_flags(p)
    return p.parse_args(argv)


def _config_from_args(args: argparse.Namespace) -> tuple[TrainConfig, DDPOptions]:
    changes = {k: v for k, v in vars(args).items() if k in field_names() - {"profile"} and v is not None}
    options = DDPOptions(batch=args.batch, lr_scaling=args.lr_scaling, sync_batchnorm=args.sync_batchnorm,
                         no_sync=args.no_sync, backend=args.backend)
    return config_for(args.profile, **changes), options


def _rank_env() -> tuple[int, int, int]:
    missing = [k for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK") if k not in os.environ]
    if missing:
        raise SystemExit(f"fastlab.distributed: {', '.join(missing)} not set; start it with torchrun "
                         f"(torchrun --standalone --nproc-per-node 2 -m fastlab.distributed ...)")
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])


def _ends_with_torchrun() -> None:
    """SIGTERM from the kernel when torchrun ends (Linux): torchrun starts its ranks in sessions of their own, so a
    torchrun killed outright (a timeout, a notebook's interrupt) would otherwise leave them running."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG


def main(argv: Sequence[str] | None = None) -> int:
    """One rank: join the process group, train, write OUT/rank<r>.json (a failure too, in one line, then raise)."""
    import torch.distributed as dist

    args = _parse_args(argv)
    rank, world, local_rank = _rank_env()
    if sys.platform.startswith("linux"):
        _ends_with_torchrun()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"kind": "fastlab.distributed", "rank": rank, "world_size": world, "label": args.label}
    config = None
    try:
        config, options = _config_from_args(args)
        device, backend = _pick_device(config, local_rank, options.backend)
        kwargs: dict[str, Any] = {"timeout": _dt.timedelta(seconds=args.collective_timeout)}
        if device.type == "cuda":
            kwargs["device_id"] = device  # binds the process group to this GPU (eager NCCL init)
        dist.init_process_group(backend, **kwargs)
        ctx = Rank(rank, world, local_rank, device, backend)
        mine = _train(config, options, args.label or f"DDP x{world} ({backend})", ctx, args.crash_rank, args.crash_step)
        save_results(rank_file(out, rank), [mine], meta=meta)
        if rank == 0:
            print(f"[rank 0] {mine.summary()}", flush=True)
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as e:
        # this rank's own account in one line, which read_ranks names (torchrun's report is for people)
        failed = RunResult(config=config.to_dict() if config else {}, label=f"rank {rank}", status="failed",
                           error=traceback.format_exception_only(e)[-1].strip())
        with contextlib.suppress(OSError):
            save_results(rank_file(out, rank), [failed], meta=meta)
        raise
    return 0


if __name__ == "__main__":
    from torch.distributed.elastic.multiprocessing.errors import record

    sys.exit(record(main)())
