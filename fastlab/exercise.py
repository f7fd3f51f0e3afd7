"""Write it yourself: a notebook gives a plain loop, the learner edits a copy, `fastlab.watch` measures both.

    def given(w):                       # the plain loop, in a cell
        for x, y in w(loader):
            with w.step(len(x)) as s:
                ...; s.loss = loss
    def mine(w): ...                    # the learner's edited copy
    def solution(w): ...                # the worked answer (a collapsed cell)
    exercise.check(given, exercise.pick(mine, solution))   # measured in turns, worded by the noise rule
    print(exercise.solution_diff(given, solution))         # the answer, as the lines that changed

Which loop is measured: the learner's, unless `solution_runs()` says the solution should be (FASTLAB_SOLUTION=1,
or the smoke profile, which is what nbval and CI run: nobody edits a cell there, and the solution must run).
FASTLAB_SOLUTION=0 measures the learner's loop even under smoke.
"""

from __future__ import annotations

import ast
import inspect
import os
import textwrap
from typing import Any

from .code import CodeDiff
from .config import TrainConfig, active_profile
from .watch import LoopComparison, LoopFn, compare_loops

SOLUTION_ENV = "FASTLAB_SOLUTION"  # "1": measure the worked solution; "0": the learner's loop, whatever the profile


def solution_runs() -> bool:
    """Whether an exercise measures its worked solution instead of the learner's loop (see the module's text)."""
    flag = os.environ.get(SOLUTION_ENV, "").strip()
    if flag in ("0", "1"):
        return flag == "1"
    return active_profile() == "smoke"


def images(cfg: TrainConfig, batches: int | None = None) -> int:
    """How many training images an exercise's loop uses: `batches` of cfg.batch_size (8 under smoke, so a
    notebook stays short; 20 elsewhere: three timed windows of 5 after the warm-up, for the noise rule)."""
    if batches is None:
        batches = 8 if active_profile() == "smoke" else 20
    return batches * cfg.batch_size


def pick(mine: LoopFn, solution: LoopFn) -> LoopFn:
    """The loop to measure: the solution when `solution_runs()`, else the learner's; says which it is."""
    chosen = solution if solution_runs() else mine
    why = (f"the worked solution ({SOLUTION_ENV}=1 or the smoke profile; {SOLUTION_ENV}=0 measures yours)"
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
    """The function's body as Python reads it: comments, blank lines and line breaks do not count."""
    tree = ast.parse(loop_source(fn))
    body = next(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))).body
    return ast.dump(ast.Module(body=body, type_ignores=[]))


def unchanged(given: LoopFn, mine: LoopFn) -> bool:
    """True when the learner's loop runs the same code as the given one (its name, comments and layout aside):
    an edit that changes no statement has nothing to measure."""
    return _statements(given) == _statements(mine)


def check(given: LoopFn, mine: LoopFn, *, repeats: int | None = None, labels: tuple[str, str] | None = None,
          **options: Any) -> LoopComparison | None:
    """Measure `mine` against the unedited `given` with fastlab.compare_loops (in turns, the noise rule), print the
    verdict and return the comparison; None, with the reason, when `mine` is still the given loop.
    repeats: 1 under smoke (a few steps, to keep the notebook short), else 2 (the pairs the noise rule compares; a
    run of the exercise stays within seconds on a laptop's CPU). options: as for fastlab.watch."""
    if unchanged(given, mine):
        print(f"{_name(mine)} runs the same code as {_name(given)} (comments and layout aside): edit it to add the "
              f"technique, then run this cell again (nothing was measured)")
        return None
    if repeats is None:
        repeats = 1 if active_profile() == "smoke" else 2
    labels = labels or (f"{_name(given)} (as given)", _name(mine))
    options.setdefault("window_steps", 2 if active_profile() == "smoke" else 5)
    options.setdefault("warmup_steps", 1 if active_profile() == "smoke" else 3)
    result = compare_loops(given, mine, repeats=repeats, labels=labels, **options)
    print(result.text())
    return result


__all__ = ["SOLUTION_ENV", "check", "images", "loop_source", "pick", "solution_diff", "solution_runs", "unchanged"]
