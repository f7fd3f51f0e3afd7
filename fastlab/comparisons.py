"""A notebook's comparison is a plain function it calls: `mixed_precision.compare_precision(cfg)`.

@comparison(name, arms=...) wraps a lesson's function: calling it sizes `base` by time (fastlab.calibration), then
tags each result with the name (RunResult.comparison) that matches bundled reference results to a notebook's runs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol

from . import budget
from .calibration import sized
from .config import TrainConfig, comparison_repeats, config_for, time_sizing
from .results import RunResult

ComparisonFn = Callable[..., list[RunResult]]
Arms = int | Callable[[TrainConfig], int] | None


class NamedComparison(Protocol):
    """A lesson's comparison as @comparison returns it: call it with a config; it carries its name and sizing."""

    name: str
    arms: Arms  # runs sharing the comparison's time (or a function of the base config giving it); None: not sized
    repeated: bool

    def __call__(self, base: TrainConfig | None = None, progress: bool = True, **options: Any) -> list[RunResult]: ...


REGISTERED: dict[str, NamedComparison] = {}  # every comparison by name: a notebook's share its budget among them


def fit_to_budget(name: str, base: TrainConfig, runs_per_repeat: int, repeats: int,
                  calibration: dict[str, Any]) -> tuple[TrainConfig, int | None]:
    """`base` with the timed steps, and the repeats (None: not cut), that fit the comparison's share of the
    notebook's budget (fastlab.budget); each cut is said in one line."""
    share = budget.share_of(name)
    sizing = time_sizing(base.profile)
    if share is None or sizing is None:
        return base, None
    fit = budget.fit(share, runs_per_repeat=runs_per_repeat, repeats=repeats, steps=base.steps,
                     fewest_steps=max(base.windows, int(sizing["min_steps"])), warmup_steps=base.warmup_steps,
                     step_seconds=calibration["step_seconds"], eval_batches=-(-base.eval_images // base.batch_size))
    if fit.line:
        print(f"{name}: {fit.line}", flush=True)
        calibration.update(budget_cuts=list(fit.cuts), budget_share_seconds=round(fit.share_seconds, 1))
    return base.replace(steps=fit.steps), (fit.repeats if fit.repeats < repeats else None)


def comparison(name: str, arms: Arms = None, repeated: bool = True) -> Callable[[ComparisonFn], NamedComparison]:
    """Wrap fn(base: TrainConfig, progress: bool = True, **options) -> list[RunResult] as the comparison `name`.
    arms: how many runs share the comparison's time (Profile.time_sizing), a function of the base config giving it,
    or None where steps are not sized by time. repeated: whether each arm runs the profile's comparison_repeats
    times (interleaved); False for one run each (e.g. one per seed, already counted in `arms`)."""
    if ":" not in name:
        raise ValueError(f"comparison names look like 'NN_notebook:what', got {name!r}")
    if not (arms is None or callable(arms) or (type(arms) is int and arms >= 1)):
        raise ValueError(f"comparison({name!r}, arms={arms!r}) is not allowed: None, an integer >= 1 or a function "
                         f"of the base config")

    def named(fn: ComparisonFn) -> NamedComparison:
        @functools.wraps(fn)
        def sized_and_tagged(base: TrainConfig | None = None, progress: bool = True,
                             **options: Any) -> list[RunResult]:
            base, calibration, cap = base or config_for(), None, None
            share = budget.share_of(name)
            if arms is not None:
                count, repeats = max(1, arms(base) if callable(arms) else arms), comparison_repeats(base)
                base, calibration = sized(base, count * (repeats if repeated else 1))
                if calibration is not None:
                    base, cap = fit_to_budget(name, base, count, repeats if repeated else 1, calibration)
            with budget.within(name, cap if repeated else None, share):
                results = fn(base, progress=progress, **options)
            for r in results:
                r.comparison = name
                if calibration is not None:
                    r.extras["calibration"] = calibration
            return results

        wrapped: Any = sized_and_tagged
        wrapped.name, wrapped.arms, wrapped.repeated = name, arms, repeated
        REGISTERED[name] = wrapped
        budget.part(name)
        return wrapped

    return named
