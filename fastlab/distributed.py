"""DistributedDataParallel (DDP) runs: `launch` / `run_ddp` start torchrun's ranks, each training fastlab's one loop
in DDP mode (fastlab.parallel.DDPMode), and gather what they measured. Every TrainConfig field is a flag:

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m fastlab.distributed --profile smoke --out ddp-out
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import os
import re
import signal
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import TrainConfig, add_config_flags, positive_int
from .parallel import (
    BACKENDS,
    BATCH_MODES,
    LR_SCALINGS,
    DDPJob,
    DDPMode,
    DDPOptions,
    Rank,
    plan_batches,
    window_throughput,
)
from .processes import run_with_timeout
from .profiles import profile_of
from .results import RunResult, load_document, save_results

RESULT_LAYOUT = "results[0] is the whole job (all ranks); results[1:] are the ranks in order"


class DistributedRunError(RuntimeError):
    """A torchrun launch that failed or timed out; names the failing rank and carries the log tail."""

    def __init__(self, message: str, *, rank: int | None = None, exit_code: int | None = None,
                 timed_out: bool = False, log_tail: str = "", rank_exit_code: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.exit_code = exit_code  # torchrun's
        self.rank_exit_code = rank_exit_code  # the failing rank's: negative when a signal killed it
        self.timed_out = timed_out
        self.log_tail = log_tail


# ------------------------------------------------------------------ the launcher (called from Python)


@dataclass
class DDPRun:
    """What one DDP job measured: the whole job, each rank, and how the launch went."""

    result: RunResult  # all ranks together: global throughput, rank 0's losses and accuracy
    ranks: list[RunResult]  # each rank's own measurement (its share of the images)
    path: Path | None = None
    log: str = ""

    @property
    def parameters(self) -> dict[str, Any]:
        return self.result.extras["ddp"]["parameters"]


def default_nproc() -> int:
    """One process per GPU when there are at least two, else two CPU processes."""
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return n if n >= 2 else 2


def torchrun_command(nproc: int, worker_args: Sequence[str]) -> list[str]:
    """torchrun under this interpreter; --standalone picks a free port, --max-restarts=0: a crashed rank ends it."""
    positive_int("nproc", nproc, why=" (processes to start)")
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "--max-restarts=0", "--monitor-interval=0.5", "-m", "fastlab.distributed", *worker_args]


def launch(jobs: Sequence[DDPJob], nproc: int | None = None, *, out_dir: str | os.PathLike | None = None,
           timeout_s: float = 300.0, crash_rank: int | None = None, crash_step: int = 0,
           stop: threading.Event | None = None, quiet: bool = True, retry_native_crash: bool = True) -> list[DDPRun]:
    """`jobs` one after another in one torchrun launch of `nproc` processes; one DDPRun per job. A failed rank or a
    launch past timeout_s raises DistributedRunError, one killed by a signal (native code) gets one more launch.
    crash_rank / crash_step make that rank raise at that step; setting `stop` kills the launch."""
    import torch

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
    if jobs[0].config.device == "cpu" or not torch.cuda.is_available():
        env.setdefault("OMP_NUM_THREADS", "1")  # N processes share the cores: one thread each, or they fight
    log_path = out / "launch.log"
    t0 = time.perf_counter()
    code, timed_out, stopped = run_with_timeout(cmd, log_path, timeout_s, env=env, stop=stop)
    seconds = time.perf_counter() - t0
    log = log_path.read_text(errors="replace")
    if code != 0 or timed_out or stopped:
        error = _launch_error(out, log, code, timed_out, stopped, timeout_s, nproc)
        left = timeout_s - seconds
        if not (retry_native_crash and _died_in_native_code(error) and left > 30):
            raise error
        # a rank killed in native code: the same launch once more, in the time left, the first failure kept
        warnings.warn(f"fastlab.distributed: {error.args[0].split(';')[0]}; launching once more", RuntimeWarning,
                      stacklevel=2)
        (out / "launch.first-failure.log").write_text(log)
        return launch(jobs, nproc, out_dir=out, timeout_s=left, crash_rank=crash_rank, crash_step=crash_step,
                      stop=stop, quiet=quiet, retry_native_crash=False)
    runs = []
    for i in range(len(jobs)):
        path = out / f"job{i}.json"
        if not path.is_file():
            raise DistributedRunError(f"torchrun exited 0 but wrote no result for job {i} ({path}); log tail:\n"
                                      f"{_tail(log)}", exit_code=0, log_tail=_tail(log))
        results = [RunResult.from_dict(r) for r in load_document(path)["results"]]
        runs.append(DDPRun(results[0], results[1:], path, log))
    if not quiet:
        print(f"torchrun: {nproc} process(es), {len(jobs)} job(s), {seconds:.1f} s wall time (start-up included)")
    return runs


def run_ddp(config: TrainConfig, nproc: int | None = None, *, options: DDPOptions | None = None,
            label: str = "", **launch_kwargs: Any) -> DDPRun:
    """One DDP job in one launch (see `launch` for the keyword arguments)."""
    return launch([DDPJob(config, options or DDPOptions(), label)], nproc, **launch_kwargs)[0]


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


# what a process prints as it dies in native code (its lines come before torchrun's report, past the log's tail)
_NATIVE_CRASH = re.compile(r"terminate called|what\(\):|Fatal Python error|Segmentation fault|enforce fail|"
                           r"Resource temporarily unavailable|Killed|out of memory", re.IGNORECASE)


def _died_in_native_code(error: DistributedRunError) -> bool:
    code = error.rank_exit_code
    return not error.timed_out and code is not None and code < 0 and -code not in (signal.SIGTERM, signal.SIGKILL)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _launch_error(out: Path, log: str, code: int | None, timed_out: bool, stopped: bool, timeout_s: float,
                  nproc: int) -> DistributedRunError:
    tail = _tail(log)
    if stopped:
        return DistributedRunError(f"the DDP launch was stopped; its {nproc} processes were killed", exit_code=code,
                                   log_tail=tail)
    # torchrun's root-cause report names the first rank to fail (after a timeout, only who our SIGTERM reached first)
    root = log[log.find("Root Cause"):] if "Root Cause" in log and not timed_out else ""
    rank, rank_code = (int(m.group(1)) if (m := re.search(key + r"\s*:\s*(-?\d+)", root)) else None
                       for key in ("rank", "exitcode"))
    reports = {int(p.stem[4:]): p for p in out.glob("rank*.error")}  # each failing worker's own traceback
    if rank is None and reports:  # no usable report from torchrun: the earliest error file
        rank = min(reports, key=lambda r: reports[r].stat().st_mtime_ns)
    why = ""
    if rank in reports:
        lines = reports[rank].read_text(errors="replace").strip().splitlines()
        why = lines[-1] if lines else ""
    elif rank_code is not None and rank_code < 0:  # killed by a signal: no Python traceback, maybe native last words
        why = f"killed by {_signal_name(-rank_code)}"
        native = [line.strip() for line in log.splitlines() if _NATIVE_CRASH.search(line)]
        if native:
            why += " after: " + " | ".join(dict.fromkeys(native))  # e.g. gloo's "terminate called ... what(): ..."
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
                               log_tail=tail, rank_exit_code=rank_code)


# ------------------------------------------------------------------ the worker (one per rank, under torchrun)


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


def _train_job(job: DDPJob, ctx: Rank, crash_rank: int | None, crash_step: int) -> RunResult:
    """Train one job on this rank through fastlab's one loop, in DDP mode. Returns this rank's RunResult."""
    import torch.distributed as dist

    from .data import load_images
    from .harness import TrainingRun

    plan = plan_batches(job.config, ctx.world, job.options)
    cfg = job.config.replace(batch_size=plan.per_rank_batch, lr=plan.lr, device=str(ctx.device))
    # Rank 0 fetches the data first (it may download); the others then load what rank 0 got.
    names = [None]
    if ctx.rank == 0:
        names = [load_images(cfg.dataset, cfg.train_images, cfg.eval_images, allow_download=profile_of(cfg).downloads).name]
    dist.broadcast_object_list(names, src=0)
    images = load_images(names[0], cfg.train_images, cfg.eval_images, allow_download=False)
    mode = DDPMode(ctx, job.options, plan)
    training = TrainingRun(cfg, f"rank {ctx.rank}", None, images, False, None, mode.on_step(cfg, crash_rank, crash_step),
                           parallel=mode)
    return training.execute()


def combine(rank_results: Sequence[RunResult], label: str) -> RunResult:
    """The whole job as one RunResult: global images per step over the slowest rank's window times; losses,
    accuracy and per-step lists are rank 0's, peak memory the largest of any one process."""
    from .clocks import window_ends

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


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
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
    import torch.distributed as dist

    args = _parse_args(argv)
    rank, world, local_rank = _rank_env()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        jobs = _jobs_from_args(args)
        backend = jobs[0].options.backend
        device, backend = _pick_device(jobs[0].config, local_rank, backend)
        kwargs: dict[str, Any] = {"timeout": _dt.timedelta(seconds=args.collective_timeout)}
        if device.type == "cuda":
            kwargs["device_id"] = device  # binds the process group to this GPU (eager NCCL init)
        dist.init_process_group(backend, **kwargs)
        ctx = Rank(rank, world, local_rank, device, backend)
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
    except BaseException:
        # the failing rank's own account, which the launcher reads to name it (torchrun's report is for people)
        with contextlib.suppress(OSError):
            (out / f"rank{rank}.error").write_text(traceback.format_exc())
        raise
    return 0


if __name__ == "__main__":
    from torch.distributed.elastic.multiprocessing.errors import record

    sys.exit(record(main)())
