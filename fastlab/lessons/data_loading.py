"""Notebook 01: the data path. Worker processes, pinned memory, persistent workers, prefetching, device-resident data.

Comparisons registered here (run them with fastlab.comparisons.run_comparison):
  01_data_loading:num_workers   DataLoader worker processes from 0 up to the core count
  01_data_loading:pipeline      the DataLoader knobs added one by one, then the device-resident loader
  01_data_loading:slow_storage  a starved trainer: simulated per-image storage latency, 0 workers vs several

Plus the picture of the symptom: a busy/idle trace over wall time (NVML GPU utilisation when it was sampled).
"""

from __future__ import annotations

import math
import os
import statistics
import time
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from ..comparisons import comparison
from ..config import TrainConfig
from ..data import CifarLikeDataset, load_images
from ..measure import verdict
from ..plots import data_note
from ..results import RunResult
from ..train import run

# The simulated storage latency is set per batch, so that the demo starves the trainer at any batch size:
# each image costs STARVE_BATCH_MS / batch_size milliseconds of sleep (like waiting on a slow disk or network).
STARVE_BATCH_MS = 100.0
# On a GPU the pipeline rung uses at most this many workers (the bundled H200 checklist used 8 to 16).
MAX_PIPELINE_WORKERS = 8


def worker_counts(cpu_count: int | None = None) -> list[int]:
    """0, then powers of two below the core count, then the core count: 0, 1, 2 on two cores; 0, 1, 2, 4, 8, 16 on 16."""
    n = os.cpu_count() if cpu_count is None else cpu_count
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"worker_counts(cpu_count={cpu_count!r}) is not allowed: cpu_count must be an integer >= 1")
    counts = [0]
    p = 1
    while p < n:
        counts.append(p)
        p *= 2
    return counts + [n]


def pipeline_workers(cpu_count: int | None = None) -> int:
    """Workers for the pipeline comparison: every core, capped at MAX_PIPELINE_WORKERS."""
    return min(worker_counts(cpu_count)[-1], MAX_PIPELINE_WORKERS)


def pipeline_steps(workers: int) -> list[tuple[str, dict[str, Any]]]:
    """The DataLoader knobs added one at a time (cumulative), then the device-resident loader."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"pipeline_steps(workers={workers!r}) is not allowed: workers must be an integer >= 1")
    loader = dict(loader="dataloader", num_workers=workers, pin_memory=False, non_blocking=False,
                  persistent_workers=False, prefetch_factor=None)
    steps = [(f"{workers} workers", loader)]
    steps.append(("+pin_memory, non_blocking", dict(steps[-1][1], pin_memory=True, non_blocking=True)))
    steps.append(("+persistent_workers", dict(steps[-1][1], persistent_workers=True)))
    steps.append(("+prefetch_factor=4", dict(steps[-1][1], prefetch_factor=4)))
    steps.append(("device-resident loader", dict(loader="device", num_workers=0, pin_memory=False, non_blocking=False,
                                                 persistent_workers=False, prefetch_factor=None)))
    return steps


@comparison("01_data_loading:num_workers")
def compare_num_workers(base: TrainConfig, progress: bool = True) -> list[RunResult]:
    base = base.replace(loader="dataloader", persistent_workers=False, prefetch_factor=None)
    return [run(base.replace(num_workers=n), label=f"num_workers={n}", progress=progress) for n in worker_counts()]


@comparison("01_data_loading:pipeline")
def compare_pipeline(base: TrainConfig, progress: bool = True) -> list[RunResult]:
    configs = [(label, base.replace(**changes)) for label, changes in pipeline_steps(pipeline_workers())]
    return [run(cfg, label=label, progress=progress) for label, cfg in configs]


class SlowStorage(Dataset):
    """CIFAR-shaped images that each take `latency_ms` to "read": a stand-in for a slow disk or network store.

    The delay is a sleep, not computation, so it is what an I/O-bound pipeline looks like: worker processes
    can overlap it even on a small CPU. It is a simulation, and results say so (synthetic=True).
    """

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
    if isinstance(batch_ms, bool) or not isinstance(batch_ms, (int, float)) or batch_ms < 0:
        raise ValueError(f"slow_storage_data(batch_ms={batch_ms!r}) is not allowed: a number of milliseconds >= 0")
    images = load_images("synthetic", base.train_images, base.eval_images, allow_download=False)
    train = SlowStorage(images.train_images, images.train_labels, latency_ms=batch_ms / base.batch_size)
    held_out = CifarLikeDataset(images.eval_images, images.eval_labels, train=False)
    return train, held_out


@comparison("01_data_loading:slow_storage")
def compare_slow_storage(base: TrainConfig, progress: bool = True) -> list[RunResult]:
    """The symptom of a data bottleneck: 0 workers on slow storage, then every core's worth of workers."""
    data = slow_storage_data(base)
    base = base.replace(loader="dataloader", persistent_workers=False, prefetch_factor=None)
    results = []
    for n in (0, pipeline_workers()):
        result = run(base.replace(num_workers=n), label=f"slow storage, num_workers={n}", dataset=data,
                     progress=progress)
        result.extras["simulated_latency_ms_per_batch"] = STARVE_BATCH_MS
        results.append(result)
    return results


# ---------------------------------------------------------------- reading the results


def busy_trace(step_seconds: list[float], wait_seconds: list[float]) -> tuple[list[float], list[float]]:
    """A 0%/100% trace over wall time rebuilt from the step records: idle while waiting for data, busy otherwise.

    Returns (times, busy) for a step plot drawn with where="post": busy[i] holds from times[i] to times[i+1].
    Within a step the wait comes first (the loop fetches the batch, then computes).
    """
    if len(step_seconds) != len(wait_seconds):
        raise ValueError(f"busy_trace needs one wait per step: got {len(step_seconds)} steps and "
                         f"{len(wait_seconds)} waits")
    times, busy, t = [], [], 0.0
    for step, wait in zip(step_seconds, wait_seconds):
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


def vs_baseline(base: RunResult, other: RunResult) -> str:
    """verdict() of two runs' throughputs, or why there is none (a run that failed or timed no window)."""
    for r in (base, other):
        if not r.window_throughput:
            return f"no comparison: '{r.label}' finished no timed window ({r.status}: {r.error or 'stopped early'})"
    return verdict(base.throughput, other.throughput)


def data_path_report(results: list[RunResult]) -> str:
    """One line per run: throughput with spread, share of the step spent waiting for data, and the verdict."""
    if not results:
        return "no results"
    lines = []
    for r in results:
        line = r.summary()
        if r is not results[0]:
            line += f"\n    vs '{results[0].label}': {vs_baseline(results[0], r)}"
        lines.append(line)
    return "\n".join(lines)


def describe_data_wait(result: RunResult) -> str:
    """The panel's advice line: is this run starved for data?"""
    share = result.data_wait_fraction()
    if math.isnan(share):
        return "No timed steps: nothing to diagnose."
    kind = ("a data bottleneck: the model waits for batches" if share > 0.3 else
            "mostly compute-bound: faster loading would gain little" if share < 0.1 else "partly waiting for data")
    return f"{share:.0%} of step time was spent waiting for data: {kind}."


def plot_busy_trace(results: list[RunResult], title: str = ""):
    """One row per run: NVML GPU utilisation over time when sampled, else the 0%/100% busy trace of the steps."""
    from ..plots import ShownFigure as Figure

    fig = Figure(figsize=(8, 1.7 * len(results) + 1.0))
    axes = fig.subplots(len(results), 1, squeeze=False)[:, 0]
    for ax, r in zip(axes, results):
        if r.gpu_util:
            ax.plot([t for t, _ in r.gpu_util], [u for _, u in r.gpu_util], color="tab:green")
            source = "GPU utilisation, NVML"
        else:
            times, busy = busy_trace(r.step_seconds, r.data_wait_seconds)
            ax.step(times, busy, where="post", color="tab:blue", lw=0.8)
            ax.fill_between(times, busy, step="post", alpha=0.3, color="tab:blue")
            elapsed = [0.0]
            for s in r.step_seconds:
                elapsed.append(elapsed[-1] + s)
            for s in epoch_starts(r):
                ax.axvline(elapsed[s], color="tab:red", ls=":", lw=1)
            source = "busy share rebuilt from step records; red dotted: new epoch"
        share = r.data_wait_fraction()
        ax.set_ylim(-5, 105)
        ax.set_ylabel("% busy", fontsize=8)
        ax.set_title(f"{r.label} ({source}; data wait {share:.0%} of timed steps)", fontsize=8)
    axes[-1].set_xlabel("seconds since the run started")
    fig.suptitle(f"{title + ' - ' if title else ''}busy or waiting, over time\n{data_note(results)}", fontsize=10)
    fig.tight_layout()
    return fig
