"""Issue 35, item 4: "is B better than A" is answered in one module. The noise rule, and the ratio of two medians,
live in fastlab/verdicts.py; every other module asks it (verdict, runs_verdict, ratio_of). This test reads the
package's source and names each place that does it by hand."""

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "fastlab"
HOME = PACKAGE / "verdicts.py"

# a call of the noise rule, or a division with a median on either side (a.median / b.median, x / s.median)
BY_HAND = {
    "a call of the noise rule": re.compile(r"\bis_noise\("),
    "a ratio of medians": re.compile(r"\.median\)?\s*/\s*\(?[\w.()\[\]]*\bmedian\b|\bmedian\b[\w.()\[\]]*\s*/\s*[\w.()\[\]]+\.median\b"),
}


def places_by_hand(text: str) -> list[tuple[int, str]]:
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        code = line.split("#", 1)[0]
        found += [(number, what) for what, pattern in BY_HAND.items() if pattern.search(code)]
    return found


def test_the_patterns_catch_what_they_are_for():
    assert places_by_hand("    ratio = r.throughput.median / base.throughput.median") == [(1, "a ratio of medians")]
    assert places_by_hand("x = f'{b.median / a.median:.2f}x'") == [(1, "a ratio of medians")]
    assert places_by_hand("    noise = is_noise(a, b)") == [(1, "a call of the noise rule")]
    assert places_by_hand("    c = verdict(a, b)  # not is_noise(a, b) by hand") == []
    assert places_by_hand("    eff = speedup.median / k") == []  # a median over a count is not a comparison


def test_no_module_but_verdicts_judges_noise_or_divides_medians():
    offenders = [f"{path.relative_to(PACKAGE.parent)}:{n}: {what}"
                 for path in sorted(PACKAGE.rglob("*.py")) if path != HOME
                 for n, what in places_by_hand(path.read_text())]
    assert not offenders, "ask fastlab.verdicts (verdict, runs_verdict, ratio_of) instead:\n" + "\n".join(offenders)
