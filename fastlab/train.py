"""The way in: run, compare, sweep and interleave. Each run is one fastlab.harness.TrainingRun.

Every run starts from fresh state, in a fresh process, one at a time (fastlab.isolation). Compared arms run
interleaved (A B, then B A), so drift falls on every arm alike: interleave is the one schedule of every comparison.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import torch

from . import budget, isolation
from .clocks import Checkpoints
from .config import TrainConfig, comparison_repeats, demonstration_config, no_op_reasons, plan_arm
from .data import Data, ImageSet
from .harness import StepCallback, TrainingRun
from .isolation import active_run, exclusive_run
from .measure import environment, resolve_device, synchronize
from .models import ModelArg, build_model
from .profiles import profile_of
from .results import RunResult, merge_repeats
from .verdicts import turns


def run(config: TrainConfig, *, label: str = "run", model: ModelArg = None, dataset: Data | None = None,
        progress: bool = True, stop: threading.Event | None = None, on_step: StepCallback | None = None,
        comparison: str | None = None) -> RunResult:
    """Train with `config` and return what was measured.

    model: a module (or a function that builds one) to train instead of `config.model`.
    dataset: instead of `config.dataset`, an ImageSet (uint8 images: works with both loaders), or a pair
        (train, held_out) of map-style torch Datasets yielding (image tensor, int label) (loader="dataloader").
    comparison: the name of the comparison this run belongs to (matched against bundled reference results).
    stop: set it (from another thread) to end the run early; the result is marked interrupted.
    on_step: called as on_step(steps_done, total_steps) after each step (for progress widgets).
    Out-of-memory, Ctrl-C, config.max_seconds and divergence end the run marked failed, interrupted, time_limited
    or diverged, keeping the steps it finished. Once the notebook's budget is spent, a cell's own run is cut to a
    short run (fastlab.budget.own_run_cut): its result's budget_cut says why.
    """
    return _run(TrainingRun(config, label, model, dataset, progress, stop, on_step), comparison)


def _run(training: TrainingRun, comparison: str | None = None, cold_compile_caches: bool = False) -> RunResult:
    """One run, alone in this process's queue, in a fresh process (or, where it cannot go to one, a thread), as the
    notebook's budget admits it (admitted)."""
    refused = admitted(training, comparison)
    if refused is not None:
        return refused
    check_gpu_profile_here(training.cfg, training.device)
    with exclusive_run(training.result.label):
        result = isolation.execute(training, cold_compile_caches)
    result.repeats = 1  # one run, alone: merge_repeats counts the interleaved ones
    if comparison:
        result.comparison = comparison
    result.budget_cut = training.result.budget_cut
    return result


def admitted(training: TrainingRun, comparison: str | None = None) -> RunResult | None:
    """The notebook's budget (fastlab.budget) on a run about to start: a part's run once its share or the budget is
    spent is not started (its result returned, the first refusal said); any other run of this thread is cut to a
    short run (config.demonstration_config) once the budget is spent, `training` changed in place. None: it starts."""
    label = training.result.label
    refused = budget.refusal(label)
    if refused is not None:
        budget.say_refusal(label, refused)
        return not_started(training.cfg, label, refused, comparison)
    cut = budget.own_run_cut(label)
    if cut is not None:
        training.cfg = demonstration_config(training.cfg)
        training.result.config = training.cfg.to_dict()
        training.result.budget_cut = cut
    return None


_STEP_ESTIMATES: dict[tuple[str, int, str], float] = {}  # (model, images a step, device) -> seconds, this process
_SAID: set[tuple[str, int, str]] = set()  # the estimates said already (once each)


def estimate_step_seconds(model: str, images: int, device: str) -> float:
    """Seconds a step of `model` over `images` images is estimated to take on `device`: the faster of two forward and
    backward passes at a batch of 8 (after one that pays for set-up), scaled."""
    dev = torch.device(device)
    net = build_model(model).to(dev)
    x, y = torch.randn(8, 3, 32, 32, device=dev), torch.zeros(8, dtype=torch.long, device=dev)
    seconds = []
    for _ in range(3):
        t = time.perf_counter()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        synchronize(dev)
        seconds.append(time.perf_counter() - t)
    return min(seconds[1:]) * images / 8


def check_gpu_profile_here(cfg: TrainConfig, device: torch.device) -> None:
    """A profile sized for a CUDA GPU (Profile.cuda_sized: gpu, gpu-dry) without CUDA: says once how long a run of
    `cfg` is estimated to take here, and refuses one over the profile's slow_run_minutes (ValueError) unless
    FASTLAB_CONFIRM_SLOW=1."""
    preset = profile_of(cfg)
    if not preset.cuda_sized or device.type == "cuda":
        return
    key = (cfg.model, cfg.batch_size * cfg.grad_accum_steps, str(device))
    if key not in _STEP_ESTIMATES:  # in a fresh process, as a run: nothing of it stays in this one
        _STEP_ESTIMATES[key] = isolation.call(estimate_step_seconds, *key)
    steps = cfg.warmup_steps + cfg.steps
    minutes = _STEP_ESTIMATES[key] * steps / 60
    said = (f"the {cfg.profile} profile is sized for a CUDA GPU ({cfg.model}, batch {cfg.batch_size}, {cfg.warmup_steps} "
            f"warm-up steps) and this machine has none: a run of {steps} steps is estimated at {minutes:.1f} min on "
            f"its {device.type} (from one step at batch 8, scaled); FASTLAB_PROFILE=cpu sizes runs for this machine")
    limit = preset.slow_run_minutes
    if limit is not None and minutes > limit and os.environ.get("FASTLAB_CONFIRM_SLOW", "").strip() != "1":
        raise ValueError(f"{said}. Fix: set FASTLAB_CONFIRM_SLOW=1 to run it anyway (estimated over "
                         f"{limit:g} min), or use FASTLAB_PROFILE=cpu")
    if key not in _SAID:
        _SAID.add(key)
        print(f"fastlab: {said}", flush=True)


def compare(base: TrainConfig, *, progress: bool = True, comparison: str | None = None, repeats: int | None = None,
            **changes: Any) -> list[RunResult]:
    """Run `base` and `base` with `changes`, interleaved (see interleave); returns [baseline, changed]. When every
    change is a no-op on this device, the changed arm is not trained: its result (status "no_op") says why."""
    changed = base.replace(**changes)
    return interleave([("baseline", base), (describe_changes(changes), changed)], repeats=repeats, progress=progress,
                      comparison=comparison)


def sweep(knob: str, values: list[Any], base: TrainConfig, *, progress: bool = True,
          comparison: str | None = None, repeats: int | None = None) -> list[RunResult]:
    """One arm per value of `knob`, interleaved (see interleave); stops early, keeping what ran, if a run is
    interrupted. A value whose change from the first is a no-op on this device is not trained (see interleave)."""
    configs = [base.replace(**{knob: v}) for v in values]  # validate every value before running any
    return interleave([(f"{knob}={v}", cfg) for v, cfg in zip(values, configs)], repeats=repeats, progress=progress,
                      comparison=comparison)


Arm = tuple[str, TrainConfig] | tuple[str, TrainConfig, dict[str, Any]]


def interleave(arms: list[Arm], *, baseline: TrainConfig | None = None, repeats: int | None = None,
               seeds: Sequence[int] | None = None, progress: bool = True, comparison: str | None = None,
               device: torch.device | str | None = None) -> list[RunResult]:
    """Run the arms in turns (A B, then B A), so that drift slows every arm alike; one result per arm (its repeats
    merged), or with `seeds` one per arm and seed. An arm is (label, config[, run's keyword arguments]), planned
    against `baseline` (default: the first arm's) on `device` (skip_or_demonstrate). repeats: rounds of turns
    (default: comparison_repeats). An interrupted run ends the comparison, keeping every arm that ran."""
    base = arms[0][1] if baseline is None else baseline
    skipped = [skip_or_demonstrate(base, cfg, label, progress=progress, comparison=comparison, device=device)
               for label, cfg, *_ in arms]
    done: dict[int, list[RunResult]] = {i: [] if r is None else [r] for i, r in enumerate(skipped)}
    trained = [i for i, r in enumerate(skipped) if r is None]
    if seeds is None:
        rounds: list[int | None] = [None] * max(1, repeats if repeats is not None else comparison_repeats(base))
    else:
        rounds = list(seeds)
    for r, k in turns(len(trained), len(rounds)):
        i = trained[k]
        label, cfg, *given = arms[i]
        if seeds is not None:
            cfg, label = cfg.replace(seed=rounds[r]), f"{label} (seed {rounds[r]})"
        result = run(cfg, label=label, progress=progress, comparison=comparison, **(given[0] if given else {}))
        result.extras["repeat"] = r
        done[i].append(result)
        if result.status == "interrupted":
            break
    out = []
    for i, results in sorted(done.items()):
        if results and i in trained and seeds is None:
            results = [merge_repeats(results)]
        for result in results:
            result.extras["variant"] = arms[i][0]
        out += results
    return out


def skip_or_demonstrate(baseline: TrainConfig, arm: TrainConfig, label: str, *, progress: bool = True,
                        comparison: str | None = None, device: torch.device | str | None = None) -> RunResult | None:
    """The result of an arm not trained in full here (config.plan_arm): a no-op is not trained (its result says
    why), a known trap runs once, short. None: train it."""
    plan = plan_arm(baseline, arm, device)
    if plan.kind == "no-op":
        return not_trained(arm, label, plan.reason, comparison)
    if plan.kind == "trap":
        result = run(demonstration_config(arm), label=f"{label} (trap demonstration, one short run)",
                     progress=progress, comparison=comparison)
        result.trap = plan.reason
        return result
    return None


def not_trained(arm: TrainConfig, label: str, reason: str, comparison: str | None = None) -> RunResult:
    """The result of an arm that was not trained because it could teach nothing here: status "no_op", the reason.
    (A fact of the arm on this device, so the same on every run; not_started's is of the notebook's time.)"""
    return _without_steps(arm, label, "no_op", f"every change is a no-op here ({reason})", {"not_trained": reason},
                          comparison)


def not_started(cfg: TrainConfig, label: str, reason: str, comparison: str | None = None) -> RunResult:
    """The result of a run the notebook's budget did not let start: time_limited, no step, the reason."""
    result = _without_steps(cfg, label, "time_limited", reason, {}, comparison)
    result.budget_cut = budget.NOT_STARTED
    return result


def _without_steps(cfg: TrainConfig, label: str, status: str, error: str, extras: dict[str, Any],
                   comparison: str | None = None) -> RunResult:
    """A result of `cfg` that took no step: its status and why, with the device's facts a reader formats."""
    dev = resolve_device(cfg.device)
    result = RunResult(config=cfg.to_dict(), label=label, status=status, error=error, no_ops=no_op_reasons(cfg, dev),
                       env=environment(dev, cfg.profile), images_per_step=cfg.batch_size * cfg.grad_accum_steps,
                       extras=extras)
    if comparison:
        result.comparison = comparison
    return result


def describe_changes(changes: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in changes.items()) or "baseline"


__all__ = ["run", "compare", "sweep", "interleave", "describe_changes", "active_run", "exclusive_run", "TrainingRun",
           "Checkpoints", "ImageSet"]
