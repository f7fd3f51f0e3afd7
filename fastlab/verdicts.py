"""Is B better than A? One typed answer (Comparison: verdict, runs_verdict) by the one noise rule (is_noise).

Every comparison carries its direction ("better", "worse", "noise", "not_comparable") and the smallest ratio it
could have told from noise (detectable). Callers decide on those fields, never on the words (print(c)).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from .measure import Spread
from .results import RunResult, median_step_seconds, timed_steps

Direction = Literal["better", "worse", "noise", "not_comparable"]
CREDITED = ("ok", "time_limited")  # a time-limited run keeps the windows it finished; other statuses are not credited


# ------------------------------------------------------------------ the noise rule


def single_pair(a: Spread, b: Spread) -> bool:
    """Whether a side is one run not interleaved with the other: its windows say nothing of the machine's drift."""
    return 1 in (len(a.repeats), len(b.repeats))


def paired(a: Spread, b: Spread) -> bool:
    """Whether the sides were interleaved in repeats of two windows or more each, judged repeat by repeat."""
    return (len(a.repeats) >= 2 and len(a.repeats) == len(b.repeats)
            and all(r.n >= 2 for r in (*a.repeats, *b.repeats)))


def is_noise(a: Spread, b: Spread) -> bool:
    """The one noise rule. A side measured in one run, not interleaved with the other (single_pair), cannot be
    told from the machine drifting between the runs: noise. Two measurements repeated in the same interleaved
    runs (A B, B A, ...) differ by noise unless every repeat shows the difference, in the same direction, outside
    that repeat's intervals: a machine that drifts mid-comparison slows both arms of a repeat alike. Otherwise
    they differ by noise when their intervals of the median overlap. Neither interval widens with the number of
    timed windows."""
    if single_pair(a, b):
        return True
    if paired(a, b):
        signs = set()
        for ra, rb in zip(a.repeats, b.repeats):
            if _overlap(ra.interval, rb.interval):
                return True
            signs.add(rb.median > ra.median)
        return len(signs) > 1
    return _overlap(a.interval, b.interval)


def detectable_ratio(a: Spread, b: Spread) -> float:
    """The smallest ratio of the medians the noise rule could have told from noise with these spreads (each
    interval kept as measured, relative to its median; the largest over paired repeats); inf for a single pair."""
    if single_pair(a, b):
        return math.inf
    return max(_clearing_ratio(x, y) for x, y in (zip(a.repeats, b.repeats) if paired(a, b) else [(a, b)]))


def _clearing_ratio(a: Spread, b: Spread) -> float:
    (al, ah), (bl, bh) = a.interval, b.interval
    if not (a.median > 0 and b.median > 0 and al > 0 and bl > 0):
        return math.inf
    return max((ah / a.median) / (bl / b.median), (bh / b.median) / (al / a.median))


def _overlap(x: tuple[float, float], y: tuple[float, float]) -> bool:
    return x[0] <= y[1] and y[0] <= x[1]


# ------------------------------------------------------------------ the comparison


@dataclass(frozen=True)
class Comparison:
    """B (`other`) against A (`base`): the direction, the ratio other/base of the medians, both spreads."""

    direction: Direction
    ratio: float  # other.median / base.median (nan when not comparable)
    base: Spread
    other: Spread
    unit: str = "images/s"
    higher_is_better: bool = True  # a rate (throughput); False for latency, memory, seconds to a target
    quantity: str = ""  # what is compared, named in the words when it is not a rate ("latency")
    fmt: str = ",.0f"  # how the medians and ranges are printed
    reason: str = ""  # not_comparable: why (which run, what happened)
    side: Literal["", "base", "other"] = ""  # not_comparable: the side that has no credited measurement
    status: str = ""  # not_comparable: that side's run status ("diverged", "failed", ...), when a run's
    detectable: float = math.nan  # the smallest ratio (either way, >= 1) this measurement could have told from noise
    single_pair: bool = False  # a side is one run not interleaved with the other: drift cannot be told from an effect

    @property
    def noise(self) -> bool:
        return self.direction == "noise"

    @property
    def better(self) -> bool:
        return self.direction == "better"

    @property
    def comparable(self) -> bool:
        return self.direction != "not_comparable"

    @property
    def gain(self) -> float:
        """How many times better B is (> 1 better): the ratio for a rate, base/other for a lower-is-better one."""
        if self.higher_is_better:
            return self.ratio
        return self.base.median / self.other.median if self.other.median else math.nan

    @property
    def variation(self) -> float:
        """How far the intervals of the median reach from their medians (0.3: ±30%), the widest side or repeat."""
        parts = [*self.base.repeats, *self.other.repeats] if paired(self.base, self.other) else [self.base, self.other]
        return max((max(s.interval[1] / s.median - 1, 1 - s.interval[0] / s.median) for s in parts if s.median > 0),
                   default=math.nan)

    @property
    def words(self) -> str:
        """The plain sentence, in this order: what was measured (the ratio, the medians and ranges it rests on),
        whether it could be told apart (its direction, or "noise: could not be told apart"), then why."""
        if not self.comparable:
            return f"no comparison: {self.reason}"
        f, b, o = self.fmt, self.base, self.other
        head = (f"{o.median:{f}} vs {b.median:{f}} {self.unit} (median; ranges {o.low:{f}}-{o.high:{f}} "
                f"and {b.low:{f}}-{b.high:{f}})")
        if len(b.repeats) >= 2 and len(b.repeats) == len(o.repeats):
            head += f", {len(b.repeats)} interleaved repeats"
        rate = self.unit.endswith("/s")
        lead = f"{self.ratio:.2f}x" + (f" the {self.quantity}" if self.quantity and not rate else "")
        if self.single_pair:  # not "noise": a ratio of any size may be drift here, so it reads "cannot tell"
            return (f"{lead}: cannot tell (one run a side); {head}; could not be told apart: {self.unseen}; run both "
                    "in turns, 2 repeats or more: fastlab.compare")
        if self.noise:
            return f"{lead}: noise; {head}; could not be told apart: {self.unseen}"
        up, down = ("faster", "slower") if rate else ("higher", "lower")
        return f"{lead} ({up if self.ratio > 1 else down}); {head}; {self.power}"

    @property
    def shift(self) -> float:
        """How far apart the medians are, either way (>= 1): the ratio or its inverse; nan without a ratio."""
        return max(self.ratio, 1 / self.ratio) if self.ratio > 0 else math.nan

    @property
    def power(self) -> str:
        """What this measurement could see: 'a change over 1.12x would have shown here' (every comparison); with
        interleaved repeats, a change that every repeat shows."""
        if self.single_pair or not math.isfinite(self.detectable):
            return "no change would have shown apart from the machine's drift"
        every = " in every repeat" if paired(self.base, self.other) else ""
        return f"a change over {self.detectable:.2f}x{every} would have shown here"

    @property
    def unseen(self) -> str:
        """Why no difference was told, the one place these words are built. One run a side: drift. Interleaved
        repeats of which some showed the difference and some did not: the repeats that disagreed (the noise rule's
        reason), then, only where the measured ratio is within it, the smallest change the spreads could have
        shown. Otherwise that smallest change, which the measured ratio is within; it is never said of a ratio
        beyond it (a repeat-by-repeat rule can pool to one): then each repeat's reading is the reason."""
        if self.single_pair:
            sides = "each side is" if len(self.base.repeats) == len(self.other.repeats) else "one side is"
            return f"{sides} one run, not interleaved with the other: it cannot tell drift from an effect of any size"
        limit = (f"on this machine now a change under {self.detectable:.2f}x could not have been seen: measurements "
                 f"varied ±{self.variation:.0%}")
        within = self.shift <= self.detectable
        said, disagreed = self._dissent()
        if disagreed:
            return f"the repeats disagreed: {said}" + (f"; and {limit}" if within else "")
        if said and not within:
            return f"no repeat read a difference outside its own spread: {said}"
        return limit

    def _dissent(self) -> tuple[str, bool]:
        """Which interleaved repeats did not show the pooled difference (inside their own spread, or the other way),
        and whether the repeats disagreed: one of them showed it, or one showed the opposite. ("", False) unpaired."""
        if not paired(self.base, self.other):
            return "", False
        up, said, n = self.other.median > self.base.median, [], len(self.base.repeats)
        inside = 0
        for i, (rb, ro) in enumerate(zip(self.base.repeats, self.other.repeats), 1):
            r = ro.median / rb.median if rb.median > 0 else math.nan
            if _overlap(rb.interval, ro.interval):
                said.append(f"repeat {i} of {n} read {r:.2f}x, inside its spread")
                inside += 1
            elif (ro.median > rb.median) != up:
                said.append(f"repeat {i} of {n} read {r:.2f}x, the other way")
        return ", ".join(said), bool(said) and inside < n

    def __str__(self) -> str:
        return self.words


def ratio_of(base: Spread, other: Spread) -> Spread:
    """other / base as a Spread: the ratio of the medians, and the lowest and highest ratios their ranges allow."""
    if not (base.n and other.n and base.median > 0 and base.low > 0):
        return Spread.of([])
    return Spread(other.median / base.median, other.low / base.high, other.high / base.low, min(base.n, other.n))


def turns(arms: int, repeats: int) -> Iterator[tuple[int, int]]:
    """(round, arm) in the order compared arms run, everywhere in fastlab: A B, then B A, then A B... A machine
    that slows down mid-comparison slows every arm alike, and a steady drift favours neither the first nor the last."""
    for r in range(repeats):
        for i in (range(arms) if r % 2 == 0 else reversed(range(arms))):
            yield r, i


def verdict(base: Spread, other: Spread, unit: str = "images/s", *, higher_is_better: bool = True,
            quantity: str = "", fmt: str = ",.0f") -> Comparison:
    """B against A from two spreads: noise by the noise rule (is_noise), else better or worse by the medians."""
    kw = dict(unit=unit, higher_is_better=higher_is_better, quantity=quantity, fmt=fmt)
    for side, s in (("base", base), ("other", other)):
        if not s.n or not math.isfinite(s.median):
            return Comparison("not_comparable", math.nan, base, other, **kw,
                              reason=f"nothing measured on the {side} side", side=side)
    ratio = other.median / base.median if base.median > 0 else math.nan  # a zero baseline has a direction, no ratio
    kw.update(detectable=detectable_ratio(base, other), single_pair=single_pair(base, other))
    if is_noise(base, other):
        return Comparison("noise", ratio, base, other, **kw)
    up = other.median > base.median
    return Comparison("better" if up == higher_is_better else "worse", ratio, base, other, **kw)


def as_runs(runs: RunResult | Sequence[RunResult]) -> list[RunResult]:
    return [runs] if isinstance(runs, RunResult) else list(runs)


def pooled_throughput(runs: RunResult | Sequence[RunResult], *, interleaved: bool = False) -> Spread:
    """Images/s over every timed window of the runs (seeds pool into one median); one run keeps its own repeats.
    interleaved: the runs are repeats of one arm run in turns with the other arm's, and the noise rule pairs them."""
    runs = as_runs(runs)
    if len(runs) == 1:
        return runs[0].throughput
    return Spread.of([w for r in runs for w in r.window_throughput],
                     [r.window_throughput for r in runs] if interleaved else None)


def step_slowdown(base: RunResult | Sequence[RunResult], other: RunResult | Sequence[RunResult]) -> tuple[float, str]:
    """How many times longer `other`'s median step is than `base`'s (median_step_seconds), and its words:
    '11.2x slower a step (45.2 s vs 4.0 s a step, median)'. For a side that timed no window the step time is the
    only speed there is; where a side finished no step: (nan, the side that has no step time)."""
    b, o = as_runs(base), as_runs(other)
    sb, so = median_step_seconds(b), median_step_seconds(o)
    missing = [repr(runs[0].label) if runs else "a side" for runs, s in ((o, so), (b, sb)) if not s > 0]
    if missing:
        return math.nan, f"no step time recorded for {' and '.join(missing)}"
    warm = [r.label for r in (*o, *b) if r.step_seconds and not timed_steps(r)]
    runs = f" ({len(warm)} runs)" if len(warm) > 1 else ""
    note = f"; warm-up steps included for {warm[0]!r}{runs}, which timed no step past them" if warm else ""
    x = so / sb
    way = f"{_times(x)} slower" if x >= 1 else f"{_times(1 / x)} faster"
    return x, f"{way} a step ({_secs(so)} vs {_secs(sb)} a step, median{note})"


def _times(x: float) -> str:
    return f"{x:.2f}x" if x < 10 else f"{x:.1f}x"


def _secs(s: float) -> str:
    return f"{s:.1f} s" if s >= 1 else f"{s * 1000:.0f} ms" if s >= 0.01 else f"{s * 1000:.2f} ms"


def uncredited(runs: Sequence[RunResult]) -> tuple[RunResult, str] | None:
    """The first run whose speed cannot be credited (diverged, failed, stopped, or no timed window), and why."""
    for r in runs:
        if r.status not in CREDITED:
            at = f" at step {r.diverged_step}" if r.diverged_step is not None else ""
            why = r.error or ("non-finite loss" if r.status == "diverged" else "stopped early")
            return r, f"'{r.label}' {r.status}{at} ({why}); its speed is not credited"
        if not r.window_throughput:
            return r, f"'{r.label}' finished no timed window ({r.status}: {r.error or 'stopped early'})"
    return None


def runs_verdict(base: RunResult | Sequence[RunResult], other: RunResult | Sequence[RunResult], *,
                 interleaved: bool = False, unit: str = "images/s") -> Comparison:
    """B against A from runs: their pooled timed windows (pooled_throughput), or not_comparable, naming the run,
    when a run diverged, failed or finished no timed window. The changed side is checked first."""
    b, o = as_runs(base), as_runs(other)
    for side, runs in (("other", o), ("base", b)):
        bad = uncredited(runs) if runs else None
        if bad is not None or not runs:
            nan = Spread.of([])
            reason = bad[1] if bad else f"no run on the {side} side"
            return Comparison("not_comparable", math.nan, nan, nan, unit, reason=reason, side=side,
                              status=bad[0].status if bad else "")
    return verdict(pooled_throughput(b, interleaved=interleaved), pooled_throughput(o, interleaved=interleaved), unit)
