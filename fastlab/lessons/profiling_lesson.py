"""Notebook 08: profile the naive and the tuned configuration, and see where each step's time goes."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from ..comparisons import comparison
from ..config import TrainConfig
from ..measure import bf16_supported, resolve_device
from ..profiling import ProfileResult, profile_run
from ..results import RunResult
from ..train import describe_changes, run

NAIVE_VS_TUNED = "08_profiling:naive_vs_tuned"

# The naive configuration: per-image transforms in the training process, Adam as a for-loop, loss read every step.
NAIVE: dict[str, Any] = dict(loader="dataloader", num_workers=0, pin_memory=False, non_blocking=False,
                             persistent_workers=False, prefetch_factor=None, amp="off", channels_last=False,
                             cudnn_benchmark=False, compile="off", optimizer="adam", opt_impl="for-loop",
                             log_every=1)


def tuned_changes(base: TrainConfig) -> dict[str, Any]:
    """What the tuned run changes on NAIVE, at the same batch so step times compare; the GPU-only techniques
    (fused AdamW, low precision, channels_last, cudnn.benchmark) only on CUDA: on a CPU they are not assured to pay."""
    changes: dict[str, Any] = dict(loader="device", optimizer="adamw", opt_impl="foreach", log_every=10)
    dev = resolve_device(base.device)
    if dev.type == "cuda":
        changes.update(opt_impl="fused", amp="bf16" if bf16_supported(dev) else "fp16", channels_last=True,
                       cudnn_benchmark=True)
    return changes


def naive_and_tuned(base: TrainConfig) -> tuple[TrainConfig, TrainConfig]:
    naive = base.replace(**NAIVE)
    return naive, naive.replace(**tuned_changes(base))


@comparison(NAIVE_VS_TUNED, arms=2, repeated=False)
def naive_vs_tuned(base: TrainConfig, progress: bool = True) -> list[RunResult]:
    """The two configurations without the profiler: honest throughput for the two profiles below."""
    naive, tuned = naive_and_tuned(base)
    results = [run(naive, label="naive", progress=progress, comparison=NAIVE_VS_TUNED)]
    if results[-1].status != "interrupted":
        results.append(run(tuned, label="tuned: " + describe_changes(tuned_changes(base)), progress=progress,
                           comparison=NAIVE_VS_TUNED))
    return results


def profile_both(base: TrainConfig, *, steps: int = 5, trace_dir: str | Path | None = None) -> list[ProfileResult]:
    """Profile `steps` steps of the naive and of the tuned configuration; traces go to trace_dir (default: temp)."""
    naive, tuned = naive_and_tuned(base)
    trace_dir = trace_dir if trace_dir is not None else tempfile.mkdtemp(prefix="fastlab-profile-")
    return [profile_run(naive, label="naive", steps=steps, trace_dir=trace_dir),
            profile_run(tuned, label="tuned", steps=steps, trace_dir=trace_dir)]
