"""09_all_together: the whole checklist stacked, as the ladder of `python -m fastlab bench`.

The notebook runs the same rungs as the CLI (fastlab.bench.ladder), draws the cumulative-speedup
waterfall, sets this machine beside the bundled reference results and ends with the checklist table
(fastlab.checklist). Everything it prints is computed here from the results.
"""

from __future__ import annotations

from typing import Any

from ..bench import Rung, ladder, run_ladder, select_rungs
from ..checklist import ChecklistRow, build_checklist
from ..comparisons import comparison
from ..config import TrainConfig
from ..measure import is_noise, resolve_device, verdict
from ..results import RunResult, load_reference, reference_for
from ..train import run

NAME = "09_all_together:ladder"

# Rungs left out under a profile, with the reason printed beside the results. Only smoke skips anything:
# torch.compile's first compile on a CPU takes longer than the whole rest of a smoke notebook.
PROFILE_SKIPS: dict[str, dict[str, str]] = {
    "smoke": {"all_on": "skipped under the smoke profile only: torch.compile's first compile on a CPU takes longer "
                        "than the rest of this notebook; the cpu and gpu profiles run it"},
}


def skipped_rungs(base: TrainConfig) -> dict[str, str]:
    """Rung name -> why it is not run under base's profile."""
    return dict(PROFILE_SKIPS.get(base.profile, {}))


def rungs_for(base: TrainConfig) -> list[Rung]:
    """The bench ladder for base, less the rungs its profile skips."""
    return select_rungs(ladder(base), skip=list(skipped_rungs(base)))


@comparison(NAME)
def run_all_together(base: TrainConfig, progress: bool = True) -> list[RunResult]:
    """The ladder of `python -m fastlab bench` on base (less the profile's skips), tagged with this comparison."""
    results = run_ladder(base, rungs_for(base), progress=progress)
    for r in results:
        r.extras["comparison"] = NAME
    return results


def top_index(results: list[RunResult]) -> int:
    """Index of the top of the ladder: the last rung that was kept and has a timed window."""
    for i in range(len(results) - 1, -1, -1):
        r = results[i]
        if not r.extras.get("dropped") and r.window_throughput:
            return i
    raise ValueError("no rung of the ladder finished a timed window: there is no top to build on")


def top_config(results: list[RunResult]) -> TrainConfig:
    """The configuration at the top of the ladder (every kept technique on)."""
    return TrainConfig.from_dict(results[top_index(results)].config)


def summary_lines(results: list[RunResult]) -> list[str]:
    """What the ladder measured, rung by rung, each figure computed from the results."""
    if not results or not results[0].window_throughput:
        return ["The naive rung did not finish a timed window: nothing to compare against."]
    naive = results[0]
    lines = [f"naive: {naive.throughput.median:,.0f} images/s (min {naive.throughput.low:,.0f}, "
             f"max {naive.throughput.high:,.0f}), peak memory {naive.peak_memory_mb:,.0f} MiB"]
    below = naive
    for r in results[1:]:
        if not r.window_throughput:
            lines.append(f"{r.label}: {r.status} ({r.error or 'no timed window finished'})")
        else:
            step = verdict(below.throughput, r.throughput)
            total = r.throughput.median / naive.throughput.median
            lines.append(f"{r.label}: {total:.2f}x naive; over the rung it was built on: {step}; "
                         f"peak memory {r.peak_memory_mb:,.0f} MiB")
        if r.extras.get("dropped"):
            lines.append(f"    dropped from the rungs above: {r.extras['dropped']}")
        else:
            below = r
    top = results[top_index(results)]
    lines.append(f"top of the ladder ({top.label}): {verdict(naive.throughput, top.throughput)}")
    kind = (naive.memory_kind or "memory").replace("_", " ")
    lines.append(f"peak memory, {kind}: {naive.peak_memory_mb:,.0f} MiB naive -> {top.peak_memory_mb:,.0f} MiB "
                 f"at the top ({top.peak_memory_mb / naive.peak_memory_mb:.2f}x)" if naive.peak_memory_mb else
                 "peak memory was not measured")
    return lines


def total_speedup(results: list[RunResult]) -> float:
    """Median images/s at the top of the ladder / median images/s of its naive rung."""
    return results[top_index(results)].throughput.median / results[0].throughput.median


def reference_ladders() -> dict[str, list[RunResult]]:
    """Bundled reference ladders by device: this comparison's results, else any bundled `fastlab bench` ladder
    (results tagged with rungs, starting from the naive one), so a bench results.json dropped in works too."""
    found = reference_for(NAME)
    if found:
        return found
    out = {}
    for device, results in load_reference().items():
        rungs = [r for r in results if r.extras.get("rung")]
        if rungs and rungs[0].extras["rung"] == "naive":
            out[device] = rungs
    return out


def beside_reference(results: list[RunResult], reference: dict[str, list[RunResult]] | None = None) -> list[str]:
    """This machine's ladder beside each bundled reference ladder (reference_ladders() by default)."""
    reference = reference_ladders() if reference is None else reference
    here = results[0].env.get("device_name", "this machine")
    lines = [f"here ({here}): top of the ladder {total_speedup(results):.2f}x the naive rung, "
             f"{results[top_index(results)].throughput.median:,.0f} images/s"]
    if not reference:
        lines.append(f"No reference results from a real GPU are bundled for '{NAME}' yet; "
                     "only this machine's numbers are shown.")
    for device, ref in reference.items():
        top = ref[top_index(ref)]
        lines.append(f"{device} ({ref[0].env.get('date', '?')}, model {ref[0].config.get('model')}): top of the "
                     f"ladder {total_speedup(ref):.2f}x its naive rung, {top.throughput.median:,.0f} images/s "
                     f"({top.label})")
    return lines


def checklist(results: list[RunResult], base: TrainConfig,
              reference: dict[str, list[RunResult]] | None = None) -> list[ChecklistRow]:
    """The checklist rows for this ladder: techniques_here() on base's device, the reference ladders, the skips."""
    from ..environment_report import techniques_here

    reference = reference_ladders() if reference is None else reference
    return build_checklist(results, techniques_here(resolve_device(base.device)), reference, skipped_rungs(base))


def retest_dropped(results: list[RunResult], rungs: list[Rung], limit: int = 2,
                   progress: bool = True) -> list[tuple[str, list[RunResult]]]:
    """The pitfall of judging a technique once, at the bottom: each dropped rung's change tried again on top.

    For up to `limit` dropped rungs: the top configuration, then the same with that rung's changes, run back
    to back (a fresh top run, so both sides see the same machine load). Returns (rung title, [top, top+change]).
    """
    if limit < 0:
        raise ValueError(f"limit={limit!r} is not allowed: an integer >= 0")
    by_name = {r.name: r for r in rungs}
    top = top_config(results)
    out: list[tuple[str, list[RunResult]]] = []
    for r in results:
        name = r.extras.get("rung")
        if not r.extras.get("dropped") or name not in by_name or len(out) >= limit:
            continue
        changes = by_name[name].changes
        if all(top.to_dict().get(k) == v for k, v in changes.items()):
            continue  # already part of the top configuration: nothing to retest
        pair = [run(top, label="top of the ladder", progress=progress),
                run(top.replace(**changes), label=f"top + {name}", progress=progress)]
        out.append((by_name[name].title, pair))
    return out


def retest_lines(retests: list[tuple[str, list[RunResult]]]) -> list[str]:
    if not retests:
        return ["No rung was dropped on this machine: nothing to retest on top of the ladder."]
    lines = []
    for title, (top, changed) in retests:
        if not (top.window_throughput and changed.window_throughput):
            lines.append(f"{title} on top of the ladder: {changed.status} ({changed.error})")
            continue
        same = is_noise(top.throughput, changed.throughput)
        lines.append(f"{title} on top of the ladder: {verdict(top.throughput, changed.throughput)}"
                     + (" -> still no measurable gain here" if same or
                        changed.throughput.median < top.throughput.median else " -> it pays once the rest is on"))
    return lines


def panel_knobs(base: TrainConfig, results: list[RunResult]) -> dict[str, Any]:
    """Knobs for the notebook's panel, starting from the top of the ladder."""
    sizes = sorted({int(r.config["batch_size"]) for r in results} | {base.batch_size})
    workers = sorted({int(r.config["num_workers"]) for r in results} | {base.num_workers})
    return {"amp": None, "channels_last": None, "loader": None, "num_workers": workers, "batch_size": sizes,
            "compile": None}
