"""A registry of the notebooks' comparisons, so the same runs can be repeated anywhere.

A notebook calls run_comparison("01_data_loading:num_workers"); the GPU reference script calls every
registered comparison with the gpu profile and bundles what it measured. Each result is tagged with
its comparison's name, which is how bundled reference results are matched to a notebook's runs.

run_comparison sizes the comparison's baseline by time first (fastlab.calibration: every arm built from it gets
the same steps, and each result records the calibration). run_arms runs a comparison's arms, except those
that can teach nothing here: an arm whose every changed knob is a no-op on this device is not trained (its
result says no-op and why), and an arm that is a known trap on this device (bf16 autocast on a CPU without
native bf16) runs once, short, as a demonstration instead of once per seed.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .config import TrainConfig, comparison_repeats, config_for
from .device_support import no_op_reasons, trap_reasons
from .measure import resolve_device
from .results import RunResult

ComparisonFn = Callable[..., list[RunResult]]
REGISTRY: dict[str, ComparisonFn] = {}
# name -> the number of runs its time is shared among (None: its steps are not sized by time: time-to-accuracy
# keeps its own rules, training until a target within the profile's max_steps, and a comparison not yet declared
# keeps the profile's steps)
ARMS: dict[str, int | None] = {}
REPEATED: dict[str, bool] = {}


def comparison(name: str, arms: int | None = None, repeated: bool = True) -> Callable[[ComparisonFn], ComparisonFn]:
    """Register fn(base: TrainConfig, progress: bool = True) -> list[RunResult] under `name`. `arms`: how many
    runs share the comparison's time (config.TIME_SIZING), or None where the steps are not sized by time;
    repeated: whether each arm runs the profile's comparison_repeats times (interleaved), False for one run each
    (e.g. one per seed, already counted in `arms`)."""
    if ":" not in name:
        raise ValueError(f"comparison names look like 'NN_notebook:what', got {name!r}")
    if arms is not None and (isinstance(arms, bool) or not isinstance(arms, int) or arms < 1):
        raise ValueError(f"comparison({name!r}, arms={arms!r}) is not allowed: None or an integer >= 1")

    def register(fn: ComparisonFn) -> ComparisonFn:
        REGISTRY[name] = fn
        ARMS[name] = arms
        REPEATED[name] = repeated
        return fn

    return register


def all_comparisons() -> dict[str, ComparisonFn]:
    """Every registered comparison (importing each module of fastlab.lessons first)."""
    from . import lessons

    for info in pkgutil.iter_modules(lessons.__path__):
        importlib.import_module(f"{lessons.__name__}.{info.name}")
    return dict(sorted(REGISTRY.items()))


def run_comparison(name: str, base: TrainConfig | None = None, progress: bool = True) -> list[RunResult]:
    """Run one registered comparison on `base` (default: the active profile) and tag its results."""
    found = all_comparisons()
    if name not in found:
        raise ValueError(f"unknown comparison {name!r}; registered: {', '.join(found) or 'none'}")
    base = base or config_for()
    calibration = None
    if ARMS.get(name) is not None:
        from .calibration import sized

        runs = ARMS[name] * (comparison_repeats(base) if REPEATED.get(name, True) else 1)
        base, calibration = sized(base, runs)
    results = found[name](base, progress=progress)
    for r in results:
        r.extras["comparison"] = name
        if calibration is not None:
            r.extras["calibration"] = calibration
    return results


# ------------------------------------------------------------------ arms that can teach nothing here

# Fields an arm may differ in without being a different computation (the seed, the labels' budget).
_NOT_KNOBS = ("seed", "max_seconds", "profile")
DEMONSTRATION_STEPS = 3  # timed steps of a trap's one demonstration run (enough for a median step time)


@dataclass(frozen=True)
class ArmPlan:
    """What to do with one arm: "train" it, skip it as a "no-op" here, or run it once as a "trap" demonstration."""

    kind: str
    reason: str = ""


def plan_arm(baseline: TrainConfig, arm: TrainConfig, device: torch.device | str | None = None) -> ArmPlan:
    """How to run `arm` against `baseline` on `device` (default: the arm's). A knob counts as a no-op when it is
    one in either direction (set in the arm, or set in the baseline and undone by the arm)."""
    dev = resolve_device(arm.device) if device is None else torch.device(device)
    changed = [k for k in baseline.diff(arm) if k not in _NOT_KNOBS]
    if not changed:
        return ArmPlan("train")  # the baseline itself (or a repeat of it with another seed)
    idle = {**no_op_reasons(baseline, dev), **no_op_reasons(arm, dev)}
    if all(k in idle for k in changed):
        return ArmPlan("no-op", "; ".join(f"{k}: {idle[k]}" for k in changed))
    traps = trap_reasons(arm, dev)
    hit = [k for k in changed if k in traps]
    if hit:
        return ArmPlan("trap", "; ".join(f"{k}: {traps[k]}" for k in hit))
    return ArmPlan("train")


def not_trained(arm: TrainConfig, label: str, reason: str) -> RunResult:
    """The result of an arm that was not trained because it could teach nothing here: status "no_op", the reason."""
    dev = resolve_device(arm.device)
    from .measure import environment

    return RunResult(config=arm.to_dict(), label=label, status="no_op",
                     error=f"every change is a no-op here ({reason})",
                     no_ops=no_op_reasons(arm, dev), env=environment(dev, arm.profile),
                     images_per_step=arm.batch_size * arm.grad_accum_steps, extras={"not_trained": reason})


def demonstration_config(arm: TrainConfig) -> TrainConfig:
    """A trap's demonstration run: one warm-up step, DEMONSTRATION_STEPS timed ones in one window, and one
    batch of held-out images (its accuracy after so few steps says nothing; its step time says it all)."""
    return arm.replace(warmup_steps=1, steps=DEMONSTRATION_STEPS, windows=1,
                       eval_images=min(arm.eval_images, arm.batch_size))


def run_arms(baseline: TrainConfig, arms: Sequence[tuple[str, TrainConfig]], seeds: Sequence[int] | None = None,
             progress: bool = True, device: torch.device | str | None = None,
             runner: Callable[..., RunResult] | None = None) -> list[RunResult]:
    """Each arm (label, config), planned by plan_arm against `baseline`: a no-op arm is not trained (one
    not_trained result), a trap runs once, short (extras["trap"] says why), and the others train: with `seeds`,
    once per seed, one after another (accuracy over seeds); without, interleaved with the profile's repeats
    (train.interleave), or once each through `runner` when one is given. Results come in the arms' order and
    carry extras["variant"] = the arm's label. Stops, keeping what ran, when a run is interrupted."""
    from . import train

    plans = [(label, cfg, plan_arm(baseline, cfg, device)) for label, cfg in arms]
    done: dict[int, list[RunResult]] = {}
    for i, (label, cfg, plan) in enumerate(plans):
        if plan.kind == "no-op":
            done[i] = [not_trained(cfg, label, plan.reason)]
        elif plan.kind == "trap":
            demo = (runner or train.run)(demonstration_config(cfg), label=f"{label} (trap demonstration, one short "
                                         f"run)", progress=progress)
            demo.extras["trap"] = plan.reason
            done[i] = [demo]
    trained = [i for i, (_, _, plan) in enumerate(plans) if plan.kind == "train"]
    if seeds is None and runner is None:
        ran = train.interleave([plans[i][:2] for i in trained], progress=progress) if trained else []
        done.update({i: [r] for i, r in zip(trained, ran)})
    else:
        for i in trained:
            label, cfg, _ = plans[i]
            done[i] = []
            for seed in (seeds if seeds is not None else (cfg.seed,)):
                name = f"{label} (seed {seed})" if seeds is not None else label
                done[i].append((runner or train.run)(cfg.replace(seed=seed), label=name, progress=progress))
                if done[i][-1].status == "interrupted":
                    break
            if done[i][-1].status == "interrupted":
                break
    return [_tagged(r, plans[i][0]) for i in sorted(done) for r in done[i]]


def _tagged(result: RunResult, variant: str) -> RunResult:
    result.extras["variant"] = variant
    return result

