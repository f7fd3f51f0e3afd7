"""A notebook's comparison is a plain function it calls: `mixed_precision.compare_precision(cfg)`.

@comparison(name, arms=...) wraps a lesson's function: calling it sizes `base` by time (fastlab.calibration), then
tags each result with the name (extras["comparison"]) that matches bundled reference results to a notebook's runs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol

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
    arms: how many runs share the comparison's time (config.TIME_SIZING), a function of the base config giving it,
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
            base, calibration = base or config_for(), None
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
