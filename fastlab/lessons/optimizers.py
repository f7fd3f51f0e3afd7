"""Notebook 06: Adam vs AdamW vs SGD with momentum, learning-rate schedules, and the optimiser step's implementation.

Accuracy comparisons repeat over seeds where the profile allows (SEEDS); the step-implementation
comparison times optimizer.step() alone in a micro-benchmark (synchronised, warm-up excluded, median
with min and max), besides the sampled share that every run records.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from ..comparisons import comparison
from ..config import CHOICES, TrainConfig
from ..measure import Spread, is_noise, resolve_device, synchronize, verdict
from ..models import build_model
from ..plots import data_note  # the same "SYNTHETIC data on <device>" note as every fastlab plot
from ..results import RunResult
from ..train import TrainingRun, run, sweep

# Sensible settings per optimiser, as plain data.
# - Adam's weight_decay is L2 added to the gradient, then divided by the adaptive scale: keep it small.
# - AdamW decouples it (p -= lr * wd * p, outside the adaptive scale), so a typical value is much larger.
# - SGD's step is lr x gradient with no adaptive scaling: it needs a far larger lr than Adam; momentum 0.9
#   (fastlab uses Nesterov momentum).
OPTIMIZER_PRESETS: dict[str, dict[str, Any]] = {
    "adam": {"optimizer": "adam", "lr": 2e-3, "weight_decay": 5e-4},
    "adamw": {"optimizer": "adamw", "lr": 2e-3, "weight_decay": 0.05},
    "sgd": {"optimizer": "sgd", "lr": 0.05, "weight_decay": 5e-4, "momentum": 0.9},
}

# Seeds per profile for accuracy comparisons: with one seed there is no spread, and a notebook says so.
SEEDS: dict[str, tuple[int, ...]] = {"smoke": (0,), "cpu": (0, 1), "gpu": (0, 1, 2)}
SCHEDULES = ("none", "cosine", "onecycle")
OPT_IMPLS = ("for-loop", "foreach", "fused")


def preset(base: TrainConfig, name: str) -> TrainConfig:
    """base with the OPTIMIZER_PRESETS settings of optimiser `name`."""
    if name not in OPTIMIZER_PRESETS:
        raise ValueError(f"preset: name={name!r} is not allowed: choose one of "
                         f"{', '.join(map(repr, OPTIMIZER_PRESETS))}")
    return base.replace(**OPTIMIZER_PRESETS[name])


def seeds_for(base: TrainConfig) -> tuple[int, ...]:
    return SEEDS.get(base.profile, (base.seed,))


def _over_seeds(configs: list[tuple[str, TrainConfig]], seeds: tuple[int, ...], progress: bool) -> list[RunResult]:
    results = []
    for seed in seeds:  # seed-major, so a slow spell of the machine touches every variant alike
        for label, cfg in configs:
            r = run(cfg.replace(seed=seed), label=label if len(seeds) == 1 else f"{label} seed {seed}",
                    progress=progress)
            r.extras["variant"] = label
            results.append(r)
            if r.status == "interrupted":
                return results
    return results


@comparison("06_adamw_and_schedules:optimizers")
def optimizers(base: TrainConfig, progress: bool = True) -> list[RunResult]:
    """Adam, AdamW and SGD with momentum, each with its preset, over seeds_for(base)."""
    return _over_seeds([(name, preset(base, name)) for name in OPTIMIZER_PRESETS], seeds_for(base), progress)


@comparison("06_adamw_and_schedules:schedules")
def schedules(base: TrainConfig, progress: bool = True) -> list[RunResult]:
    """AdamW with a constant learning rate, cosine annealing, and one-cycle, over seeds_for(base)."""
    adamw = preset(base, "adamw")
    return _over_seeds([(f"adamw, {s}" if s != "none" else "adamw, constant", adamw.replace(scheduler=s))
                        for s in SCHEDULES], seeds_for(base), progress)


@comparison("06_adamw_and_schedules:opt_impl")
def opt_impls(base: TrainConfig, progress: bool = True) -> list[RunResult]:
    """AdamW with a for-loop, foreach and fused optimiser step (the step's share is sampled in warm-up)."""
    return sweep("opt_impl", list(OPT_IMPLS), preset(base, "adamw"), progress=progress)


def variant(result: RunResult) -> str:
    return result.extras.get("variant", result.label)


def accuracy_by_variant(results: list[RunResult]) -> dict[str, Spread]:
    """Held-out accuracy per variant (optimiser or schedule): median, min and max over seeds."""
    out: dict[str, list[float]] = {}
    for r in results:
        if r.eval_accuracy is not None:
            out.setdefault(variant(r), []).append(r.eval_accuracy)
    return {k: Spread.of(v) for k, v in out.items()}


def describe_accuracy(results: list[RunResult]) -> str:
    """Accuracy per variant, training wall time, and each variant against the first (noise when spreads overlap)."""
    acc = accuracy_by_variant(results)
    seconds: dict[str, list[float]] = {}
    for r in results:
        seconds.setdefault(variant(r), []).append(sum(r.step_seconds))
    names = list(acc)
    lines = []
    for name in names:
        a = acc[name]
        t = Spread.of(seconds[name])
        line = f"{name}: held-out accuracy {a.median:.1%}"
        line += f" (min {a.low:.1%}, max {a.high:.1%}, {a.n} seeds)" if a.n > 1 else " (1 seed: no spread)"
        line += f", training wall time {t.median:.1f} s"
        if name != names[0]:
            first = acc[names[0]]
            if a.n > 1 and first.n > 1:
                word = "noise" if is_noise(first, a) else f"{100 * (a.median - first.median):+.1f} points"
            else:
                word = f"{100 * (a.median - first.median):+.1f} points, one seed each: cannot tell it from noise"
            line += f"; against {names[0]}: {word}"
        lines.append(line)
    return "\n".join(lines)


def plot_accuracy_vs_time(results: list[RunResult], title: str = ""):
    """Held-out accuracy against training wall time, one marker per run, one colour per variant."""
    from ..plots import ShownFigure as Figure

    fig = Figure(figsize=(6.5, 3.8))
    ax = fig.subplots()
    for i, name in enumerate(dict.fromkeys(variant(r) for r in results)):
        rs = [r for r in results if variant(r) == name and r.eval_accuracy is not None]
        ax.scatter([sum(r.step_seconds) for r in rs], [100 * r.eval_accuracy for r in rs], label=name,
                   color=f"C{i}", s=40)
    ax.set_xlabel("training wall time, s (warm-up included, evaluation excluded)")
    ax.set_ylabel("held-out accuracy, %")
    ax.legend(fontsize=8)
    ax.set_title(f"{title + ' - ' if title else ''}accuracy against time\n{data_note(results)}", fontsize=10)
    fig.tight_layout()
    return fig


def describe_sampled_share(results: list[RunResult]) -> str:
    """The optimiser step's share of a step as every run samples it in warm-up (a few synchronised steps)."""
    lines = []
    for r in results:
        ms = Spread.of([1000 * s for s in r.optimizer_step_seconds])
        note = f" (no-op: {r.no_ops['opt_impl']})" if "opt_impl" in r.no_ops else ""
        lines.append(f"{r.label}: optimizer.step() {ms.median:.2f} ms (min {ms.low:.2f}, max {ms.high:.2f}, "
                     f"{ms.n} sampled warm-up steps), {r.optimizer_share():.0%} of a step{note}")
    return "\n".join(lines)


# ------------------------------------------------------------------ optimizer.step() alone


@dataclass(frozen=True)
class StepTiming:
    impl: str
    optimizer: str
    steps_per_second: Spread  # 1 / (seconds of one optimizer.step()), over the timed repeats
    params: int  # number of parameter tensors the step updates
    no_op: str = ""  # why the asked-for implementation could not be used here

    @property
    def milliseconds(self) -> float:
        return 1000 / self.steps_per_second.median


def time_optimizer_step(base: TrainConfig, impl: str, repeats: int = 30, warmup: int = 5) -> StepTiming:
    """Time optimizer.step() alone on base.model's parameters with random gradients.

    Each timed step is bracketed by synchronize() (so a GPU's queued work is counted); `warmup` steps
    (which allocate the optimiser state) run first and are excluded. The optimiser is built exactly as
    fastlab.run builds it, so an implementation this machine lacks falls back the same way and says so.
    """
    if impl not in CHOICES["opt_impl"]:
        raise ValueError(f"time_optimizer_step: impl={impl!r} is not allowed: choose one of "
                         f"{', '.join(map(repr, CHOICES['opt_impl']))}")
    for name, value, low in (("repeats", repeats, 1), ("warmup", warmup, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"time_optimizer_step: {name}={value!r} is not allowed: an integer >= {low}")
    cfg = base.replace(opt_impl=impl)
    device = resolve_device(cfg.device)
    torch.manual_seed(cfg.seed)
    net = build_model(cfg.model).to(device)
    builder = TrainingRun(cfg, "optimizer step", None, None, False, None, None)
    opt = builder._build_optimizer(net)
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    for p in net.parameters():
        p.grad = torch.randn(p.shape, generator=gen, device=device) * 1e-3
    times = []
    for i in range(warmup + repeats):
        synchronize(device)
        t0 = time.perf_counter()
        opt.step()
        synchronize(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return StepTiming(impl, cfg.optimizer, Spread.of([1 / t for t in times]), len(list(net.parameters())),
                      builder.no_ops.get("opt_impl", ""))


def benchmark_opt_impls(base: TrainConfig, impls: tuple[str, ...] = OPT_IMPLS, repeats: int = 30) -> list[StepTiming]:
    return [time_optimizer_step(base, impl, repeats) for impl in impls]


def describe_step_timings(timings: list[StepTiming]) -> str:
    """Each implementation's step time; each against the first (noise when inside the spread)."""
    lines = []
    first = timings[0] if timings else None
    for t in timings:
        s = t.steps_per_second
        line = (f"{t.optimizer} {t.impl}: {t.milliseconds:.2f} ms per optimizer.step() (median; min "
                f"{1000 / s.high:.2f}, max {1000 / s.low:.2f}; {s.n} repeats, {t.params} parameter tensors)")
        if t.no_op:
            line += f"\n    no-op here: {t.no_op}"
        if first is not None and t is not first:
            line += f"\n    against {first.impl}: {verdict(first.steps_per_second, s, 'steps/s')}"
        lines.append(line)
    return "\n".join(lines)


def plot_step_timings(timings: list[StepTiming], device_name: str = ""):
    """Milliseconds per optimizer.step(): median bar with min-max whiskers, per implementation."""
    from ..plots import ShownFigure as Figure

    fig = Figure(figsize=(5.5, 3.6))
    ax = fig.subplots()
    med = [t.milliseconds for t in timings]
    low = [1000 / t.steps_per_second.high for t in timings]
    high = [1000 / t.steps_per_second.low for t in timings]
    ax.bar(range(len(timings)), med, yerr=[[m - lo for m, lo in zip(med, low)], [h - m for m, h in zip(med, high)]],
           capsize=4, color=["tab:gray"] + ["tab:blue"] * (len(timings) - 1))
    ax.set_xticks(range(len(timings)))
    ax.set_xticklabels([t.impl for t in timings])
    ax.set_ylabel("ms per optimizer.step() (median, min-max)")
    name = timings[0].optimizer if timings else ""
    ax.set_title(f"{name} step alone, random gradients (no data){' on ' + device_name if device_name else ''}",
                 fontsize=10)
    fig.tight_layout()
    return fig
