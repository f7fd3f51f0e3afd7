"""fastlab.verdicts: the one typed answer to "is B better than A", and the callers that read its fields."""

import dataclasses
import math
import re

import pytest

from fastlab import claims, export
from fastlab.measure import Spread
from fastlab.results import RunResult, merge_repeats
from fastlab.verdicts import Comparison, runs_verdict, verdict


def run(label: str, windows: list[float], status: str = "ok", error: str | None = None, **kw) -> RunResult:
    return RunResult(config={}, label=label, window_throughput=windows, status=status, error=error, **kw)


def alone(label: str, windows: list[float]) -> RunResult:
    """A run that ran alone, not interleaved with anything (fastlab.train marks every run so until merged)."""
    return run(label, windows, repeats=1)


def arm(label: str, *repeats: list[float]) -> RunResult:
    """One arm of an interleaved comparison: its repeats' windows, merged as fastlab.train.interleave does."""
    return merge_repeats([alone(label, list(w)) for w in repeats])


def test_each_direction_of_a_rate():
    base = Spread.of([100, 105, 110])
    better = verdict(base, Spread.of([200, 210, 220]))
    worse = verdict(base, Spread.of([50, 52, 55]))
    same = verdict(base, Spread.of([104, 108, 112]))
    assert (better.direction, worse.direction, same.direction) == ("better", "worse", "noise")
    assert better.ratio == pytest.approx(2.0) and worse.ratio == pytest.approx(52 / 105)
    assert better.better and not worse.better and same.noise and better.comparable
    assert better.higher_is_better and better.unit == "images/s" and better.gain == better.ratio
    with pytest.raises(dataclasses.FrozenInstanceError):
        better.direction = "worse"  # type: ignore[misc]


def test_noise_by_overlapping_intervals_and_not_when_apart():
    base = Spread(100.0, 90.0, 110.0, 5)
    assert verdict(base, Spread(115.0, 109.0, 120.0, 5)).noise  # 109-120 touches 90-110
    assert verdict(base, Spread(115.0, 111.0, 120.0, 5)).direction == "better"  # 111-120 clears it


def test_interleaved_repeats_that_disagree_are_noise_and_agreeing_ones_are_not():
    # repeat 1: B above A; repeat 2: B below A. Each repeat alone is clear, the two disagree: noise.
    base = Spread.of([100, 101, 102, 200, 201, 202], [[100, 101, 102], [200, 201, 202]])
    disagree = Spread.of([150, 151, 152, 150, 151, 152], [[150, 151, 152], [150, 151, 152]])
    c = verdict(base, disagree)
    assert c.noise and "2 interleaved repeats" in c.words
    # the machine drifted 2x between the repeats, and B gained 20% in both: better, although the pooled windows'
    # intervals overlap (a rule that ignored the repeats would call this noise)
    agree = Spread.of([120, 121, 122, 240, 241, 242], [[120, 121, 122], [240, 241, 242]])
    assert verdict(base, agree).direction == "better"
    assert verdict(Spread.of([100, 101, 102, 200, 201, 202]), Spread.of([120, 121, 122, 240, 241, 242])).noise


def test_interleaved_runs_are_paired_only_when_said_so():
    a = [run("A #1", [100, 101, 102]), run("A #2", [200, 201, 202])]
    b = [run("B #1", [120, 121, 122]), run("B #2", [240, 241, 242])]
    assert runs_verdict(a, b, interleaved=True).direction == "better"
    assert runs_verdict(a, b).noise  # seeds run one after the other: pooled windows only


def test_lower_is_better():
    base = Spread(10.0, 9.0, 11.0, 5)
    quicker = verdict(base, Spread(5.0, 4.5, 5.5, 5), "ms", higher_is_better=False, quantity="latency", fmt=".2f")
    assert quicker.direction == "better" and quicker.ratio == pytest.approx(0.5) and quicker.gain == pytest.approx(2)
    assert quicker.words.startswith("0.50x the latency (lower); 5.00 vs 10.00 ms")
    more = verdict(Spread.of([1000.0]), Spread.of([1200.0]), "MiB", higher_is_better=False, quantity="memory")
    assert more.direction == "worse" and more.words.startswith("1.20x the memory (higher)")
    assert export.latency_verdict(base, Spread(20.0, 19.0, 21.0, 5)).direction == "worse"


def test_not_comparable_when_a_side_measured_nothing():
    c = verdict(Spread.of([]), Spread.of([1.0, 2.0]))
    assert c.direction == "not_comparable" and c.side == "base" and math.isnan(c.ratio)
    assert c.words == "no comparison: nothing measured on the base side"
    limited = runs_verdict(run("a", [10, 11, 12]), run("b", [], status="time_limited", error="over budget"))
    assert not limited.comparable and limited.side == "other" and limited.status == "time_limited"
    assert limited.words == "no comparison: 'b' finished no timed window (time_limited: over budget)"


def test_not_comparable_when_a_run_diverged_or_failed_whatever_its_windows_say():
    fast_but_diverged = run("b", [900, 910, 920], status="diverged", error="loss nan")
    c = runs_verdict(run("a", [10, 11, 12]), fast_but_diverged)
    assert (c.direction, c.side, c.status) == ("not_comparable", "other", "diverged")
    assert "'b' diverged (loss nan); its speed is not credited" in c.words
    failed_base = runs_verdict(run("a", [10, 11], status="failed", error="boom"), run("b", [20, 21]))
    assert (failed_base.side, failed_base.status) == ("base", "failed") and "'a' failed (boom)" in failed_base.reason


@pytest.mark.parametrize("other", [[200, 210, 220], [50, 52, 55], [104, 108, 112]])
def test_the_words_follow_the_fields(other):
    c = verdict(Spread.of([100, 105, 110]), Spread.of(other))
    assert c.words == str(c) and c.words.startswith(f"{c.ratio:.2f}x")
    assert ("noise" in c.words) == c.noise
    assert ("(faster)" in c.words) == (c.direction == "better") and ("(slower)" in c.words) == (c.direction == "worse")
    assert f"{c.other.median:,.0f} vs {c.base.median:,.0f} images/s" in c.words


def test_claims_take_the_direction_from_the_verdict():
    base = arm("a", [100, 105, 110], [100, 105, 110])
    same = arm("b", [104, 106, 108], [104, 106, 108])
    assert claims.verdict_speedup(base, same).verdict.startswith("does not hold here (1.01x, not told apart from noise")
    assert claims.verdict_speedup(base, arm("b", [300, 310, 320], [300, 310, 320])).verdict == "holds (2.95x faster)"
    no_base = claims.verdict_speedup(run("a", [1.0], status="diverged"), run("b", [300, 310]))
    assert no_base.verdict.startswith("not testable here (no baseline to compare with: 'a' diverged")
    claims.check_verdict(no_base.verdict)


def test_a_comparison_is_the_one_type():
    assert isinstance(verdict(Spread.of([1.0]), Spread.of([2.0])), Comparison)
    assert isinstance(runs_verdict(run("a", [1.0]), run("b", [2.0])), Comparison)


def test_one_sequential_pair_reads_neither_better_nor_worse_and_two_agreeing_repeats_do():
    # one run of A, then one of B, each run's windows tight and far apart: the load changed between the two runs
    # as much as any effect could, so the pair says nothing either way
    a, b = alone("A", [1000, 1005, 1010, 1013]), alone("B", [94, 95, 96, 97])
    c = runs_verdict(a, b)
    assert c.noise and c.single_pair and c.detectable == math.inf
    assert "cannot tell drift from an effect" in c.words and "(slower)" not in c.words
    # a 10x ratio from one run a side is not called noise: its words say it cannot tell, and why
    assert c.words.startswith(f"{c.ratio:.2f}x: cannot tell (one run a side); ") and "noise" not in c.words
    trap = runs_verdict(arm("A", [1000, 1005, 1010], [990, 995, 1000]), b)  # a trap's one demonstration run
    assert trap.noise and trap.single_pair and "one side is one run" in trap.words
    # the same two arms run twice in turns (A B, B A), each repeat showing B slower outside its spread: worse
    two = runs_verdict(arm("A", [1000, 1005, 1010], [700, 705, 710]), arm("B", [94, 95, 96], [66, 67, 68]))
    assert two.direction == "worse" and not two.single_pair and two.detectable < 1.1


def test_every_comparison_says_the_smallest_difference_it_could_have_seen():
    # both sides' intervals of the median reach ±30%: under (1.3 / 0.7)x apart they touch, whatever B does
    wide = verdict(Spread(100.0, 70.0, 130.0, 5), Spread(110.0, 77.0, 143.0, 5))
    assert wide.noise and wide.detectable == pytest.approx(1.3 / 0.7)
    assert wide.words.startswith("1.10x: noise; 110 vs 100 images/s")  # what was measured first, then the why
    assert "could not be told apart: on this machine now a change under 1.86x could not have been seen" in wide.words
    assert "measurements varied ±30%" in wide.words
    # tight windows: a small difference is seen, and the detectable ratio says how small
    tight = verdict(Spread(100.0, 99.0, 101.0, 5), Spread(110.0, 109.0, 111.0, 5))
    assert tight.better and tight.detectable == pytest.approx(max(1.01 / (109 / 110), (111 / 110) / 0.99))
    # with interleaved repeats, every repeat must clear: the widest repeat sets it
    paired = verdict(Spread.of([1, 1], [[100, 101, 102], [90, 100, 110]]), Spread.of([1, 1], [[200, 201, 202],
                                                                                               [200, 201, 202]]))
    assert paired.detectable == pytest.approx(max(1.1 / (200 / 201), (202 / 201) / 0.9))


def test_a_large_ratio_that_reads_noise_says_which_repeat_disagreed():
    base = arm("A", [100, 101, 102], [100, 101, 102])
    other = arm("B", [300, 301, 302], [99, 100, 101])  # repeat 1: 3x; repeat 2: the same as A
    c = runs_verdict(base, other)
    assert c.noise and c.ratio > 1.9
    assert "the repeats disagreed: repeat 2 of 2 read 0.99x, inside its spread" in c.words
    flipped = runs_verdict(base, arm("B", [300, 301, 302], [80, 81, 82]))
    assert flipped.noise and "repeat 2 of 2 read 0.80x, the other way" in flipped.words


def test_a_difference_seen_says_what_the_measurement_could_see_too():
    seen = verdict(Spread(100.0, 99.0, 101.0, 5), Spread(150.0, 148.0, 152.0, 5))
    assert seen.better and seen.words.endswith(f"; a change over {seen.detectable:.2f}x would have shown here")
    assert "no change would have shown apart from the machine's drift" in runs_verdict(alone("A", [1, 2]),
                                                                                     alone("B", [5, 6])).power
    # a memory saving measured on a CPU (tensor sizes: exact) says so in the claim's evidence
    f = claims.verdict_less(1000.0, 520.0, 0.5)
    assert f.verdict.startswith("holds (48% less memory)") and "a change over 1.00x would have shown here" in f.evidence


def test_repeats_of_one_window_each_are_judged_by_how_far_the_repeats_differ():
    # 12's checkpointing exercise under the cpu profile (8 batches: one timed window a run) printed "0.41x (slower)
    # ... a change over 1.00x would have shown here" for 56 against 136 images/s, ranges 38-74 and 60-212: a window
    # has no spread of its own, so each repeat's "interval" was a point and any difference cleared it
    base = Spread.of([100, 200], [[100], [200]])
    other = Spread.of([60, 120], [[60], [120]])
    c = verdict(base, other)
    assert c.direction == "noise" and c.detectable > 1.5, (c.direction, c.detectable)
    assert "a change under" in c.words and "±" in c.words
    # with windows of their own, each repeat is judged against its partner, as before
    tight = verdict(Spread.of([100, 101, 200, 201], [[100, 101], [200, 201]]),
                    Spread.of([60, 61, 120, 121], [[60, 61], [120, 121]]))
    assert tight.direction == "worse" and tight.detectable < 1.05


# ---------------------------------------------------------------- the order of a verdict's words

UNSEEABLE = re.compile(r"under (\d+\.\d\d)x could not")  # "a change under 1.32x could not have been seen"
LAYOUTS = ("pooled", "one run each", "repeats agree", "repeat 2 inside", "repeat 2 the other way")


def _windows(level: float, spread: float) -> list[float]:
    return [level * (1 - spread), level, level * (1 + spread)]


def _pair(layout: str, ratio: float, spread: float) -> Comparison:
    """B at `ratio` times A, each window ±spread; in repeats, the machine 20% slower in the second (drift)."""
    b, o = _windows(100.0, spread), _windows(100.0 * ratio, spread)
    if layout == "pooled":
        return verdict(Spread.of(b), Spread.of(o))
    if layout == "one run each":
        return verdict(Spread.of(b, [b]), Spread.of(o, [o]))
    second = {"repeats agree": ratio, "repeat 2 inside": 1.0, "repeat 2 the other way": 1 / ratio}[layout]
    b2, o2 = _windows(80.0, spread), _windows(80.0 * second, spread)
    return verdict(Spread.of(b + b2, [b, b2]), Spread.of(o + o2, [o, o2]))


CASES = [(layout, ratio, spread) for layout in LAYOUTS for ratio in (0.5, 0.8, 0.97, 1.0, 1.03, 1.33, 1.6, 3.0)
         for spread in (0.005, 0.1, 0.3)]


def _printed(c: Comparison) -> list[str]:
    """Every sentence built from the comparison: its words, and the claims' findings (verdict and evidence)."""
    texts = [c.words]
    for f in [claims.verdict_faster(c.base, c.other, claimed) for claimed in (None, 1.25, 2.0)] + \
            [claims.verdict_less(c.base, c.other, what="latency", unit="ms")]:
        texts += [f.verdict, f.evidence]
    return texts + ([claims.unseen(c)] if c.noise else [])


@pytest.mark.parametrize(("layout", "ratio", "spread"), CASES, ids=[f"{a}-{r}x-{s:.1%}" for a, r, s in CASES])
def test_no_sentence_says_a_change_of_the_measured_size_could_not_have_been_seen(layout, ratio, spread):
    c = _pair(layout, ratio, spread)
    shift = float(f"{max(c.ratio, 1 / c.ratio):.2f}")  # the measured ratio either way, as printed
    for text in _printed(c):
        for m in UNSEEABLE.finditer(text):
            said = float(m.group(1))
            assert said >= shift, f"measured {shift}x, yet 'a change under {said}x could not have been seen': {text}"
            if "disagreed" in text:  # the reason the noise rule gave first, then what the spreads could show
                assert text.index("disagreed") < m.start(), text
    if c.noise:  # what was measured, then that it could not be told apart, then why
        figures, told = c.words.index(f"{c.other.median:,.0f} vs {c.base.median:,.0f}"), c.words.index("could not be told apart")
        assert c.words.startswith(f"{c.ratio:.2f}x") and figures < told, c.words


def test_the_cases_hold_noise_beyond_the_ratio_the_spreads_could_show():
    # the tester's case: 1.33x read as noise because a repeat disagreed, where a change over 1.32x would have shown
    beyond = [c for c in (_pair(*case) for case in CASES) if c.noise and max(c.ratio, 1 / c.ratio) > c.detectable]
    assert beyond and all("repeat" in c.unseen for c in beyond)
    c = _pair("repeat 2 inside", 1.6, 0.1)
    assert c.noise and c.ratio > c.detectable + 0.05, (c.ratio, c.detectable)
    assert c.words.startswith(f"{c.ratio:.2f}x: noise; 116 vs 89 images/s")
    assert c.words.endswith("could not be told apart: the repeats disagreed: repeat 2 of 2 read 1.00x, inside its spread")
    assert "could not have been seen" not in c.words and "in every repeat would have shown" in c.power
