"""A registry of the notebooks' comparisons, so the same runs can be repeated anywhere.

A notebook calls run_comparison("01_data_loading:num_workers"); the GPU reference script calls every
registered comparison with the gpu profile and bundles what it measured. Each result is tagged with
its comparison's name, which is how bundled reference results are matched to a notebook's runs.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable

from .config import TrainConfig, config_for
from .results import RunResult

ComparisonFn = Callable[..., list[RunResult]]
REGISTRY: dict[str, ComparisonFn] = {}


def comparison(name: str) -> Callable[[ComparisonFn], ComparisonFn]:
    """Register fn(base: TrainConfig, progress: bool = True) -> list[RunResult] under `name`."""
    if ":" not in name:
        raise ValueError(f"comparison names look like 'NN_notebook:what', got {name!r}")

    def register(fn: ComparisonFn) -> ComparisonFn:
        REGISTRY[name] = fn
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
    results = found[name](base or config_for(), progress=progress)
    for r in results:
        r.extras["comparison"] = name
    return results
