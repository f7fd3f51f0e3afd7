"""Notebook 00's map of the claims, each with the reader's latest verdict, else the bundled GPU reference's:
judged by the lesson function that judges the reader's runs (the explicit list JUDGES)."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .claims import CLAIMS, NOT_TESTABLE, Claim, Judgement, Verdict, latest_verdicts, store_path, verdict_for
from .comparisons import NamedComparison
from .lessons import batch_size, data_loading, hygiene, kernels, mixed_precision, optimizers
from .results import RunResult, reference_for

Judge = Callable[[list[RunResult]], Judgement]


@dataclass(frozen=True)
class ClaimJudge:
    """`judge` decides `claim` from the results of `comparison` (reference results are matched by its name)."""

    claim: str
    comparison: NamedComparison
    judge: Judge


JUDGES: tuple[ClaimJudge, ...] = (
    ClaimJudge("C1", data_loading.compare_num_workers, data_loading.judge_workers),
    ClaimJudge("C2", data_loading.compare_pipeline, data_loading.judge_pinning),
    ClaimJudge("C3", mixed_precision.compare_precision, mixed_precision.judge_speed_and_quality),
    ClaimJudge("C4", mixed_precision.compare_precision, mixed_precision.judge_memory),
    ClaimJudge("C6", kernels.compare_cudnn_benchmark, kernels.judge_benchmark),
    ClaimJudge("C7", batch_size.sizes, batch_size.judge_powers),
    ClaimJudge("C8", batch_size.time_to_accuracy_by_batch, batch_size.judge_largest),
    ClaimJudge("C9", hygiene.eval_modes, hygiene.judge_eval),
    ClaimJudge("C12", optimizers.c12_time_to_accuracy, optimizers.judge_c12_results),
    ClaimJudge("C13", data_loading.compare_slow_storage, data_loading.judge_swing),
)


def reference_verdicts(judges: Sequence[ClaimJudge] = JUDGES) -> dict[str, Verdict]:
    """Each judged claim's verdict on the first device's bundled reference results (a single pair gives none)."""
    out: dict[str, Verdict] = {}
    for entry in judges:
        if entry.claim in out:
            continue
        for device, results in reference_for(entry.comparison.name).items():
            try:
                finding = entry.judge(results)
            except (ValueError, KeyError, IndexError):  # reference runs this judge cannot read
                continue
            if not finding.recorded:
                continue
            v = verdict_for(entry.claim, finding, results)
            v.source, v.device = "reference", device
            v.date = results[0].env.get("date", v.date)
            out[entry.claim] = v
            break
    return out


def _verdict_line(v: Verdict | None, missing: str = "not measured yet") -> str:
    if v is None:
        return f"     verdict: {missing}"
    head = "your latest run" if v.source == "this machine" else "bundled reference results"
    return f"     verdict ({head}: {v.device}, profile {v.profile}, {v.date[:10]}): {v.verdict}"


MAP_HEADINGS = {"here": "What this machine showed (your latest runs)",
                "gpu": "What only a GPU can show",
                "rest": "Not measured on this machine yet"}


def _section(c: Claim, v: Verdict | None) -> str:
    """The MAP_HEADINGS key of a claim with the reader's verdict v: a GPU claim this machine could not test is apart."""
    if c.needs_gpu and (v is None or v.verdict.startswith(NOT_TESTABLE)):
        return "gpu"
    return "here" if v is not None else "rest"


def claim_map(mine: dict[str, Verdict] | None = None, reference: dict[str, Verdict] | None = None,
              width: int = 110) -> str:
    """Each claim, where it is tested, and its verdict (mine: default the store; reference: the bundled results)."""
    mine = latest_verdicts() if mine is None else mine
    reference = reference_verdicts() if reference is None else reference
    lines = []
    for key, heading in MAP_HEADINGS.items():
        group = [c for c in CLAIMS if _section(c, mine.get(c.id)) == key]
        lines += [heading, "-" * len(heading)] if group else []
        for c in group:
            lines += [f"{c.id:<4} {c.text}", f"     figures: {c.figures}; tested in {c.notebook}, {c.section}"]
            if key != "gpu":
                lines.append(_verdict_line(mine.get(c.id) or reference.get(c.id)))
            else:
                lines += [_verdict_line(mine[c.id])] if c.id in mine else []
                lines.append(_verdict_line(reference.get(c.id), "not measured yet (no bundled GPU reference result)"))
            lines.append("")
    yours, ref = sum(c.id in mine for c in CLAIMS), sum(c.id not in mine and c.id in reference for c in CLAIMS)
    lines.append(f"{yours} of {len(CLAIMS)} verdicts from your own runs (kept in {store_path()}), "
                 f"{ref} from bundled reference results, the rest not measured yet.")
    return "\n".join(textwrap.fill(line, width, subsequent_indent="     ") if len(line) > width else line
                     for line in lines)
