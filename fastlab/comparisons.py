"""A notebook's comparison is a plain function it calls: `mixed_precision.compare_precision(cfg)`.

@comparison(name, arms=...) wraps a lesson's function fn(base, progress=True, **options) -> list[RunResult]:
calling it sizes `base` by time first (fastlab.calibration: every arm built from it gets the same steps, and each
result records the calibration in extras["calibration"]), then tags each result with the comparison's name
(extras["comparison"]), which is how bundled reference results are matched to a notebook's runs. Nothing is
registered: the GPU reference run (fastlab.tools.reference_run) holds its own explicit list of what it repeats.

run_arms runs a comparison's arms, except those that can teach nothing here: an arm whose every changed knob is a
no-op on this device is not trained (its result says no-op and why), and an arm that is a known trap on this device
(bf16 autocast on a CPU without native bf16) runs once, short, as a demonstration instead of once per seed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from .arm_plans import demonstration_config, not_trained, plan_arm
from .calibration import sized
from .config import TrainConfig, comparison_repeats, config_for
from .results import RunResult

ComparisonFn = Callable[..., list[RunResult]]
Arms = int | Callable[[TrainConfig], int] | None


class NamedComparison(Protocol):
    """A lesson's comparison as @comparison returns it: call it with a config; it carries its name and sizing."""

    name: str
    arms: Arms  # runs sharing the comparison's time (or a function of the base config giving it); None: not sized
    repeated: bool

    def __call__(self, base: TrainConfig | None = None, progress: bool = True, **options: Any) -> list[RunResult]: ...


def comparison(name: str, arms: Arms = None, repeated: bool = True) -> Callable[[ComparisonFn], NamedComparison]:
    """Wrap fn(base: TrainConfig, progress: bool = True, **options) -> list[RunResult] as the comparison `name`.
    `arms`: how many runs share the comparison's time (config.TIME_SIZING), a function of the base config giving
    that number (a sweep whose values depend on the machine), or None where its steps are not sized
    by time (time to accuracy trains until a target within the profile's max_steps; a ladder sizes its own rungs);
    repeated: whether each arm runs the profile's comparison_repeats times (interleaved), False for one run each
    (e.g. one per seed, already counted in `arms`)."""
    if ":" not in name:
        raise ValueError(f"comparison names look like 'NN_notebook:what', got {name!r}")
    if arms is not None and not callable(arms) and (isinstance(arms, bool) or not isinstance(arms, int) or arms < 1):
        raise ValueError(f"comparison({name!r}, arms={arms!r}) is not allowed: None, an integer >= 1 or a function "
                         f"of the base config")

    def named(fn: ComparisonFn) -> NamedComparison:
        @functools.wraps(fn)
        def sized_and_tagged(base: TrainConfig | None = None, progress: bool = True,
                             **options: Any) -> list[RunResult]:
            base = base or config_for()
            calibration = None
            if arms is not None:
                count = arms(base) if callable(arms) else arms
                base, calibration = sized(base, max(1, count) * (comparison_repeats(base) if repeated else 1))
            results = fn(base, progress=progress, **options)
            for r in results:
                r.extras["comparison"] = name
                if calibration is not None:
                    r.extras["calibration"] = calibration
            return results

        wrapped: Any = sized_and_tagged
        wrapped.name, wrapped.arms, wrapped.repeated = name, arms, repeated
        return wrapped

    return named


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

