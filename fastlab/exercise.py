"""Write it yourself: a notebook gives a plain loop `given(w)`, the learner edits a copy `mine(w)`, and

    exercise.check(given, exercise.pick(mine, solution), technique="workers")

measures both in turns with fastlab.watch: the technique is read by its effect on the loop the watch saw
(fastlab.loop_facts records it, fastlab.technique_readings judges it), never from the source. FASTLAB_SOLUTION=1 (CI,
`make test`) measures the worked solution.
"""

from __future__ import annotations

import ast
import inspect
import os
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import budget
from .code import CodeDiff
from .config import TrainConfig, active_profile
from .measure import Spread
from .profiles import profile
from .results import RunResult
from .technique_readings import (
    autocast_reading,
    batch_size_reading,
    channels_last_reading,
    checkpoint_reading,
    ddp_reading,
    export_reading,
    fused_in_memory_reading,
    no_grad_reading,
    paused_reading,
    profiler_reading,
    schedule_reading,
    workers_reading,
)
from .verdicts import Comparison, verdict
from .watch import LoopComparison, LoopFn, compare_loops

SOLUTION_ENV = "FASTLAB_SOLUTION"  # "1": measure the worked solution instead of the learner's loop


def solution_runs() -> bool:
    """Whether an exercise measures its worked solution instead of the learner's loop: FASTLAB_SOLUTION=1 only."""
    return os.environ.get(SOLUTION_ENV, "").strip() == "1"


def images(cfg: TrainConfig, batches: int | None = None) -> int:
    """Training images for an exercise's loop: `batches` batches (default the active profile's exercise_batches:
    smoke 8; 20 elsewhere, three timed windows of 5)."""
    if batches is None:
        batches = profile(active_profile()).exercise_batches
    return batches * cfg.batch_size


def pick(mine: LoopFn, solution: LoopFn) -> LoopFn:
    """The loop to measure: the solution when `solution_runs()`, else the learner's; says which it is."""
    chosen = solution if solution_runs() else mine
    why = (f"the worked solution ({SOLUTION_ENV}=1; without it, yours)"
           if chosen is solution else f"your loop, {_name(mine)}")
    print(f"measuring {why}")
    return chosen


def _name(fn: Any) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def loop_source(fn: LoopFn) -> str:
    """A loop function's source (dedented); a function defined in a notebook cell has one too (IPython keeps it)."""
    try:
        return textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as err:
        raise TypeError(f"exercise: the source of {_name(fn)} cannot be read ({err}); define it with def in a cell") from err


def _body(fn: LoopFn) -> str:
    """The source without its def line, so two loops of different names diff only where their bodies differ."""
    lines = loop_source(fn).splitlines()
    first = next(i for i, line in enumerate(lines) if line.lstrip().startswith("def "))
    return "\n".join(lines[first + 1:])


def solution_diff(given: LoopFn, solved: LoopFn) -> CodeDiff:
    """The lines the solution adds to and removes from the given loop (coloured in Jupyter, unified text elsewhere)."""
    return CodeDiff(_body(given), _body(solved), _name(given), _name(solved))


def _statements(fn: LoopFn) -> str:
    """The function's decorators and body as Python reads them: comments, blank lines and line breaks do not count
    (a decorator such as @torch.autocast(...) changes what runs)."""
    tree = ast.parse(loop_source(fn))
    f = next(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
    return ast.dump(ast.Module(body=[*map(ast.Expr, f.decorator_list), *f.body], type_ignores=[]))


def unchanged(given: LoopFn, mine: LoopFn) -> bool:
    """True when the learner's loop runs the same code as the given one (name, comments and layout aside)."""
    return _statements(given) == _statements(mine)


Reading = Callable[[dict, dict], tuple[bool | None, str]]


@dataclass(frozen=True)
class Technique:
    """A technique as an exercise checks it: its notebook, its line, its reading of the watch's facts, and what it
    changes."""

    notebook: str  # the notebook whose exercise it is: its check is a part of that notebook's budget
    line: str  # what to write, as the learner would
    # (the learner's loop's facts, the given loop's) -> (shown: None where nothing showed, what the watch saw in words)
    reading: Reading
    # what it changes besides speed: "memory" (peak) or "loss" (final training loss); the learning rate against
    # the batch (04) is in its reading's words
    quantity: str = "speed"


def _own(reading: Callable[[dict], tuple[bool | None, str]]) -> Reading:
    """A reading of the learner's loop alone (all but 04's, which reads the learning rate against the given loop's)."""
    return lambda mine, given: reading(mine)


TECHNIQUES: dict[str, Technique] = {
    "workers": Technique(
        "01_data_loading", "DataLoader(..., num_workers=2, pin_memory=device.type == 'cuda', persistent_workers=True)",
        _own(workers_reading)),
    "autocast": Technique(
        "02_mixed_precision", "with torch.autocast(device.type, dtype=...): around the forward and the loss (and a "
        "GradScaler for fp16)", _own(autocast_reading)),
    "channels_last": Technique(
        "03_cudnn_benchmark_and_channels_last", "model.to(device, memory_format=torch.channels_last) and x = "
        "x.contiguous(memory_format=torch.channels_last)", _own(channels_last_reading)),
    "batch_size": Technique(
        "04_batch_size", "a larger batch_size, with the learning rate scaled by the square root of its factor (Adam)",
        batch_size_reading),
    "no_grad": Technique(
        "05_no_grad_detach_item", "with torch.no_grad(): around the validation forward (and loss.detach() for a running total)",
        _own(no_grad_reading), quantity="memory"),
    "adamw_schedule": Technique(
        "06_adamw_and_schedules", "torch.optim.AdamW(..., weight_decay=1e-2) and a CosineAnnealingLR(opt, "
        "T_max=len(batches)) stepped every batch", _own(schedule_reading), quantity="loss"),
    "export": Technique(
        "07_compile_and_export", "torch.export.export(model, (example,), dynamic_shapes=...).module()",
        _own(export_reading)),
    "profiler": Technique(
        "08_profiling", "torch.profiler.profile(schedule=...) started before the loop, prof.step() in each step",
        _own(profiler_reading)),
    "fused_in_memory": Technique(
        "09_all_together", "fused=True in AdamW, and batches indexed from tensors in memory instead of a DataLoader",
        _own(fused_in_memory_reading)),
    "paused": Technique("10_your_own_model", "with w.paused(): around the evaluation", _own(paused_reading)),
    "ddp": Technique(
        "11_multi_gpu_ddp", "model = DistributedDataParallel(model) after dist.init_process_group(...)",
        _own(ddp_reading)),
    "checkpoint": Technique(
        "12_memory", "h = checkpoint(block, h, use_reentrant=False) for the blocks", _own(checkpoint_reading),
        quantity="memory"),
}
EXERCISE_PARTS = [budget.part(f"{t.notebook}:exercise") for t in TECHNIQUES.values()]  # one per notebook


def brief(technique: str, *, trap: str | None = None, helps: str = "") -> str:
    """What an exercise asks, printed where it is given: the technique's line. Where this machine marks the technique
    a known trap (trap: why, from config.trap_reasons), it says so, that the learner's loop will then run slower
    (the check still says whether it is written correctly), and what helps here instead."""
    t = TECHNIQUES[technique]
    ask = f"write it yourself: {t.line}"
    if trap is None:
        return ask
    return (f"{ask}\nON THIS MACHINE IT IS A KNOWN TRAP: {trap}.\nSo your loop will run slower than the given one: the "
            f"check still says whether you wrote it correctly (the watch sees it in the first step) and measures by "
            f"how much it is slower here.\nWhat helps here instead: {helps or 'leave it out on this machine'}.")


def technique_shown(technique: str, comparison: LoopComparison) -> tuple[bool | None, str]:
    """Whether the edited loop's first step shows `technique` (TECHNIQUES), and what the watch saw, in words."""
    t = TECHNIQUES[technique]
    mine, given = (runs[0].extras.get("watch", {}).get("facts") for runs in (comparison.after, comparison.before))
    if not mine or not given:
        return None, "the watch saw no step"
    return t.reading(mine, given)


def _lower_is_better(comparison: LoopComparison, read: Callable[[RunResult], float | None], unit: str,
                     quantity: str, fmt: str) -> Comparison:
    """One value read from each run of both sides, lower is better, by the one noise rule."""
    def side(runs: list[RunResult]) -> Spread:
        return Spread.of([v for r in runs if (v := read(r)) is not None])

    return verdict(side(comparison.before), side(comparison.after), unit, higher_is_better=False,
                   quantity=quantity, fmt=fmt)


def peak_memory(comparison: LoopComparison) -> Comparison:
    """The two sides' training peak memory (MiB; each run's own peak)."""
    return _lower_is_better(comparison, lambda r: r.peak_memory_mb, "MiB", "peak memory", ",.1f")


def saved_activations(comparison: LoopComparison) -> Comparison:
    """Activations saved for backward in each run's first step (MiB): exact where a CPU's resident set is not."""
    return _lower_is_better(comparison, lambda r: (r.extras.get("watch", {}).get("facts") or {}).get("saved_mb"),
                            "MiB", "activations saved for backward (first step)", ",.1f")


def final_loss(comparison: LoopComparison) -> Comparison:
    """Each run's last logged training loss."""
    return _lower_is_better(comparison, lambda r: r.losses[-1][1] if r.losses else None, "", "final training loss",
                            ".3f")


def check(given: LoopFn, mine: LoopFn, *, technique: str | None = None, repeats: int = 2,
          labels: tuple[str, str] | None = None, **options: Any) -> LoopComparison | None:
    """Measure `mine` against `given` in `repeats` interleaved pairs; print whether it shows `technique` (a key of
    TECHNIQUES) and the verdict on what that changes. None when `mine` is unchanged; options: as for fastlab.watch."""
    if technique is not None and technique not in TECHNIQUES:
        raise ValueError(f"exercise.check(technique={technique!r}) is not allowed: one of {', '.join(TECHNIQUES)}")
    t = TECHNIQUES[technique] if technique is not None else None
    if unchanged(given, mine):
        print(f"{_name(mine)} runs the same code as {_name(given)} (comments and layout aside): nothing was "
              f"measured. " + (f"The technique's line is missing: {t.line}" if t else "Edit it to add the technique")
              + ", then run this cell again")
        return None
    labels = labels or (f"{_name(given)} (as given)", _name(mine))
    preset = profile(active_profile())
    options.setdefault("window_steps", preset.exercise_window_steps)
    options.setdefault("warmup_steps", preset.exercise_warmup_steps)
    b = budget.active()
    part = f"{t.notebook if t else b.notebook}:exercise" if b else ""  # (no budget: within and share_of do nothing)
    with budget.held(part):  # held to its share of the notebook's budget
        result = compare_loops(given, mine, repeats=repeats, labels=labels, facts=t is not None, **options)
    lines = []
    if result.not_compared == "not run":  # the notebook's budget was spent: nothing of the loops was seen
        print(result.text())
        return result
    if t is not None:
        shown, seen = technique_shown(technique, result)
        result.technique = (technique, shown)
        lines.append({True: f"the technique is in {_name(mine)}: the watch saw {seen}",
                      False: f"the technique is missing from {_name(mine)}: the watch saw {seen}; write {t.line}",
                      None: f"the watch could not see the technique in {_name(mine)} ({seen})"}[shown])
        if t.quantity == "memory":
            lines.append(f"  training peak memory: {peak_memory(result).words}")
            lines.append(f"  activations saved for backward: {saved_activations(result).words}")
        elif t.quantity == "loss":
            lines.append(f"  final training loss: {final_loss(result).words}")
    print("\n".join([result.text(), *lines]))
    return result


__all__ = ["SOLUTION_ENV", "TECHNIQUES", "Technique", "brief", "check", "final_loss", "images", "loop_source",
           "peak_memory", "pick", "saved_activations",
           "solution_diff", "solution_runs", "technique_shown", "unchanged"]
