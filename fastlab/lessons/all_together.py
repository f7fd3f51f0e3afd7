"""Notebook 09: the checklist stacked as the ladder of `python -m fastlab bench`, in images/s and in time to
accuracy, and C15 judged on both; beside it the bundled references and the torch.compile + bf16 check. What the
ladder computes (its rungs, what was dropped, the rung below, speed-ups over naive, tables) is fastlab.bench's."""

from __future__ import annotations

from collections.abc import Sequence

from .. import budget
from ..bench import Rung, ladder, only_no_ops, run_ladder, rung_tta, rungs_for, skipped_rungs, speedups
from ..claims import Judgement, verdict_conditions, verdict_speedup
from ..comparisons import comparison
from ..config import TrainConfig, positive_int, thorough
from ..measure import bf16_supported, resolve_device
from ..outcomes import TimeToAccuracy, built_on, tta_finding, tta_verdict
from ..profiles import profile_of
from ..results import RunResult, load_reference, reference_for
from ..train import interleave, run
from ..verdicts import uncredited, verdict

NAME = "09_all_together:ladder"
TTA_PART = budget.part(f"{NAME}:time_to_accuracy")  # a part of the notebook's budget (run_tta)
RETEST_PART = budget.part(f"{NAME}:retest_dropped")  # (retest_dropped)
COMPILE_CHECK_PART = budget.part(f"{NAME}:compile_check")  # (compile_bf16_check)


@comparison(NAME, arms=lambda base: len(rungs_for(base)))  # every rung the same steps, sized by time
def run_all_together(base: TrainConfig, progress: bool = True) -> list[RunResult]:
    """The ladder of `python -m fastlab bench` on base (less the profile's skips), tagged with this comparison:
    every rung gets the steps that fit the profile's comparison time (and the notebook's budget) on this machine."""
    results = run_ladder(base, rungs_for(base), progress=progress)
    for r in results:
        r.comparison = NAME
    return results


def top_index(results: list[RunResult]) -> int:
    """Index of the top of the ladder: the last rung that was kept and has a timed window."""
    kept = [i for i, r in enumerate(results) if not r.dropped and r.window_throughput]
    if not kept:
        raise ValueError("no rung of the ladder finished a timed window: there is no top to build on")
    return kept[-1]


def ladder_unrun(results: list[RunResult]) -> str | None:
    """Why the ladder has no top (no kept rung finished a timed window: e.g. the notebook's budget did not start
    them), naming its first rung that did not, in its own words; None where it has one (top_index)."""
    if any(not r.dropped and r.window_throughput for r in results):
        return None
    bad = uncredited(results)
    return f"no rung of the ladder finished a timed window ({bad[1] if bad else 'the ladder has no rung'})"


def total_speedup(results: list[RunResult]) -> float:
    """Median images/s at the top of the ladder / median images/s of its naive rung."""
    return speedups(results)[top_index(results)]["speed"].median


def reference_ladders() -> dict[str, list[RunResult]]:
    """Bundled reference ladders by device: this comparison's, else any bundled `fastlab bench` ladder (naive first)."""
    found = reference_for(NAME)
    if found:
        return found
    out = {}
    for device, results in load_reference().items():
        ladders: list[list[RunResult]] = []  # a file may hold several (one per model): each starts at naive
        for r in results:
            if r.rung == "naive":
                ladders.append([r])
            elif r.rung and ladders:
                ladders[-1].append(r)
        for rungs in ladders:
            out[device if len(ladders) == 1 else f"{device}, {rungs[0].config.get('model')}"] = rungs
    return out


def retest_dropped(results: list[RunResult], rungs: list[Rung], limit: int = 2,
                   progress: bool = True) -> list[tuple[str, list[RunResult]]]:
    """Up to `limit` dropped rungs retried on top of the ladder, interleaved: (rung title, [top, top + change])."""
    positive_int("limit", limit, 0)
    by_name = {r.name: r for r in rungs}
    top = TrainConfig.from_dict(results[top_index(results)].config)  # every kept technique on
    out: list[tuple[str, list[RunResult]]] = []
    for r in results:
        name = r.rung
        if not r.dropped or name not in by_name or len(out) >= limit:
            continue
        changes = by_name[name].changes
        if all(top.to_dict().get(k) == v for k, v in changes.items()):
            continue  # already part of the top configuration: nothing to retest
        try:
            changed = top.replace(**changes)
        except ValueError:  # it cannot apply on top (workers with the device loader)
            continue
        with budget.held(RETEST_PART):
            pair = interleave([("top of the ladder", top), (f"top + {name}", changed)], progress=progress)
        out.append((by_name[name].title, pair))
    return out


# ---------------------------------------------------------------- the ladder in time to accuracy

C15_RUNGS = ("workers", "amp", "cudnn", "fused_adamw")  # the techniques C15 names
EVERY_RUNG = "the gpu profile, and the cpu profile with FASTLAB_THOROUGH=1, measure every rung"


def tta_skipped(base: TrainConfig, results: Sequence[RunResult] = ()) -> dict[str, str]:
    """Rung name -> why its time to accuracy is not measured under base's profile: the rungs it skips, those
    outside Profile.tta_only (where C15's stack ends, and the larger batch) unless FASTLAB_THOROUGH=1 lifts it,
    and (given the ladder's results after run_tta) each rung whose every change is a no-op here."""
    preset = profile_of(base)
    only = () if preset.thorough and thorough() else preset.tta_only
    out = dict(skipped_rungs(base))
    for r in ladder(base)[1:]:
        if only and r.name not in only and r.name not in out:
            out[r.name] = (f"not measured under the {base.profile} profile, which keeps the notebook short (it "
                           f"measures {', '.join(only)}); {EVERY_RUNG}")
    return {**out, **{r.rung: r.extras["tta_skipped"] for r in results if r.extras.get("tta_skipped")}}


def tta_rung_names(base: TrainConfig) -> list[str]:
    """The rungs whose time to accuracy this profile measures (naive first)."""
    skipped = tta_skipped(base)
    return [r.name for r in rungs_for(base) if r.name not in skipped]


def noop_rung(results: list[RunResult], index: int) -> str | None:
    """Why results[index] computes exactly what the rung it built on does (every change a no-op here), or None."""
    r, below = results[index], built_on(results, index)
    if below is None or not only_no_ops(r, below):
        return None
    why = next(r.no_ops[k] for k, v in r.config.items() if below.config.get(k) != v and k in r.no_ops)
    return f"every change of this rung is a no-op here ({why}): its time to accuracy is the rung below's"


def run_tta(results: list[RunResult], base: TrainConfig, progress: bool = True) -> list[TimeToAccuracy]:
    """Time to accuracy of tta_rung_names over the profile's tta_seeds, with each rung's config; all-no-op rungs
    skipped."""
    wanted = set(tta_rung_names(base))
    out: list[TimeToAccuracy] = []
    below: TimeToAccuracy | None = None
    with budget.held(TTA_PART):
        for i, r in enumerate(results):
            if r.rung not in wanted:
                continue
            same = noop_rung(results, i) if i else None
            if same:
                r.extras["tta_skipped"] = same
                continue
            # the limits of `bench --metric time-to-accuracy`, from the rung below (none for naive)
            t = rung_tta(TrainConfig.from_dict(r.config), r.rung, r.label, below, profile_of(base).tta_seeds,
                         progress, dropped=r.dropped)
            for x in t.runs:
                x.comparison = TTA_PART
            out.append(t)
            if not r.dropped:
                below = t
            if any(x.status == "interrupted" for x in t.runs):
                break
    return out


def _by_rung(ttas: list[TimeToAccuracy]) -> dict[str, tuple[int, TimeToAccuracy]]:
    return {(t.runs[0].rung or t.label): (i, t) for i, t in enumerate(ttas) if t.runs}


def contrasts(results: list[RunResult], ttas: list[TimeToAccuracy]) -> list[tuple[str, str]]:
    """(rung title, why) for each rung faster per image than the rung it built on, yet not faster to the target."""
    tta = _by_rung(ttas)
    out = []
    for i, r in enumerate(results):
        name, below = r.rung, built_on(results, i)
        if name not in tta or below is None or not (r.window_throughput and below.window_throughput):
            continue
        per_image, base = verdict(below.throughput, r.throughput), built_on(ttas, tta[name][0])
        if not per_image.better or base is None:
            continue
        to_target = tta_verdict(base, tta[name][1])
        if to_target.faster or not to_target.told or (to_target.seconds is not None and to_target.seconds.noise):
            continue
        out.append((r.label, f"{per_image.ratio:.2f}x images/s over the rung it built on, but to the target: "
                             f"{to_target.plain}"))
    return out


def judge_c15(results: list[RunResult], ttas: list[TimeToAccuracy]) -> Judgement:
    """C15 on both measures: naive against the checklist's techniques as the ladder stacked them (the highest
    C15 rung that ran), in images/s (pooled windows) and in training seconds to the target over seeds."""
    names = [r.rung for r in results]
    top = next((n for n in reversed(C15_RUNGS) if n in names), None)
    if top is None or len(results) < 2:
        raise ValueError(f"judge_c15 needs the naive rung and one of the checklist's rungs ({', '.join(C15_RUNGS)})")
    stack = results[names.index(top)]
    speed = verdict_speedup(results[0], stack)
    findings = {"counted in images/s": speed}
    tta = _by_rung(ttas)
    if top in tta and ttas:
        t = tta[top][1]
        findings[f"counted in time to {t.target:.0%} held-out accuracy over {len(t.runs)} seeds"] = \
            tta_finding(ttas[0], t)
        head = f"naive against '{stack.label}' (the checklist's techniques as the ladder stacked them): "
    else:
        head = "time to accuracy not measured for the checklist's rung: images/s only. "
    combined = verdict_conditions(findings)
    stack_as_run = c15_stack_notes(results, top)
    words = combined.verdict + (f", for the stack as run: {'; '.join(stack_as_run)}" if stack_as_run else "")
    return combined._replace(verdict=words, evidence=head + combined.evidence)


def why_not_top(r: RunResult) -> str:
    """Why a rung cannot stand for the top of the ladder in the step anatomy, or "" where it can."""
    if r.dropped:
        return f"dropped ({r.dropped})"
    if r.status != "ok":
        return f"{r.status.replace('_', '-')} ({r.extras.get('not_trained') or r.error or 'stopped early'})"
    return "" if r.forward_seconds else "no sampled steps"


def anatomy_pair(results: list[RunResult]) -> tuple[list[RunResult], str]:
    """The runs the step anatomy sets side by side, naive and the top of the ladder (the highest rung above naive
    that finished, was kept and sampled its steps), and a note: where no rung above naive has such a measurement,
    naive alone (never set against itself) and why each rung above it is not usable."""
    kept = [r for r in results[1:] if not why_not_top(r)]
    if kept:
        return [results[0], kept[-1]], ""
    whys = "; ".join(f"'{r.label}' {why_not_top(r)}" for r in results[1:]) or "the ladder has no rung above naive"
    return [results[0]], (f"No rung above naive finished with a usable measurement ({whys}): naive is shown alone, "
                          f"not against itself.")


def c15_stack_notes(results: list[RunResult], top: str) -> list[str]:
    """How the C15 stack differs from the checklist's: techniques dropped, no-op or not run here, and rungs added."""
    names = [r.rung for r in results]
    notes = [f"{n} not run" for n in C15_RUNGS[:C15_RUNGS.index(top) + 1] if n not in names]
    for i, r in enumerate(results[1:names.index(top) + 1], start=1):
        name = r.rung
        if name in C15_RUNGS and r.dropped:
            notes.append(f"'{r.label}' dropped ({r.dropped})")
        elif name in C15_RUNGS and noop_rung(results, i):
            notes.append(f"'{r.label}' a no-op here")
        elif name not in C15_RUNGS and not r.dropped:
            notes.append(f"'{r.label}' added (the checklist does not name it)")
    return notes


# ---------------------------------------------------------------- torch.compile + bf16 on this machine

# The case of pytorch/pytorch#171764: compiled under bf16 autocast the loss went NaN, eager did not.
COMPILE_CHECK = dict(model="compact", batch_size=32, warmup_steps=1, windows=1, train_images=512, eval_images=128,
                     max_seconds=0.0, log_every=1)


def compile_bf16_check(base: TrainConfig, steps: int = 4, *, model: str = "compact",
                       progress: bool = False) -> list[RunResult]:
    """bf16 autocast eager, then compiled, `steps` steps each on base's device ([] without native bf16)."""
    positive_int("compile_bf16_check: steps", steps)
    if not bf16_supported(resolve_device(base.device)):
        return []
    cfg = base.replace(**{**COMPILE_CHECK, "model": model}, steps=steps, amp="bf16", compile="off")
    with budget.held(COMPILE_CHECK_PART):
        eager = run(cfg, label="bf16 autocast, eager", progress=progress)
        compiled = run(cfg.replace(compile="default"), label="bf16 autocast + torch.compile", progress=progress)
    return [eager, compiled]


def compile_check_outcome(runs: list[RunResult]) -> str:
    """What compile_bf16_check found: "not checked" (no runs: no native bf16; or one not started), "compile
    failed", "both diverged", "reproduces" (compiled bf16 diverged, eager did not), "eager diverged" or "finite"."""
    if not runs or any(r.not_started for r in runs):
        return "not checked"
    eager, compiled = runs
    if compiled.status == "failed":
        return "compile failed"
    if compiled.status == "diverged":
        return "both diverged" if eager.status == "diverged" else "reproduces"
    return "eager diverged" if eager.status == "diverged" else "finite"
