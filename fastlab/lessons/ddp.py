"""Notebook 11: DDP runs of 1 and N processes (torchrun starting fastlab.distributed), scaling efficiency (speed-up in global images/s
divided by N), the gradient-accumulation pitfall and a crashed rank."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from .. import budget
from ..comparisons import comparison
from ..config import TrainConfig, config_for, positive_int
from ..distributed import DDPRun, DistributedRunError, flags, read_ranks
from ..measure import Spread
from ..parallel import DDPOptions
from ..profiles import profile_of
from ..results import RunResult
from ..verdicts import ratio_of, verdict

NAME = "11_multi_gpu_ddp:scaling"
ACCUM_STEPS = 2  # micro-batches per optimiser step in the no_sync demo
LAUNCH_TIMEOUT_S = 600.0  # bounds each torchrun launch; each run inside also has the profile's max_seconds
# A launch's wall time beyond its runs' timed steps (torchrun, each rank's imports, the process group, data, warm-up,
# evaluation): assumed from a loaded 2-core CPU, where 4 runs of at most 45 timed seconds in 2 launches took 316 s.
LAUNCH_OVERHEAD_SECONDS = 30.0


@dataclass(frozen=True)
class Setup:
    """Where the notebook's DDP runs go: how many processes, on what, and why."""

    nproc: int
    config: TrainConfig
    note: str


def setup_for(base: TrainConfig, nproc: int | None = None) -> Setup:
    """N = the GPUs here when there are two or more; otherwise 2 CPU processes (gloo), one core each (NCCL will
    not put two ranks on one GPU); a profile with a ddp_cpu_profile (gpu: cpu's sizes) then takes that profile's."""
    if nproc is not None:
        positive_int("nproc", nproc, 2, why=" (the demo compares 1 process with nproc)")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if base.device != "cpu" and gpus >= 2:
        n = nproc or gpus
        if n > gpus:
            raise ValueError(f"nproc={n} is not allowed here: this machine has {gpus} GPUs, one process each")
        return Setup(n, base, f"{n} processes, one per GPU, all-reducing gradients with nccl")
    cfg = base
    why = "no GPU here"
    if gpus == 1 and base.device != "cpu":
        why = "one GPU here (DDP needs one GPU per process)"
        fallback = profile_of(base).ddp_cpu_profile
        cfg = config_for(fallback, device="cpu") if fallback else base.replace(device="cpu")
    n = nproc or 2
    return Setup(n, cfg, f"{n} CPU processes with one thread each, all-reducing gradients with gloo ({why}); "
                         f"the 1-process run also gets one thread, so the comparison is one core against {n}")


@comparison(NAME)
def scaling(base: TrainConfig, progress: bool = True) -> list[RunResult]:
    """Global throughput of 1 process against N (one per GPU, or 2 CPU processes): [one, many]."""
    return demo(base, quiet=not progress, accumulation=False).results


# ------------------------------------------------------------------ what the numbers say


def world_size(result: RunResult) -> int:
    """The number of processes behind a result (1 for a plain fastlab.run result)."""
    return int(result.extras.get("ddp", {}).get("world_size", 1))


@dataclass(frozen=True)
class Scaling:
    processes: float  # how many times more processes the second run had
    speedup: Spread  # median ratio; range from the worst to the best pairing of windows
    efficiency: Spread  # speedup / processes
    noise: bool  # the two throughputs' ranges overlap: no measurable change

    def describe(self) -> str:
        s, e = self.speedup, self.efficiency
        text = (f"speed-up {s.median:.2f}x (range {s.low:.2f}-{s.high:.2f}) with {self.processes:g}x the processes: "
                f"scaling efficiency {e.median:.0%} (range {e.low:.0%}-{e.high:.0%}; 100% = perfect)")
        return text + ("; the difference is inside the spread: noise" if self.noise else "")


def scaling_of(one: RunResult, many: RunResult) -> Scaling:
    """Speed-up and scaling efficiency of `many` over `one`, from their global images/s."""
    for name, r in (("one", one), ("many", many)):
        if not r.window_throughput:
            raise ValueError(f"{name}={r.label!r} has no timed window ({r.status}); cannot compute scaling")
    k = world_size(many) / world_size(one)
    a, b = one.throughput, many.throughput
    speedup = ratio_of(a, b)
    eff = Spread(speedup.median / k, speedup.low / k, speedup.high / k, speedup.n)
    return Scaling(k, speedup, eff, verdict(a, b).noise)


def median_step_ms(result: RunResult) -> float:
    """Median wall time of a timed step (warm-up excluded), in ms; for DDP results, rank 0's steps."""
    import statistics

    warm = int(result.config.get("warmup_steps", 0))
    steps = result.step_seconds[warm:]
    return 1000 * statistics.median(steps) if steps else float("nan")


def parameters_line(result: RunResult) -> str:
    """Whether the ranks' parameters (and BatchNorm statistics) agree after training: DDP's promise, checked."""
    d = result.extras["ddp"]
    p, b = d["parameters"], d["buffers"]
    same = "bit-for-bit identical" if p["identical"] else f"NOT identical (max difference {p['max_abs_diff']:.3g})"
    line = (f"after training, the {p['elements']:,} parameters are {same} on all {d['world_size']} ranks "
            f"(moved by up to {p['max_change_from_start']:.3g} from the start)")
    if b["elements"]:
        line += (f"; BatchNorm running statistics {'agree' if b['identical'] else 'differ'} across ranks "
                 f"(max difference {b['max_abs_diff']:.3g})")
    return line


def accumulation_runs(base: TrainConfig) -> list[tuple[TrainConfig, DDPOptions, str]]:
    """Gradient accumulation over ACCUM_STEPS micro-batches, with and without no_sync (half the steps each)."""
    steps = max(base.windows, base.steps // 2)
    cfg = base.replace(grad_accum_steps=ACCUM_STEPS, steps=steps)
    return [(cfg, DDPOptions(no_sync=True), f"accumulate {ACCUM_STEPS}, no_sync"),
            (cfg, DDPOptions(no_sync=False), f"accumulate {ACCUM_STEPS}, all-reduce every micro-batch")]


def torchrun(nproc: int, config: TrainConfig, options: DDPOptions | None = None, *, label: str = "",
             out: str | os.PathLike | None = None, timeout_s: float = LAUNCH_TIMEOUT_S, stop: Any = None,
             also: Sequence[str] = (), quiet: bool = False) -> DDPRun:
    """Run `torchrun --standalone --nproc-per-node nproc -m fastlab.distributed ...` for `config` (the command a
    reader would type, printed unless quiet), its output kept in OUT/torchrun.log, and read the ranks' results back.
    Past timeout_s, or once `stop` (a threading.Event) is set, torchrun is killed and its ranks end with it."""
    positive_int("nproc", nproc, why=" (processes to start)")
    out = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="fastlab-ddp-"))
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               "-m", "fastlab.distributed", *flags(config, options), "--out", str(out), *also]
    command += ["--label", label] if label else []
    env = dict(os.environ)
    if config.device == "cpu" or not torch.cuda.is_available():
        env["OMP_NUM_THREADS"] = "1"  # N processes share the cores: one thread each, or they fight
    if not quiet:
        print("$", ("OMP_NUM_THREADS=1 " if "OMP_NUM_THREADS" in env else "") + shlex.join(command), flush=True)
    deadline, ended = time.monotonic() + timeout_s, ""
    with open(out / "torchrun.log", "wb") as log, subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                                                   env=env) as launched:
        try:
            while launched.poll() is None:
                if stop is not None and stop.is_set():
                    ended = "it was stopped"
                elif time.monotonic() > deadline:
                    ended = f"it did not finish within timeout_s={timeout_s:g} s"
                if ended:
                    launched.kill()  # its ranks get SIGTERM as torchrun ends (fastlab.distributed sets that up)
                time.sleep(0.2)
        except BaseException:
            launched.kill()
            raise
    if ended:
        raise DistributedRunError(f"the DDP run of {nproc} processes was killed: {ended} (its output: "
                                  f"{out / 'torchrun.log'})")
    try:
        return read_ranks(out, label)
    except DistributedRunError as e:
        raise DistributedRunError(f"{e}; torchrun exited with code {launched.returncode} (its output: "
                                  f"{out / 'torchrun.log'})", rank=e.rank) from None


@dataclass
class Demo:
    setup: Setup
    one: DDPRun
    many: DDPRun
    accumulation: list[DDPRun]

    @property
    def results(self) -> list[RunResult]:
        return [self.one.result, self.many.result]


def demo(base: TrainConfig, nproc: int | None = None, *, timeout_s: float = LAUNCH_TIMEOUT_S, quiet: bool = False,
         accumulation: bool = True) -> Demo:
    """1 process, then N processes training the same config (and the no_sync pair, if accumulation), each its own
    torchrun."""
    setup = setup_for(base, nproc)
    launches = 4 if accumulation else 2  # accumulation_runs is a pair
    setup = replace(setup, config=fit_to_budget(setup.config, runs=launches, launches=launches))
    pair = accumulation_runs(setup.config) if accumulation else []
    with budget.within(NAME, None):
        one = torchrun(1, setup.config, label="1 process", timeout_s=timeout_s, quiet=quiet)
        many = torchrun(setup.nproc, setup.config, label=f"{setup.nproc} processes", timeout_s=timeout_s, quiet=quiet)
        accumulated = [torchrun(setup.nproc, cfg, options, label=label, timeout_s=timeout_s, quiet=quiet)
                       for cfg, options, label in pair]
    for run in [one, many, *accumulated]:
        run.result.comparison = NAME
    return Demo(setup, one, many, accumulated)


def fit_to_budget(cfg: TrainConfig, runs: int, launches: int) -> TrainConfig:
    """cfg with each run's max_seconds fitted to the part's share of the notebook's budget (budget.max_seconds_within)."""
    cut = budget.max_seconds_within(NAME, runs, launches * LAUNCH_OVERHEAD_SECONDS, cfg.max_seconds)
    return cfg if cut is None else cfg.replace(max_seconds=cut)


@dataclass(frozen=True)
class CrashReport:
    error: DistributedRunError
    seconds: float
    timeout_s: float


def crash_demo(setup: Setup, *, crash_step: int = 1, timeout_s: float = 120.0) -> CrashReport:
    """Make the last rank raise at crash_step of a short run; return what reading the ranks' results said."""
    cfg = setup.config.replace(warmup_steps=1, steps=2, windows=1)
    t0 = time.perf_counter()
    try:
        torchrun(setup.nproc, cfg, label="crash demo", timeout_s=timeout_s,
                 also=["--crash-rank", str(setup.nproc - 1), "--crash-step", str(crash_step)])
    except DistributedRunError as e:
        return CrashReport(e, time.perf_counter() - t0, timeout_s)
    raise RuntimeError("the crash demo finished without the deliberate crash: --crash-rank was not honoured")


def ddp_runner(nproc: int, options: DDPOptions | None = None, timeout_s: float = LAUNCH_TIMEOUT_S
               ) -> Callable[..., RunResult]:
    """A runner for fastlab.widgets.Panel: each Run starts torchrun with nproc processes; Stop kills it."""

    def runner(cfg: TrainConfig, *, label: str = "run", stop: Any = None, **_ignored: Any) -> RunResult:
        return torchrun(nproc, cfg, options, label=f"x{nproc} {label}", stop=stop, timeout_s=timeout_s,
                        quiet=True).result

    return runner
