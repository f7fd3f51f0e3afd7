"""Notebook 01: the data path. The worker sweep (C1), the DataLoader knobs one by one then the device-resident
loader (C2, with the copy timed alone), and a trainer starved by slow storage (C13)."""

from __future__ import annotations

import math
import statistics
import time
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch.utils.data import DataLoader, Dataset

from .. import budget, claims
from ..calibration import calibrate
from ..claims import Judgement
from ..comparisons import comparison
from ..config import TrainConfig, comparison_repeats, positive_int, time_sizing
from ..data import CifarLikeDataset, load_images
from ..measure import Spread, resolve_device, usable_cpu_count
from ..profiles import profile_of
from ..results import RunResult
from ..train import interleave
from ..verdicts import turns, uncredited, verdict

STARVE_BATCH_MS = 100.0  # simulated storage latency per batch, spread over its images: it starves any batch size
MAX_PIPELINE_WORKERS = 8
OVERSUBSCRIBE = (2, 4, 6)  # the sweep goes past the advice's 2-4x the cores, to show where more workers cost
# A sweep run's start-up per worker: the H200 reference's warm-up with 96 workers against 16 (5.4 s against 2.3 s,
# fastlab/reference/nvidia-h200.json, 16 usable cores), over the 80 workers between them.
WORKER_START_SECONDS = 0.04
SWEEP = "01_data_loading:num_workers"


def worker_counts(cpu_count: int | None = None) -> list[int]:
    """0, powers of two below the cores, the cores, then 2x, 4x and 6x them (cores: usable_cpu_count by default)."""
    n = positive_int("worker_counts: cpu_count", usable_cpu_count() if cpu_count is None else cpu_count)
    counts = [0]
    p = 1
    while p < n:
        counts.append(p)
        p *= 2
    return counts + [n] + [k * n for k in OVERSUBSCRIBE]


def sweep_counts(base: TrainConfig, cpu_count: int | None = None, say: bool = False) -> list[int]:
    """The counts the sweep runs under base's profile: worker_counts, its largest oversubscribed counts left out
    while the sweep's estimated time passes what it may take: the profile's sweep_seconds, and the sweep's share of
    the notebook's budget (fastlab.budget), estimated from this machine's calibrated step with each run cut to its
    fewest steps. The counts up to the cores always run; with neither limit, all of them. say: print the cut."""
    counts = worker_counts(usable_cpu_count() if cpu_count is None else cpu_count)
    sizing = time_sizing(base.profile) or {}
    share = budget.share_of(SWEEP)
    limits = [s for s in (sizing.get("sweep_seconds"), share) if s is not None]
    if not limits:
        return counts
    repeats = comparison_repeats(base)
    if share is None:
        per_run = budget.RUN_OVERHEAD_SECONDS + sizing["run_seconds"]
    elif share <= 0:  # the budget is spent: the sweep's runs are refused, so nothing is worth calibrating for
        per_run = math.inf
    else:  # this machine now: its calibrated step (the load included), each run at its fewest steps
        fewest = max(base.windows, int(sizing.get("min_steps", base.steps)))
        try:
            step = calibrate(base).step_seconds
        except ValueError:  # a profile this machine will not run (gpu's on a CPU): the profile's run time
            step = None
        per_run = (budget.run_seconds(step, fewest, base.warmup_steps, -(-base.eval_images // base.batch_size))
                   if step else budget.RUN_OVERHEAD_SECONDS + sizing["run_seconds"])

    def sweep_seconds(kept: list[int]) -> float:
        return sum(repeats * (per_run + n * WORKER_START_SECONDS) for n in kept)

    all_counts = counts
    cores = counts.index(max(c for c in counts if c <= (cpu_count or usable_cpu_count()))) + 1
    while len(counts) > cores and sweep_seconds(counts) > min(limits):
        counts = counts[:-1]
    if say and share is not None and len(counts) < len(all_counts):
        left_out = ", ".join(str(n) for n in all_counts[len(counts):])
        print(f"{SWEEP}: budget: this comparison's share is {budget.duration(share)}, so num_workers={left_out} "
              f"left out (the most oversubscribed: where more workers than cores cost is not measured here)",
              flush=True)
    return counts


def pipeline_workers(cpu_count: int | None = None) -> int:
    """Workers for the pipeline comparison: every core, capped at MAX_PIPELINE_WORKERS."""
    return min(usable_cpu_count() if cpu_count is None else cpu_count, MAX_PIPELINE_WORKERS)


def pipeline_steps(workers: int) -> list[tuple[str, dict[str, Any]]]:
    """The DataLoader knobs added one at a time (cumulative), then the device-resident loader."""
    positive_int("pipeline_steps: workers", workers)
    plain = dict(loader="dataloader", num_workers=workers, pin_memory=False, non_blocking=False,
                 persistent_workers=False, prefetch_factor=None)
    steps = [(f"{workers} workers", plain)]
    for label, change in (("+pin_memory, non_blocking", dict(pin_memory=True, non_blocking=True)),
                          ("+persistent_workers", dict(persistent_workers=True)),
                          ("+prefetch_factor=4", dict(prefetch_factor=4))):
        steps.append((label, {**steps[-1][1], **change}))
    return steps + [("device-resident loader", dict(plain, loader="device", num_workers=0))]


def short_for_smoke(cfg: TrainConfig) -> TrainConfig:
    """cfg cut to its profile's few steps a run where it has them (Profile.loading_shortening: smoke, gpu-dry):
    these comparisons have many runs, each starting workers."""
    return cfg.replace(**profile_of(cfg).loading_shortening)


@comparison(SWEEP, arms=lambda base: len(sweep_counts(base)))
def compare_num_workers(base: TrainConfig, progress: bool = True) -> list[RunResult]:
    """The worker sweep on the DataLoader (workers not kept between epochs), the counts run in turns."""
    cfg = short_for_smoke(base.replace(loader="dataloader", persistent_workers=False, prefetch_factor=None))
    cores = usable_cpu_count()
    counts = sweep_counts(base, cores, say=True)
    results = interleave([(f"num_workers={n}", cfg.replace(num_workers=n)) for n in counts], progress=progress)
    for n, r in zip(counts, results):
        r.extras["usable_cpus"] = cores
        if said := torch_worker_check(n):
            r.extras["torch_warning"] = said
    return results


def torch_worker_check(num_workers: int) -> str | None:
    """What torch's DataLoader warns for `num_workers` here (a run's own warning stays in its process)."""
    if num_workers == 0:
        return None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        DataLoader(range(1), num_workers=num_workers)  # its constructor runs torch's check
    return str(caught[0].message) if caught else None


@comparison("01_data_loading:pipeline", arms=lambda base: len(pipeline_steps(pipeline_workers())))
def compare_pipeline(base: TrainConfig, progress: bool = True) -> list[RunResult]:
    """The staircase, each step run the profile's repeats in turns: each step is judged against the one before."""
    configs = [(label, short_for_smoke(base.replace(**changes))) for label, changes in pipeline_steps(pipeline_workers())]
    return interleave(configs, progress=progress)


class SlowStorage(Dataset):
    """CIFAR-shaped images that each sleep `latency_ms` to "read", as slow storage would (workers overlap it)."""

    synthetic = True

    def __init__(self, images: np.ndarray, labels: np.ndarray, latency_ms: float) -> None:
        if isinstance(latency_ms, bool) or not isinstance(latency_ms, (int, float)) or latency_ms < 0:
            raise ValueError(f"SlowStorage(latency_ms={latency_ms!r}) is not allowed: a number of milliseconds >= 0")
        self.inner = CifarLikeDataset(images, labels, train=True)
        self.latency_s = latency_ms / 1000

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int):
        time.sleep(self.latency_s)
        return self.inner[index]


def slow_storage_data(base: TrainConfig, batch_ms: float = STARVE_BATCH_MS) -> tuple[Dataset, Dataset]:
    """(slow training set, ordinary held-out set) for `base`: a batch takes about batch_ms to read in one process."""
    images = load_images("synthetic", base.train_images, base.eval_images, allow_download=False)
    train = SlowStorage(images.train_images, images.train_labels, latency_ms=batch_ms / base.batch_size)
    held_out = CifarLikeDataset(images.eval_images, images.eval_labels, train=False)
    return train, held_out


@comparison("01_data_loading:slow_storage")  # not sized by time: its steps wait on simulated storage, not compute
def compare_slow_storage(base: TrainConfig, progress: bool = True) -> list[RunResult]:
    """The symptom of a data bottleneck: 0 workers on slow storage, then every core's worth of workers."""
    data = slow_storage_data(base)
    base = base.replace(loader="dataloader", persistent_workers=False, prefetch_factor=None)
    results = interleave([(f"slow storage, num_workers={n}", base.replace(num_workers=n), {"dataset": data})
                          for n in (0, pipeline_workers())], progress=progress)
    for result in results:
        result.extras["simulated_latency_ms_per_batch"] = STARVE_BATCH_MS
    return results


# ---------------------------------------------------------------- reading the results


def busy_trace(step_seconds: list[float], wait_seconds: list[float]) -> tuple[list[float], list[float]]:
    """(times, busy %) over wall time from the step records, idle while a step waits for data: for where="post"."""
    times, busy, t = [], [], 0.0
    for step, wait in zip(step_seconds, wait_seconds, strict=True):  # one wait per step
        wait = min(max(wait, 0.0), step)
        if wait > 0:
            times.append(t)
            busy.append(0.0)
        if step - wait > 0:
            times.append(t + wait)
            busy.append(100.0)
        t += step
    times.append(t)
    busy.append(busy[-1] if busy else 0.0)
    return times, busy


def epoch_starts(result: RunResult) -> list[int]:
    """Step indices where the DataLoader began a new epoch (workers are started again there unless persistent)."""
    cfg = result.config
    per_epoch = int(result.dataset.get("train_images", cfg.get("train_images", 0))) // int(cfg["batch_size"])
    if per_epoch < 1:
        return []
    steps = len(result.step_seconds) * int(cfg.get("grad_accum_steps", 1))
    return [s // int(cfg.get("grad_accum_steps", 1)) for s in range(per_epoch, steps, per_epoch)]


def epoch_start_wait(result: RunResult) -> tuple[float, float]:
    """(median data wait at the first step of a new epoch, median data wait of the other timed steps), in seconds."""
    warm = int(result.config.get("warmup_steps", 0))
    starts = [s for s in epoch_starts(result) if s >= warm]
    rest = [w for i, w in enumerate(result.data_wait_seconds) if i >= warm and i not in starts]
    at_start = [result.data_wait_seconds[s] for s in starts if s < len(result.data_wait_seconds)]
    return (statistics.median(at_start) if at_start else math.nan, statistics.median(rest) if rest else math.nan)


def describe_data_wait(result: RunResult) -> str:
    """The panel's line: is this run starved for data? The copy is apart: it also waits for queued GPU work."""
    share, copy = result.data_wait_fraction(), result.copy_fraction()
    if math.isnan(share):
        return "No timed steps: nothing to diagnose."
    kind = ("a data bottleneck: the model waits for batches" if share > 0.3 else
            "mostly compute-bound: faster loading would gain little" if share < 0.1 else "partly waiting for data")
    return f"{share:.0%} of step time was spent waiting for data: {kind}." + (
        "" if math.isnan(copy) else f" Copying batches to the device took another {copy:.0%} (not counted as data wait).")


# ---------------------------------------------------------------- C1: where the worker sweep peaks, and what it costs


def workers_of(result: RunResult) -> int:
    return int(result.config.get("num_workers", 0))


def cores_of(results: list[RunResult]) -> int:
    """The cores the sweep was measured against (recorded with it), else the machine's count."""
    recorded = [int(r.extras["usable_cpus"]) for r in results if r.extras.get("usable_cpus")]
    return recorded[0] if recorded else int(results[0].env.get("cpu_count") or 1)


@dataclass
class SweepReading:
    cores: int
    peak: RunResult | None  # the fastest point (median images/s); None: no run finished a timed window
    near_peak: list[int]  # worker counts whose throughput is within the spread of the peak's
    costs_from: RunResult | None  # the first point past the peak that is slower than it outside the spread
    last: RunResult | None = None  # the last point of the sweep that finished a window
    unread: str = ""  # why the sweep has no peak: its first run that finished no timed window, and why

    def describe(self) -> str:
        def at(r: RunResult) -> str:
            return f"num_workers={workers_of(r)} ({workers_of(r) / self.cores:g}x the cores)"

        if self.peak is None:
            return f"cores this process may use: {self.cores}; no run of the sweep finished a timed window: {self.unread}"
        p, c = self.peak.throughput, self.costs_from
        lines = [f"cores this process may use: {self.cores}; the sweep went to {at(self.last)}"] if self.last else []
        lines.append(f"peak: {at(self.peak)}, {p.median:,.0f} images/s (min {p.low:,.0f}, max {p.high:,.0f}); within "
                     f"the spread of the peak: num_workers={', '.join(map(str, self.near_peak))}")
        lines.append("no point past the peak was slower than it outside the spread: more workers did not cost here"
                     if c is None else
                     f"{'oversubscription (more workers than cores)' if workers_of(c) > self.cores else 'adding workers'}"
                     f" costs from {at(c)}: {verdict(p, c.throughput).ratio:.2f}x the peak's images/s, data wait "
                     f"{c.data_wait_fraction():.0%} of step time (the peak's: {self.peak.data_wait_fraction():.0%})")
        return "\n".join(lines)


def read_sweep(results: list[RunResult]) -> SweepReading:
    """Where a num_workers sweep peaks, which counts are as good (inside the spread), where more starts to cost; no
    peak where no run finished a timed window (e.g. the notebook's budget did not start them), saying why."""
    ok = [r for r in results if r.window_throughput and r.status == "ok"]
    if not ok:
        bad = uncredited(results)
        return SweepReading(cores_of(results), None, [], None, unread=bad[1] if bad else "the sweep has no run")
    peak = max(ok, key=lambda r: r.throughput.median)
    near = [workers_of(r) for r in ok if r is peak or verdict(peak.throughput, r.throughput).noise]
    costs = [r for r in ok if workers_of(r) > workers_of(peak) and verdict(peak.throughput, r.throughput).direction
             == "worse"]
    return SweepReading(cores_of(results), peak, near, costs[0] if costs else None, last=ok[-1])


def judge_workers(results: list[RunResult]) -> Judgement:
    """C1: is num_workers = 2-4 x the cores where the sweep peaks (or within the peak's spread)?"""
    reading = read_sweep(results)
    if reading.peak is None:
        return Judgement(f"{claims.COULD_NOT_TELL} (no run of the sweep finished a timed window)", reading.describe(),
                       recorded=False)  # nothing was measured: nothing to keep
    finding = _judge_sweep(results, reading)
    v = finding.verdict
    # the advice feeds a GPU; on a CPU loading and training share the cores (a cause: not named where nothing showed)
    if results[0].env.get("device_type", "cpu") == "cpu" and not v.startswith(claims.COULD_NOT_TELL):
        return finding._replace(verdict=v[:-1] + f"; {ON_A_CPU})" if v.endswith(")") else f"{v} ({ON_A_CPU})")
    return finding


ON_A_CPU = ("on a CPU the workers compete with training for the same cores: the advice is about keeping a GPU fed, "
            "where the workers load on the CPU while the GPU trains")


def _judge_sweep(results: list[RunResult], reading: SweepReading) -> Judgement:
    n = reading.cores
    zero = next((r for r in results if workers_of(r) == 0 and r.window_throughput), None)
    advised = [r for r in results if 2 * n <= workers_of(r) <= 4 * n and r.window_throughput]
    evidence = reading.describe().replace("\n", "; ")
    if zero is not None and all(verdict(zero.throughput, r.throughput).direction != "better"
                                for r in results if r.window_throughput):
        # judged only where a gain that matters would have been seen: at the advised counts (else at every count)
        others = advised or [r for r in results if r.window_throughput and r is not zero]
        seen = max(((verdict(zero.throughput, r.throughput), r) for r in others), key=lambda p: p[0].detectable,
                   default=None)
        if seen is not None and seen[0].detectable > claims.MIN_GAIN:
            return Judgement(f"{claims.COULD_NOT_TELL} (no worker count beat num_workers=0 outside the spread; "
                           f"{claims.unseen(seen[0], f'num_workers={workers_of(seen[1])} read')})", evidence)
        return Judgement(f"does not hold here (no worker count beat num_workers=0 outside the spread, where a "
                       f"{claims.MIN_GAIN:g}x gain would have been seen)", evidence)
    if not advised:
        top = max(workers_of(r) for r in results if r.window_throughput)  # e.g. the gpu fast version stops at the cores
        return Judgement(f"{claims.COULD_NOT_TELL} (the sweep has no point at 2-4x the cores to judge: it went to "
                       f"num_workers={top} on {n} cores)", evidence, recorded=False)
    if any(workers_of(r) in reading.near_peak for r in advised):
        return Judgement(f"holds (2-4x the cores is at the peak, within its spread: peak at "
                       f"num_workers={workers_of(reading.peak)})", evidence)
    best = max(advised, key=lambda r: r.throughput.median)
    return Judgement(f"does not hold here (the peak is at num_workers={workers_of(reading.peak)}, "
                   f"{workers_of(reading.peak) / n:g}x the cores; the best of 2-4x the cores reaches "
                   f"{verdict(reading.peak.throughput, best.throughput).ratio:.2f}x of it)", evidence)


# ---------------------------------------------------------------- C2: the copy alone, pinned or not


@dataclass
class CopyTiming:
    label: str
    ms: Spread  # milliseconds per copy of one batch (synchronised), or host-blocked time for non_blocking


def time_copies(batch_size: int, repeats: int = 20, device: str = "auto") -> list[CopyTiming] | str:
    """A batch's copy to a CUDA GPU: pageable, pinned, pinned non_blocking (host wait); elsewhere why it is a no-op."""
    import torch

    dev = resolve_device(device)
    if dev.type != "cuda":
        return f"pinned memory only speeds copies to a CUDA GPU; this machine trains on {dev.type}"
    pageable = torch.randn(batch_size, 3, 32, 32)
    pinned = pageable.pin_memory()
    arms = (("pageable", pageable, False), ("pinned", pinned, False),
            ("pinned, non_blocking (host wait only)", pinned, True))
    times: list[list[float]] = [[] for _ in arms]
    for i, k in turns(len(arms), repeats + 3):  # the three copies in turns: a busy spell hits each alike
        _, src, non_blocking = arms[k]
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        src.to(dev, non_blocking=non_blocking)
        if not non_blocking:
            torch.cuda.synchronize(dev)
        if i >= 3:  # the first copies warm the allocator up
            times[k].append(1000 * (time.perf_counter() - t0))
    torch.cuda.synchronize(dev)
    return [CopyTiming(label, Spread.of(t)) for (label, _, _), t in zip(arms, times)]


def judge_pinning(pipeline: list[RunResult], copies: list[CopyTiming] | str | None = None) -> Judgement:
    """C2: pinned memory on the copy alone (when timed) and on training throughput, against the run before it."""
    pinned = next((r for r in pipeline if r.config.get("pin_memory") and r.config.get("loader") == "dataloader"
                   and not r.config.get("persistent_workers")), None)
    if pinned is None or pipeline.index(pinned) == 0:
        raise ValueError("judge_pinning needs the pipeline comparison's runs (a run without, then with pin_memory)")
    before = pipeline[pipeline.index(pinned) - 1]
    if "pin_memory" in pinned.no_ops:  # a DataLoader run: pinning did nothing because there is no CUDA GPU
        return Judgement(claims.no_accelerator(f"the claim is about copies to a GPU; {pinned.no_ops['pin_memory']}"),
                       f"'{pinned.label}': {pinned.summary()}")
    findings = {"counted in training images/s": claims.verdict_speedup(before, pinned)}
    if isinstance(copies, list) and len(copies) >= 2:
        findings = {"measured on the copy alone": claims.verdict_less(copies[0].ms, copies[1].ms, what="copy time",
                                                              unit="ms"), **findings}
    return claims.verdict_conditions(findings)


# ---------------------------------------------------------------- C13: what a utilisation swing says

SWING_SHARE = 0.15  # a trace "swings hard" when at least this share of samples is near 0% and as many near 100%


def utilisation_swing(result: RunResult) -> tuple[float, float] | None:
    """(share of NVML samples at or below 10%, share at or above 90%), or None when none was sampled."""
    if not result.gpu_util:
        return None
    values = [u for _, u in result.gpu_util]
    return sum(u <= 10 for u in values) / len(values), sum(u >= 90 for u in values) / len(values)


def judge_swing(starved: list[RunResult]) -> Judgement:
    """C13 on the slow-storage runs: does the starved run's GPU utilisation swing, and do workers fix it?"""
    if len(starved) < 2:
        raise ValueError("judge_swing needs the slow-storage runs: no workers, then workers")
    slow, fed = starved[0], starved[-1]
    swing = utilisation_swing(slow)
    if swing is None:
        waits = (f"data wait {slow.data_wait_fraction():.0%} with no workers, {fed.data_wait_fraction():.0%} "
                 f"with {workers_of(fed)}")
        where = slow.env.get("device_name", "this machine")
        if slow.env.get("device_type", "cpu") != "cuda":
            return Judgement(claims.no_accelerator(f"the claim reads a GPU's utilisation, and {where} has no GPU; the "
                                                 f"trace above is rebuilt from the step records instead"), waits)
        return Judgement(f"no-op here (no GPU utilisation to read on {where}: NVML gave no samples; the trace above "
                       f"is rebuilt from the step records instead)", waits)
    low, high = swing
    wait = slow.data_wait_fraction()
    evidence = (f"no workers: {low:.0%} of utilisation samples at or below 10%, {high:.0%} at or above 90%, data "
                f"wait {wait:.0%}; with {workers_of(fed)} workers: {claims.verdict_speedup(slow, fed).verdict}")
    swings = low >= SWING_SHARE and high >= SWING_SHARE
    if swings and wait > 0.3 and claims.verdict_speedup(slow, fed).verdict.startswith("holds"):
        return Judgement("holds (the starved run's utilisation swings and workers fix it)", evidence)
    if not swings and wait > 0.3:
        return Judgement("does not hold here (the run waited for data, yet NVML's utilisation did not swing: it is the "
                       "share of each sample period in which any kernel ran, averaged over that period)", evidence)
    return Judgement("does not hold here (the utilisation swing did not go with a data bottleneck that workers fix)",
                   evidence)
