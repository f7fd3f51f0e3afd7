"""A notebook's time budget: started by its first cell (tools.timings.begin_notebook), a quarter kept for the cells'
own runs and the rest split among the notebook's comparisons before each starts (fewer timed steps, then fewer repeats, each cut said in one line), and held by
refusing to start a part's run once its share, or the whole budget, is spent. A notebook's parts that are not sized comparisons (an
exercise's check, a time-to-accuracy ladder, torchrun launches: declared with part) take their share of the split
too and are refused the same way. So no part runs past the budget by more than its longest single run. A cell's own
single run is never refused (its code formats its figures): once the budget is spent it is cut to a short run
(own_run_cut). Profiles with fixed steps (smoke, custom) have none: nothing is cut there."""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field

# A run's wall time beyond its steps: its process, data and model set up, and its held-out evaluation (a forward
# pass over eval_images, about a third of a training step's work per batch). Seen on a loaded 2-core CPU: 3-5 s.
RUN_OVERHEAD_SECONDS = 3.0
EVAL_SHARE_OF_A_STEP = 1 / 3
# The share of a notebook's budget its parts are not split: kept for the cells' own single runs, which are never cut
# (in 01 under the cpu profile at load 6 they and the imports took 130 s of its 380 s).
OWN_RUNS_SHARE = 0.25
NOT_STARTED = "not started"  # a run the spent budget did not let start (RunResult.budget_cut)
CUT = "cut to a short run"  # how a cell's own run cut by the spent budget is described (RunResult.budget_cut, summary)


@dataclass
class NotebookBudget:
    """The seconds a notebook may take on this machine, from `started` on the monotonic clock."""

    notebook: str
    profile: str
    seconds: float
    started: float
    clock: Callable[[], float] = time.monotonic
    parts_done: set[str] = field(default_factory=set)
    repeats_cap: int | None = None  # fewer interleaved repeats for the comparison running now
    running: str | None = None  # the registered comparison running now: only its runs are refused
    part_ends: float | None = None  # on `clock`, when the running part's share is spent (None: no share of its own)
    part_share: float = 0.0
    said: set[str] = field(default_factory=set)  # what was said: the budget's refusal (""), a part's (its name), the own runs' cut

    def elapsed(self) -> float:
        return self.clock() - self.started

    def remaining(self) -> float:
        return self.seconds - self.elapsed()

    def spent(self) -> bool:
        return self.remaining() <= 0

    def describe(self) -> str:
        return f"notebook {self.notebook}'s budget of {duration(self.seconds)} on profile {self.profile}"


_ACTIVE: NotebookBudget | None = None
PARTS: dict[str, list[str]] = {}  # notebook -> the parts its budget is split among ("NN_notebook:what" each)


@contextlib.contextmanager
def held(name: str) -> Iterator[None]:
    """While the part `name` runs: its runs refused once its share of the notebook's budget (share_of), or the whole
    budget, is spent (within, with no repeats to cap)."""
    with within(name, None, share_of(name)):
        yield


def part(name: str, notebook: str | None = None) -> str:
    """Declare `name` ("09_all_together:time_to_accuracy") a part of `notebook`'s budget (default: the notebook its
    name starts with; another when that notebook calls it too). fastlab.comparisons declares each registered
    comparison, fastlab.exercise each exercise's check. A part takes its share of the split (share_of), and its runs,
    started inside within(name, ...), are refused once its share or the budget is spent. Returns the name."""
    if ":" not in name:
        raise ValueError(f"part: names look like 'NN_notebook:what', got {name!r}")
    parts = PARTS.setdefault(notebook or name.split(":", 1)[0], [])
    if name not in parts:
        parts.append(name)
    return name


def parts_of(notebook: str) -> list[str]:
    """The parts `notebook`'s budget is split among: its registered comparisons, its held parts, and the parts of
    other notebooks it calls (declared with part(name, notebook))."""
    return list(PARTS.get(notebook, ()))


def share_of(name: str) -> float | None:
    """Seconds of the running notebook's remaining budget for the part `name` (None: no budget, or a part the
    running notebook did not declare)."""
    b = _ACTIVE
    return None if b is None else share_for(name, parts_of(b.notebook))


def start(notebook: str, profile: str, seconds: float | None,
          clock: Callable[[], float] = time.monotonic) -> NotebookBudget | None:
    """Start `notebook`'s budget of `seconds` now (replacing any earlier one in this kernel); None: no budget."""
    global _ACTIVE
    _ACTIVE = None if seconds is None else NotebookBudget(notebook.removesuffix(".ipynb"), profile, float(seconds),
                                                           clock(), clock)
    return _ACTIVE


def active() -> NotebookBudget | None:
    return _ACTIVE


def stop() -> None:
    """End the active budget (a test, or a notebook run outside its budget)."""
    global _ACTIVE
    _ACTIVE = None


def refusal(label: str) -> str | None:
    """Why the run `label` must not start (the notebook's budget, or the running part's share of it, is spent), or
    None. Only the runs of a part (a registered comparison, fastlab.comparisons, or a held part), whose callers take a
    run that did not start, are held to it; a cell's own single run (it formats that run's figures) and a panel's Run
    button (another thread) are never refused."""
    b = _ACTIVE
    if b is None or b.running is None or threading.current_thread() is not threading.main_thread():
        return None
    if b.spent():
        return f"{NOT_STARTED}: {b.describe()} was spent after {duration(b.elapsed())}"
    if b.part_ends is not None and b.clock() >= b.part_ends:
        return (f"{NOT_STARTED}: the share of {b.describe()} for {b.running} ({duration(b.part_share)}) was spent, "
                f"the rest kept for the notebook's other parts")
    return None


def own_run_cut(label: str) -> str | None:
    """Why a cell's own run `label` (not a part's, not another thread's) is cut to a short run
    (config.demonstration_config): the notebook's budget is spent. None: not cut. The first cut of a budget says so
    in one line (printed here); the runs after it carry the reason in their results."""
    b = _ACTIVE
    if (b is None or b.running is not None or threading.current_thread() is not threading.main_thread()
            or not b.spent()):
        return None
    reason = f"{CUT}: {b.describe()} was spent after {duration(b.elapsed())}"
    say_once("own runs", f"budget: '{label}' is {reason}, and so is every later run of this notebook's cells (one "
             "warm-up step, a few timed steps and a few held-out images: its figures rest on those; run the first "
             "cell again for a new budget)")
    return reason


FEWEST_RUN_SECONDS = 10.0  # a run's max_seconds is never cut below this to fit a part's share


def max_seconds_within(name: str, runs: int, overhead_seconds: float, max_seconds: float) -> float | None:
    """The max_seconds each of a part's next `runs` may have so that they fit what is left of its share (the part
    running now: its share's end; else share_of): (left - overhead_seconds) / runs, never below FEWEST_RUN_SECONDS.
    overhead_seconds: their wall time beyond max_seconds together (process starts, launches, evaluation). None: no cut
    (no budget, a part without a share, or max_seconds, 0 meaning none, already fits). The first cut of a part is said
    in one line."""
    b = _ACTIVE
    if b is None or runs < 1:
        return None
    left = (b.part_ends - b.clock() if b.running == name and b.part_ends is not None else share_of(name))
    if left is None:
        return None
    per_run = max(FEWEST_RUN_SECONDS, (left - overhead_seconds) / runs)
    if max_seconds and per_run >= max_seconds:
        return None
    was = f"{max_seconds:g} s" if max_seconds else "none"
    say_once(f"fit {name}", f"{name}: budget: {duration(max(0.0, left))} of this part's share is left for {runs} run"
             f"{'s' if runs > 1 else ''}, so each stops after {per_run:.0f} s (max_seconds; the profile's: {was}): "
             "fewer steps, so a smaller difference may not be told apart")
    return round(per_run, 1)


def say_once(key: str, line: str) -> None:
    """Print `line` the first time the active budget says `key` (a refusal, a part's cut, the own runs' cut); the
    runs after it carry the reason in their results."""
    b = _ACTIVE
    if b is not None and key not in b.said:
        b.said.add(key)
        print(line, flush=True)


def say_refusal(label: str, reason: str) -> None:
    """Say, once, that the budget (or the running part's share of it) is spent, at the first run it stops."""
    b = _ACTIVE
    if b is None:
        return
    whose = "" if b.spent() else (b.running or "")
    if whose:
        say_once(whose, f"budget: '{label}' {reason}: this part's later runs are not started either (each result "
                        "says so)")
    else:
        say_once("", f"budget: '{label}' {reason}, and so is every run of this notebook's cells after it (each "
                     "result says so; run the first cell again for a new budget, or set FASTLAB_THOROUGH=1 for the "
                     "thorough version)")


def repeats_cap() -> int | None:
    """The repeats the comparison running now may have under the budget (None: the profile's own)."""
    return None if _ACTIVE is None else _ACTIVE.repeats_cap


@dataclass(frozen=True)
class Fit:
    """How a comparison fits its share: its timed steps a run and repeats, and the line saying each cut."""

    steps: int
    repeats: int
    share_seconds: float
    estimate_seconds: float
    cuts: tuple[str, ...] = ()

    @property
    def line(self) -> str | None:
        if not self.cuts:
            return None
        return (f"budget: this comparison's share is {duration(self.share_seconds)}, so "
                + "; ".join(self.cuts) + f" (estimated {duration(self.estimate_seconds)} after the cuts)")


def run_seconds(step_seconds: float, steps: int, warmup_steps: int, eval_batches: int = 0) -> float:
    """A run's estimated wall time: its warm-up and timed steps at the calibrated step time, its evaluation's
    batches, and its set-up."""
    return (warmup_steps + steps + eval_batches * EVAL_SHARE_OF_A_STEP) * step_seconds + RUN_OVERHEAD_SECONDS


def fit(share: float, *, runs_per_repeat: int, repeats: int, steps: int, fewest_steps: int, warmup_steps: int,
        step_seconds: float, eval_batches: int = 0) -> Fit:
    """The most of (steps, repeats) that fits `share` seconds: timed steps cut first (down to fewest_steps), then
    repeats (down to 2, which the noise rule needs to tell drift from an effect, then 1)."""
    def cost(s: int, r: int) -> float:
        return runs_per_repeat * r * run_seconds(step_seconds, s, warmup_steps, eval_batches)

    kept_steps, kept_repeats, cuts = steps, repeats, []
    if cost(kept_steps, kept_repeats) > share:
        per_run = share / (runs_per_repeat * kept_repeats) - run_seconds(step_seconds, 0, 0, eval_batches)
        kept_steps = max(fewest_steps, min(steps, math.floor(per_run / step_seconds) - warmup_steps))
    while cost(kept_steps, kept_repeats) > share and kept_repeats > 1:
        kept_repeats -= 1
    if kept_steps < steps:
        cuts.append(f"{kept_steps} timed steps a run instead of {steps} (each median rests on fewer steps: a smaller "
                    "difference may not be told apart)")
    if kept_repeats < repeats:
        what = ("a single pair of runs: drift cannot be told from an effect of any size, so its verdict cannot tell"
                if kept_repeats == 1 else "a verdict that can no longer tell says so")
        cuts.append(f"{kept_repeats} interleaved repeat{'s' if kept_repeats > 1 else ''} instead of {repeats} ({what})")
    return Fit(kept_steps, kept_repeats, share, cost(kept_steps, kept_repeats), tuple(cuts))


def share_for(name: str, parts: Collection[str]) -> float | None:
    """Seconds of the remaining budget, less OWN_RUNS_SHARE of the whole kept for the cells' own runs, for the part
    `name`: an even split among the notebook's `parts` (its registered comparisons and held parts) not yet run, `name`
    included (None without a budget, or for a part not among `parts`)."""
    b = _ACTIVE
    if b is None or name not in parts:
        return None
    left = len({*parts, name} - (b.parts_done - {name}))
    return max(0.0, b.remaining() - OWN_RUNS_SHARE * b.seconds) / left


@contextlib.contextmanager
def within(name: str, repeats: int | None, share: float | None = None) -> Iterator[None]:
    """While the part `name` runs: its repeats capped (None: not cut), its runs refused once its `share` of seconds
    (None: none of its own) or the whole budget is spent, and counted as run afterwards."""
    b = _ACTIVE
    if b is None:
        yield
        return
    b.repeats_cap, b.running = repeats, name
    b.part_ends, b.part_share = (None, 0.0) if share is None else (b.clock() + share, share)
    try:
        yield
    finally:
        b.repeats_cap, b.running, b.part_ends = None, None, None
        b.parts_done.add(name)


def scaled_estimate(measured_seconds: float, measured_step: float, here_step: float,
                    budget_seconds: float | None) -> float:
    """A notebook's time measured elsewhere, scaled by this machine's calibrated step against that machine's, and
    held to the budget (which cuts runs to fit): a machine 10x slower is estimated at 10x, up to the budget."""
    scaled = measured_seconds * here_step / measured_step
    return scaled if budget_seconds is None else min(scaled, budget_seconds)


def describe_estimate(budget_seconds: float | None, estimate: float | None, measured: str) -> str:
    """The notebook's first line: its budget, the time estimated here now, and the time measured elsewhere."""
    parts = []
    if budget_seconds is not None:
        parts.append(f"budget {duration(budget_seconds)} (runs are cut to fit, each cut said)")
    if estimate is not None:
        parts.append(f"estimated here now: {duration(estimate)} (the time measured elsewhere, scaled by this "
                     "machine's calibrated step against that machine's)")
    parts.append(measured)
    return "; ".join(parts)


def duration(seconds: float) -> str:
    """Seconds below 90, else minutes with one decimal."""
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"
