"""How long each notebook's fast version should take on the GPU the bundled reference results were measured on (an
NVIDIA H200, fastlab/reference/nvidia-h200.json), from the profile's sizes alone: `python tests/gpu_estimate.py gpu`.
So the sizes can be checked against the 3-minute (a notebook) and 25-minute (the workbook) targets without a GPU at
hand. A maintainers' instrument (tests/gpu_notebooks.py orders a lent GPU's notebooks by it), not the reader's package.

The model is the one the notebook's budget (fastlab.budget) applies: each registered comparison is sized by time
(calibration.steps_for at the calibrated step) and cut to its share of the notebook's budget (budget.fit); its runs
then take their steps at the reference's wall time per timed step (a step's window plus its loss reads and logging),
plus warm-up, evaluation and set-up. A comparison not sized by time takes its reference runs' measured walls where the
reference has them, else its whole share (the budget refuses its runs after that). The notebook's own single runs
are not counted: NOTEBOOK_START_SECONDS stands for a kernel's start, its imports and those cells.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fastlab
from fastlab import budget, exercise, lessons  # noqa: F401  (exercise declares each notebook's exercise a part of its budget)
from fastlab.budget import parts_of
from fastlab.calibration import WORKLOAD_FIELDS
from fastlab.comparisons import REGISTERED
from fastlab.config import TrainConfig, comparison_repeats, config_for, thorough, time_sizing
from fastlab.measure import assumed_cores

REFERENCE = Path(fastlab.__file__).parent / "reference" / "nvidia-h200.json"
NOTEBOOK_START_SECONDS = 20.0  # a kernel's start and imports, the first cell's calibration, the cells' own runs
CALIBRATION_RUNS = 1  # a comparison's calibration: one short run (cached per workload after the first)


def _compiled_arms(base: TrainConfig) -> int:
    # here: a lesson imports fastlab.plots (matplotlib); like estimate_notebooks, this module loads the lessons only
    # when it estimates, so importing it stays light
    from fastlab.lessons.compile_export import modes_plan

    return len(modes_plan(base)[0]) - 1  # eager is not compiled


# Comparisons whose arms compile (warm-up beyond their steps: the reference's longest compile warm-up each).
COMPILED_ARMS = {"07_compile_and_export:modes": _compiled_arms}


@dataclass(frozen=True)
class StepTimes:
    """A GPU's step times as measured for the reference: per comparison (median over its runs) and for a workload,
    each as (calibrated step: a window's, wall per timed step: the run's timed seconds over its steps)."""

    device: str
    cores: int
    by_comparison: dict[str, tuple[float, float]]
    by_workload: dict[str, tuple[float, float]]
    run_walls: dict[str, list[float]] = field(default_factory=dict)  # comparison -> each run's measured wall
    compile_seconds: float = 0.0  # the longest warm-up of a compiled reference run
    source: str = ""

    def for_config(self, name: str, config: TrainConfig) -> tuple[float, float, str]:
        """(calibrated step, wall per step, where from) for the comparison `name` at `config`."""
        if name in self.by_comparison:
            return (*self.by_comparison[name], f"its own reference runs on the {self.device}")
        key = workload_key(config.to_dict())
        if key in self.by_workload:
            return (*self.by_workload[key], f"a reference run of the profile's workload on the {self.device}")
        slowest = max(self.by_workload.values(), key=lambda s: s[1])
        return (*slowest, f"the slowest reference run on the {self.device} (no run of this workload)")

    def slower(self, factor: float) -> StepTimes:
        """The same GPU `factor` times slower: every step and wall scaled (a constructed GPU for a test)."""
        def scale(pair: tuple[float, float]) -> tuple[float, float]:
            return pair[0] * factor, pair[1] * factor

        return StepTimes(f"{self.device} x{factor:g} slower", self.cores,
                         {k: scale(v) for k, v in self.by_comparison.items()},
                         {k: scale(v) for k, v in self.by_workload.items()},
                         {k: [w * factor for w in v] for k, v in self.run_walls.items()},
                         self.compile_seconds * factor, self.source)


def workload_key(config: dict[str, Any]) -> str:
    return json.dumps({k: config.get(k) for k in WORKLOAD_FIELDS if k != "device"}, sort_keys=True)


def load_step_times(path: Path = REFERENCE) -> StepTimes:
    """The step times of the bundled reference results (fastlab's own harness on one GPU)."""
    doc = json.loads(Path(path).read_text())
    pairs: dict[str, list[tuple[float, float]]] = {}
    work: dict[str, list[tuple[float, float]]] = {}
    walls: dict[str, list[float]] = {}
    cores, compiled = 0, 0.0
    for r in doc["results"]:
        if r["config"].get("compile", "off") != "off":
            compiled = max(compiled, r["warmup_seconds"])
        timed = r["steps_done"] - r["config"]["warmup_steps"]
        if not r.get("window_throughput") or timed <= 0:
            continue
        step = r["images_per_step"] / statistics.median(r["window_throughput"])
        pair = (step, max(step, r["timed_seconds"] / timed))
        name = r.get("comparison") or r.get("extras", {}).get("comparison", "")  # older files: in extras
        pairs.setdefault(name, []).append(pair)
        work.setdefault(workload_key(r["config"]), []).append(pair)
        walls.setdefault(name, []).append(r["warmup_seconds"] + r["timed_seconds"] + (r.get("eval_seconds") or 0)
                                          + budget.RUN_OVERHEAD_SECONDS)
        cores = max(cores, int(r.get("env", {}).get("usable_cpus") or 0))

    def median_pair(ps: list[tuple[float, float]]) -> tuple[float, float]:
        return statistics.median(p[0] for p in ps), statistics.median(p[1] for p in ps)

    return StepTimes(doc["meta"]["device"], cores or 16, {k: median_pair(v) for k, v in pairs.items()},
                     {k: median_pair(v) for k, v in work.items()}, walls, compiled,
                     f"{Path(path).name}: {doc['meta'].get('how', '')[:120]}")


@dataclass(frozen=True)
class NotebookEstimate:
    """One notebook's estimated seconds and each comparison's part (with where its step time came from)."""

    notebook: str
    seconds: float
    budget_seconds: float
    comparisons: dict[str, tuple[float, str]]


def comparison_seconds(name: str, base: TrainConfig, share: float, steps: StepTimes) -> tuple[float, str]:
    """The comparison `name`'s estimated seconds within `share`, and how it was estimated."""
    if name not in REGISTERED:  # a held part (fastlab.budget.part): an exercise's check, TTA, torchrun launches
        return share, "a held part, not sized by time, no reference run: its whole share of the budget"
    compared, sizing = REGISTERED[name], time_sizing(base.profile)
    cal, wall, where = steps.for_config(name, base)
    eval_batches = -(-base.eval_images // base.batch_size)
    if compared.arms is None:
        if steps.run_walls.get(name):
            return min(share, sum(steps.run_walls[name])), f"not sized by time: its reference runs' walls ({where})"
        return share, "not sized by time, no reference run: its whole share of the budget"
    count = max(1, compared.arms(base) if callable(compared.arms) else compared.arms)
    repeats = comparison_repeats(base) if compared.repeated else 1
    per_run = min(sizing["run_seconds"], sizing["comparison_seconds"] / (count * repeats))
    sized_steps = max(base.windows, int(sizing["min_steps"]), min(int(sizing["max_steps"]), int(per_run / cal)))
    fit = budget.fit(share, runs_per_repeat=count, repeats=repeats, steps=sized_steps,
                     fewest_steps=max(base.windows, int(sizing["min_steps"])), warmup_steps=base.warmup_steps,
                     step_seconds=cal, eval_batches=eval_batches)
    run = budget.run_seconds(wall, fit.steps, base.warmup_steps, eval_batches)
    calibration = CALIBRATION_RUNS * budget.run_seconds(cal, 4, 2)
    compiling = COMPILED_ARMS[name](base) * steps.compile_seconds if name in COMPILED_ARMS else 0.0
    done = min(count * fit.repeats * run + compiling, max(share, 0.0) + run)  # the budget refuses runs once spent
    compiled = f", {compiling:.0f} s compiling" if compiling else ""
    return calibration + done, (f"{count} arms x {fit.repeats} repeats x {fit.steps} steps{compiled}, step "
                                f"{cal * 1000:.1f} ms calibrated, {wall * 1000:.1f} ms wall ({where})")


def estimate_notebooks(profile: str = "gpu", steps: StepTimes | None = None) -> list[NotebookEstimate]:
    """Each notebook's estimated fast-version seconds on the reference GPU ([] where the profile has fixed steps)."""
    for module in pkgutil.iter_modules(lessons.__path__):  # every lesson: their comparisons register
        importlib.import_module(f"{lessons.__name__}.{module.name}")

    sizing = time_sizing(profile)
    if sizing is None:
        return []
    steps = steps or load_step_times()
    notebooks = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
    out = []
    with assumed_cores(steps.cores):
        base = config_for(profile)
        for notebook in notebooks or sorted({n.split(":")[0] for n in REGISTERED}):
            names = parts_of(notebook)
            remaining, parts = float(sizing["notebook_seconds"]) * (1 - budget.OWN_RUNS_SHARE), {}
            for i, name in enumerate(names):
                seconds, how = comparison_seconds(name, base, max(remaining, 0.0) / (len(names) - i), steps)
                parts[name] = (seconds, how)
                remaining -= seconds
            total = NOTEBOOK_START_SECONDS + sum(s for s, _ in parts.values())
            out.append(NotebookEstimate(notebook, total, float(sizing["notebook_seconds"]), parts))
    return out


def estimate_table(profile: str = "gpu", steps: StepTimes | None = None) -> str:
    """The estimates as lines a reader can check: each notebook, its comparisons, the total, and the source."""
    steps = steps or load_step_times()
    rows = estimate_notebooks(profile, steps)
    if not rows:
        return f"profile {profile} has fixed steps: nothing is sized by time, so nothing to estimate"
    lines = [f"Estimated time of each notebook's {'thorough' if thorough() else 'fast'} version on profile "
             f"{profile} on the {steps.device} (from the profile's sizes and the reference step times in "
             f"fastlab/reference/{REFERENCE.name}, fastlab's harness, labelled below; {NOTEBOOK_START_SECONDS:g} s "
             "each for a kernel's start and the cells' own runs, assumed):"]
    for e in rows:
        lines.append(f"  {e.notebook}: {budget.duration(e.seconds)} (budget {budget.duration(e.budget_seconds)})")
        lines += [f"      {n.split(':', 1)[1]}: {budget.duration(s)}: {how}" for n, (s, how) in e.comparisons.items()]
    lines.append(f"  the whole workbook: {budget.duration(sum(e.seconds for e in rows))}; the longest notebook "
                 f"{budget.duration(max(e.seconds for e in rows))}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """`python tests/gpu_estimate.py gpu`: each notebook's estimated time on the reference GPU."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("profile", nargs="?", default="gpu", help="the profile whose sizes are estimated (default gpu)")
    print(estimate_table(parser.parse_args(argv).profile))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
