"""Notebook 00: the same configuration against itself, in turns: what noise looks like on this machine."""

from __future__ import annotations

from .. import budget
from ..comparisons import comparison
from ..config import TrainConfig
from ..results import RunResult
from ..train import interleave

NAME = "00_start_here:same_twice"
# 00 shows notebook 08's naive-against-tuned step anatomy too: a part of 00's budget as well as 08's
NAIVE_VS_TUNED = budget.part("08_profiling:naive_vs_tuned", notebook="00_start_here")


@comparison(NAME, arms=2)
def same_twice(base: TrainConfig, progress: bool = True) -> list[RunResult]:
    """base against itself, in the profile's repeats of turns: [A, A again]. Nothing differs, so a difference the
    verdict reports would be drift the turns did not cancel."""
    return interleave([("A", base), ("A again", base)], progress=progress, comparison=NAME)
