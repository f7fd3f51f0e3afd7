"""Outcomes, not only speed: accuracy over seeds (one short run's is mostly seed noise), and time to accuracy.

Training seconds to target: every training step up to the checkpoint that reached it, warm-up and compilation
included, evaluation excluded (as DAWNBench reports).
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .claims import COULD_NOT_TELL, MIN_GAIN, Judgement, unseen
from .config import TrainConfig, target_accuracy, tta_settings
from .data import Data, load_data
from .measure import Spread
from .models import ModelArg
from .results import RunResult, TtaRecord
from .train import Checkpoints, TrainingRun, _run
from .verdicts import Comparison, pooled_throughput, verdict
from .verdicts import median_step_seconds as median_step_seconds  # the lessons read a run's step time here

DEFAULT_SEEDS = (0, 1, 2)


def run_seeds(config: TrainConfig, seeds: Sequence[int] = DEFAULT_SEEDS, *, label: str = "run",
              progress: bool = True, stop: threading.Event | None = None, model: ModelArg = None,
              dataset: Data | None = None, comparison: str | None = None) -> list[RunResult]:
    """The same configuration once per seed; stops early, keeping what ran, when a run is interrupted."""
    results = []
    for seed in seeds:
        r = _run(TrainingRun(config.replace(seed=seed), f"{label} (seed {seed})", model, dataset, progress, stop,
                             None), comparison)
        r.extras["variant"] = label
        results.append(r)
        if r.status == "interrupted":
            break
    return results


def accuracy_spread(results: Sequence[RunResult]) -> Spread:
    """Held-out accuracy over runs (seeds); a run that diverged counts as what it reached."""
    return Spread.of([r.eval_accuracy for r in results if r.eval_accuracy is not None])


def describe_accuracy(results: Sequence[RunResult]) -> str:
    """'84.1% (min 80.2%, max 86.0%, 3 seeds)'; a single run says it supports no comparison."""
    a = accuracy_spread(results)
    if a.n == 0:
        return "no accuracy measured"
    if a.n == 1:
        return f"{a.median:.1%} (one run: it cannot support a comparison)"
    return f"{a.median:.1%} (min {a.low:.1%}, max {a.high:.1%}, {a.n} seeds)"


def outcome_verdict(base_runs: Sequence[RunResult], other_runs: Sequence[RunResult]) -> str:
    """One sentence on what a change did to the outcome: divergence first, then accuracy over seeds."""
    diverged = [r for r in other_runs if r.status == "diverged"]
    if diverged:
        return (f"diverged: {len(diverged)} of {len(other_runs)} runs ({diverged[0].error}); its speed is not "
                f"credited")
    c = verdict(accuracy_spread(base_runs), accuracy_spread(other_runs), "held-out accuracy")
    if not c.comparable:
        return "accuracy not measured"
    head = f"held-out accuracy {describe_accuracy(other_runs)} vs {describe_accuracy(base_runs)}"
    if c.base.n < 2 or c.other.n < 2:
        return f"{head}: single runs, no verdict on accuracy"
    if c.noise:
        return f"{head}: the same within seed noise"
    return f"{head}: {'higher' if c.better else 'lower'}, outside the seeds' spread"


@dataclass
class TimeToAccuracy:
    """Time to accuracy of one configuration over seeds; each run's `tta` (a TtaRecord) holds its figures."""

    label: str
    target: float
    runs: list[RunResult] = field(default_factory=list)
    seeds_not_run: str = ""  # why some seeds were not run (a first seed that was a trap), else empty

    @property
    def reached(self) -> int:
        return len(self.reached_runs)

    @property
    def reached_runs(self) -> list[RunResult]:
        """The seeds that reached the target."""
        return [r for r in self.runs if r.tta is not None and r.tta.reached]

    @property
    def seconds(self) -> Spread:
        """Training seconds to target over the seeds that reached it."""
        return Spread.of([r.tta.seconds for r in self.reached_runs])

    @property
    def steps(self) -> Spread:
        return Spread.of([r.tta.steps for r in self.reached_runs])

    @property
    def best_accuracy(self) -> Spread:
        """Best held-out accuracy over the seeds evaluated at all (a trap may stop before its first)."""
        return Spread.of([r.tta.best_accuracy for r in self.runs if r.tta and r.tta.best_accuracy is not None])

    @property
    def why_not(self) -> str:
        """Why seeds did not reach the target ("step budget spent; diverged"), each reason once."""
        return "; ".join(sorted({r.tta.why_not for r in self.runs if r.tta and r.tta.why_not}))

    @property
    def first_check_steps(self) -> list[int]:
        """The steps of the first checkpoint, when every seed that reached the target reached it there (nothing is
        known of when it got there: any time up to that check); [] when one needed a later check, or none reached."""
        firsts = [r.tta_curve[0][1] for r in self.reached_runs if r.tta_curve and r.tta.steps == r.tta_curve[0][1]]
        return sorted({int(s) for s in firsts}) if firsts and len(firsts) == self.reached else []

    def summary(self) -> str:
        n = len(self.runs)
        b = self.best_accuracy
        best = (f"best accuracy {b.median:.1%}" + (f" (min {b.low:.1%}, max {b.high:.1%})" if b.n > 1 else "")
                if b.n else "stopped before its first evaluation")
        if self.seeds_not_run:
            return f"{self.label}: target {self.target:.0%} not reached ({self.seeds_not_run}); {best}"
        if self.reached == 0:
            return f"{self.label}: target {self.target:.0%} not reached in any of {n} seeds ({self.why_not}); {best}"
        s, st = self.seconds, self.steps
        text = (f"{self.label}: {s.median:.1f} s of training to {self.target:.0%} (min {s.low:.1f}, max {s.high:.1f}; "
                f"median {st.median:.0f} steps), reached in {self.reached} of {n} seeds")
        return text + ("" if self.reached == n else " (the others: not reached)")


def time_to_accuracy(config: TrainConfig, target: float | None = None, *, seeds: Sequence[int] = DEFAULT_SEEDS,
                     eval_every: int | None = None, max_steps: int | None = None, label: str = "",
                     progress: bool = True, stop: threading.Event | None = None, model: ModelArg = None,
                     dataset: Data | None = None, limits: TrapLimits | None = None) -> TimeToAccuracy:
    """Train each seed until held-out accuracy reaches `target` (default: the profile's), evaluating every
    `eval_every` steps, for at most `max_steps` steps. `limits` cut a trap short (seeds_not_run says so)."""
    settings = tta_settings(config)
    every = eval_every or settings["eval_every"]
    steps = max(max_steps or settings["max_steps"], config.warmup_steps + 1)
    timed = steps - config.warmup_steps  # in windows of about `every` steps: a run that stops early has some
    changes: dict[str, Any] = dict(steps=timed, windows=max(1, timed // every))
    if dataset is None and "eval_images" in settings:
        changes["eval_images"] = min(config.eval_images, settings["eval_images"])
    cfg = config.replace(**changes)
    data, info = load_data(cfg, dataset)
    target = target if target is not None else target_accuracy(cfg, info["synthetic"])
    out = TimeToAccuracy(label or "time to accuracy", target)
    for seed in seeds:
        training = TrainingRun(cfg.replace(seed=seed), f"{out.label} (seed {seed})", model, data, progress, stop,
                               None, checkpoints=Checkpoints(every, target, limits.max_training_seconds if limits else None))
        r = _run(training, cold_compile_caches=True)  # every compiled seed pays a first run's compilation
        r.dataset = info
        r.extras["variant"] = out.label
        r.tta = tta_record(r, target)
        out.runs.append(r)
        if r.status == "interrupted":
            break
        trap = limits.trap(r) if limits is not None and len(out.runs) == 1 else None
        if trap:
            rest = [str(s) for s in seeds[1:]]
            if rest:
                out.seeds_not_run = (f"seed{'s' if len(rest) > 1 else ''} {', '.join(rest)} not run: seed {seed} "
                                     f"{trap}")
                r.tta.seeds_not_run = out.seeds_not_run  # kept in the results file
            break
    return out


def tta_groups(results: list[RunResult]) -> list[TimeToAccuracy]:
    """The runs of a time-to-accuracy comparison or results file, grouped back by rung or variant (in order)."""
    groups: dict[str, TimeToAccuracy] = {}
    for r in results:
        key = r.rung or r.extras.get("variant") or r.label
        if key not in groups:
            groups[key] = TimeToAccuracy(r.extras.get("variant", r.label), r.tta.target)
        groups[key].runs.append(r)
        groups[key].seeds_not_run = groups[key].seeds_not_run or r.tta.seeds_not_run
    return list(groups.values())


_Row = TypeVar("_Row", RunResult, TimeToAccuracy)


def built_on(rows: Sequence[_Row], index: int) -> _Row | None:
    """The rung that rows[index] was built on: the last one below it neither dropped nor left untrained. rows: a
    ladder's runs, or its times to accuracy (each read by its first seed's run)."""
    for row in reversed(rows[:index]):
        r = (row.runs[0] if row.runs else None) if isinstance(row, TimeToAccuracy) else row
        if r is not None and not r.dropped and r.status != "no_op":
            return row
    return None


@dataclass(frozen=True)
class TrapLimits:
    """How the ladders cut a rung short: each seed stops after `max_training_seconds` of training. A first seed that
    diverged, failed, or was stopped by that limit slower per image (a larger batch makes a longer step) than
    `max_seconds_per_image`, or before its first window, is a trap: its other seeds are not run."""

    max_training_seconds: float | None = None
    max_seconds_per_image: float | None = None

    def trap(self, r: RunResult) -> str | None:
        """Why this first seed ends its rung, or None."""
        if r.tta.reached:
            return None
        if r.status in ("diverged", "failed"):
            return f"{r.tta.why_not} before reaching the target"
        if r.status != "time_limited" or stopped_by_harness_budget(r):
            return None
        per_image = seconds_per_image(r)
        if per_image is None:
            warm = int(r.config.get("warmup_steps", 0))
            where = (f"in {r.steps_done} warm-up step{'s' if r.steps_done != 1 else ''} (compilation, first "
                     "allocations: every seed repeats them from fresh caches)" if r.steps_done <= warm else
                     f"before its first synchronised window ended ({r.steps_done - warm} timed steps)")
            return f"spent {sum(r.step_seconds):.1f} s, over its budget, {where}"
        if self.max_seconds_per_image and per_image > self.max_seconds_per_image:
            return (f"was stopped at {per_image * 1000:.1f} ms an image (synchronised windows), over "
                    f"{self.max_seconds_per_image * 1000:.1f} ms (twice the rung below's): a speed trap")
        return None


def stopped_by_harness_budget(r: RunResult) -> bool:
    """Whether a time_limited run was stopped by the harness's budget (config.max_seconds), not a trap limit."""
    return r.status == "time_limited" and r.stopped_by == "max_seconds"


def seconds_per_image(r: RunResult) -> float | None:
    """Median seconds per image over the synchronised windows (on CUDA per-step times are enqueue times), or None."""
    per_window = [1.0 / t for t in r.window_throughput if t > 0]
    return statistics.median(per_window) if per_window else None


def tta_record(r: RunResult, target: float) -> TtaRecord:
    """A run's time-to-accuracy figures, from its checkpoint curve."""
    curve = r.tta_curve
    best = max((c[2] for c in curve), default=r.eval_accuracy)
    hit = next((c for c in curve if c[2] >= target), None)
    if hit is not None:
        return TtaRecord(target, True, seconds=hit[0], steps=int(hit[1]), best_accuracy=best)
    why_not = ("not started: the notebook's budget was spent" if r.not_started
               else {"ok": "step budget spent", "time_limited": "time budget spent",
                     "diverged": "diverged", "failed": "failed", "interrupted": "interrupted"}[r.status])
    return TtaRecord(target, False, best_accuracy=best, why_not=why_not)


# ---------------------------------------------------------------- judging two times to accuracy


@dataclass(frozen=True)
class TtaVerdict:
    """Is `other` faster to the target than `base`, why, the comparison of seconds it rests on (None when a side
    diverged or never reached it), and whether the test could have seen a gain (told)."""

    faster: bool
    why: str
    evidence: str
    seconds: Comparison | None = None
    told: bool = True

    @property
    def finding(self) -> Judgement:
        """In a claim's words: 'holds (...)', 'does not hold here (...)' or 'could not tell here (...)'."""
        head = "holds" if self.faster else "does not hold here" if self.told else COULD_NOT_TELL
        return Judgement(f"{head} ({self.why})", self.evidence)

    @property
    def plain(self) -> str:
        """As a step's effect: 'faster (...)', 'not faster (...)' or 'could not tell (...)'."""
        return f"{'faster' if self.faster else 'not faster' if self.told else 'could not tell'} ({self.why})"


def tta_verdict(base: TimeToAccuracy, other: TimeToAccuracy, *, steps_too: bool = False) -> TtaVerdict:
    """tta_finding's answer, typed."""
    n, nb = len(other.runs), len(base.runs)
    diverged = sum(r.status == "diverged" for r in other.runs)
    evidence = f"{other.summary()}; against {base.summary()}"
    if diverged:
        return TtaVerdict(False, f"{other.label} diverged in {diverged} of {n} seeds", evidence)
    refused = next((r for r in other.runs + base.runs if r.not_started), None)
    if refused is not None:  # the notebook's budget did not start it: nothing was measured to judge
        return TtaVerdict(False, f"'{refused.label}' did not run ({refused.error})", evidence, told=False)
    if other.reached == 0:
        return TtaVerdict(False, f"{other.label} did not reach {other.target:.0%} in any seed: {other.why_not}",
                          evidence)
    if base.reached == 0:
        return TtaVerdict(True, f"{other.label} reached {other.target:.0%} in {other.reached} of {n} seeds, "
                                f"{base.label} in none", evidence)
    if other.reached / n < base.reached / nb:
        return TtaVerdict(False, f"{other.label} reached the target in {other.reached} of {n} seeds, "
                                 f"{base.label} in {base.reached} of {nb}", evidence)
    c = verdict(base.seconds, other.seconds, "s", higher_is_better=False, quantity="training seconds to target",
                fmt=".1f")
    ratio = c.gain  # how many times faster to the target
    first = [base.first_check_steps, other.first_check_steps]
    if all(first):  # the seconds are those of the checkpoint interval, not of the technique
        steps = " and ".join(f"{s:.0f}" for s in sorted({*first[0], *first[1]}))
        return TtaVerdict(False, f"{ratio:.2f}x in seconds to {other.target:.0%}, but both reached {other.target:.0%} "
                                 f"at the first check, after {steps} steps: the ratio measures the checkpoint "
                                 f"interval, not the change; evaluate more often or set a higher target", evidence, c,
                          told=False)
    if c.noise and c.detectable > MIN_GAIN:
        return TtaVerdict(False, unseen(c), evidence, c, told=False)
    if c.noise:
        return TtaVerdict(False, f"no difference outside the seeds' spread: {ratio:.2f}x", evidence, c)
    steps = verdict(base.steps, other.steps, "steps", higher_is_better=False, quantity="steps to target", fmt=".0f")
    per_step = f"the {ratio:.2f}x in seconds is per-step speed, not convergence"
    if steps_too and steps.noise:
        return TtaVerdict(False, f"the same steps to target within the seeds' spread: median "
                                 f"{other.steps.median:.0f} vs {base.steps.median:.0f}; {per_step}", evidence, c)
    if c.direction == "worse":
        return TtaVerdict(False, f"slower to {other.target:.0%}: {ratio:.2f}x", evidence, c)
    if steps_too and steps.direction == "worse":
        return TtaVerdict(False, f"more steps to target: median {other.steps.median:.0f} vs "
                                 f"{base.steps.median:.0f}; {per_step}", evidence, c)
    # seconds alone may be the machine's load changing: credited only when fewer steps or a faster step show it
    speed = verdict(pooled_throughput(base.runs), pooled_throughput(other.runs))
    if not (steps.better or (speed.better and not steps_too)):
        per_image = (f"images/s {speed.ratio:.2f}x: " + ("cannot tell, a single pair" if speed.single_pair else speed.direction)
                     if speed.comparable else "images/s not measured")
        return TtaVerdict(False, f"{ratio:.2f}x in seconds to {other.target:.0%}, but neither the steps to target "
                                 f"(median {other.steps.median:.0f} vs {base.steps.median:.0f}: {steps.direction}) nor "
                                 f"the speed per step ({per_image}) shows it: the seconds alone cannot "
                                 f"tell the change from the machine's load changing between runs", evidence, c,
                          told=False)
    return TtaVerdict(True, f"{ratio:.2f}x faster to {other.target:.0%} held-out accuracy", evidence, c)


def tta_finding(base: TimeToAccuracy, other: TimeToAccuracy, *, steps_too: bool = False) -> Judgement:
    """Is `other` faster to the target than `base`? Training seconds to target over seeds, lower is better
    (fastlab.verdicts.verdict); a seed that diverged or missed the target counts against it; a difference inside
    the seeds' spread is none.

    Fewer steps or a faster step must show the gain too, else "could not tell". steps_too: the change does not
    alter a step's cost (an optimiser, a schedule): only the steps can show it.
    """
    return tta_verdict(base, other, steps_too=steps_too).finding
