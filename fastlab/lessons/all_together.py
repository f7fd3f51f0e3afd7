"""Notebook 09: the checklist stacked as the ladder of `python -m fastlab bench`, in images/s and in time to
accuracy, and C15 judged on both; beside it the bundled references, the torch.compile + bf16 check, the checklist."""

from __future__ import annotations

import math
from typing import Any

from .. import budget
from ..bench import Rung, ladder, only_no_ops, run_ladder, select_rungs, tta_limits
from ..checklist import ChecklistRow, build_checklist, built_on
from ..claims import Judgement, verdict_conditions, verdict_speedup
from ..comparisons import comparison
from ..config import TrainConfig, positive_int, thorough
from ..measure import Spread, bf16_supported, device_name, resolve_device
from ..outcomes import TimeToAccuracy, time_to_accuracy, tta_finding, tta_verdict
from ..profiles import Profile, profile_of
from ..results import RunResult, load_reference, reference_for
from ..train import interleave, run
from ..verdicts import ratio_of, uncredited, verdict

NAME = "09_all_together:ladder"
TTA_PART = budget.part(f"{NAME}:time_to_accuracy")  # a part of the notebook's budget (run_tta)
RETEST_PART = budget.part(f"{NAME}:retest_dropped")  # (retest_dropped)
COMPILE_CHECK_PART = budget.part(f"{NAME}:compile_check")  # (compile_bf16_check)

def compile_skip(base: TrainConfig) -> str | None:
    """Why base's profile skips torch.compile here (Profile.skip_compile: smoke, gpu-dry), or None where it runs."""
    if not profile_of(base).skip_compile:
        return None
    return (f"skipped under the {base.profile} profile: torch.compile's first compile on a CPU takes longer than the "
            "rest of this notebook; the cpu and gpu profiles run it")


def skipped_rungs(base: TrainConfig) -> dict[str, str]:
    """Rung name -> why it is not run under base's profile."""
    why = compile_skip(base)
    return {"all_on": why} if why else {}


def rungs_for(base: TrainConfig) -> list[Rung]:
    """The bench ladder for base, less the rungs its profile skips."""
    return select_rungs(ladder(base), skip=list(skipped_rungs(base)))


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


def top_config(results: list[RunResult]) -> TrainConfig:
    """The configuration at the top of the ladder (every kept technique on)."""
    return TrainConfig.from_dict(results[top_index(results)].config)


def total_speedup(results: list[RunResult]) -> float:
    """Median images/s at the top of the ladder / median images/s of its naive rung."""
    return verdict(results[0].throughput, results[top_index(results)].throughput).ratio


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


def checklist(results: list[RunResult], base: TrainConfig,
              reference: dict[str, list[RunResult]] | None = None,
              tta: list[TimeToAccuracy] | None = None) -> list[ChecklistRow]:
    """The checklist rows for this ladder; with `tta` (the time-to-accuracy ladder), each row's effect on it too."""
    from ..environment_report import techniques_here

    reference = reference_ladders() if reference is None else reference
    return build_checklist(results, techniques_here(resolve_device(base.device)), reference, skipped_rungs(base),
                           tta=tta, tta_skipped=tta_not_measured(results, base) if tta else None)


def retest_dropped(results: list[RunResult], rungs: list[Rung], limit: int = 2,
                   progress: bool = True) -> list[tuple[str, list[RunResult]]]:
    """Up to `limit` dropped rungs retried on top of the ladder, interleaved: (rung title, [top, top + change])."""
    positive_int("limit", limit, 0)
    by_name = {r.name: r for r in rungs}
    top = top_config(results)
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

DEFAULT_TTA_SEEDS = Profile.tta_seeds  # the seeds where a profile sets none (the cpu and gpu profiles)
C15_RUNGS = ("workers", "amp", "cudnn", "fused_adamw")  # the techniques C15 names
EVERY_RUNG = "the gpu profile, and the cpu profile with FASTLAB_THOROUGH=1, measure every rung"


def tta_seeds(base: TrainConfig) -> tuple[int, ...]:
    """The seeds time to accuracy runs over on base's profile (Profile.tta_seeds)."""
    return profile_of(base).tta_seeds


def _tta_only(base: TrainConfig) -> tuple[str, ...]:
    """The rungs the profile limits time to accuracy to (Profile.tta_only: where C15's stack ends, and the larger
    batch; empty: all); FASTLAB_THOROUGH=1 lifts it where the profile takes it."""
    preset = profile_of(base)
    if preset.thorough and thorough():
        return ()
    return preset.tta_only


def tta_rung_names(base: TrainConfig) -> list[str]:
    """The rungs whose time to accuracy this profile measures (naive first)."""
    names = [r.name for r in rungs_for(base)]
    only = _tta_only(base)
    return [n for n in names if n == "naive" or not only or n in only]


def tta_skipped(base: TrainConfig) -> dict[str, str]:
    """Rung name -> why its time to accuracy is not measured under base's profile."""
    measured = set(tta_rung_names(base))
    out = dict(skipped_rungs(base))
    for r in ladder(base):
        if r.name not in measured and r.name not in out:
            out[r.name] = (f"not measured under the {base.profile} profile, which keeps the notebook short (it "
                           f"measures {', '.join(_tta_only(base))}); {EVERY_RUNG}")
    return out


def noop_rung(results: list[RunResult], index: int) -> str | None:
    """Why results[index] computes exactly what the rung it built on does (every change a no-op here), or None."""
    r, below = results[index], built_on(results, index)
    if below is None or not only_no_ops(r, below):
        return None
    why = next(r.no_ops[k] for k, v in r.config.items() if below.config.get(k) != v and k in r.no_ops)
    return f"every change of this rung is a no-op here ({why}): its time to accuracy is the rung below's"


def run_tta(results: list[RunResult], base: TrainConfig, progress: bool = True) -> list[TimeToAccuracy]:
    """Time to accuracy of tta_rung_names over tta_seeds(base), with each rung's config; all-no-op rungs skipped."""
    with budget.held(TTA_PART):
        return _run_tta(results, base, progress)


def _run_tta(results: list[RunResult], base: TrainConfig, progress: bool) -> list[TimeToAccuracy]:
    wanted = set(tta_rung_names(base))
    out: list[TimeToAccuracy] = []
    below: TimeToAccuracy | None = None
    for i, r in enumerate(results):
        name = r.rung
        if name not in wanted:
            continue
        same = noop_rung(results, i) if i else None
        if same:
            r.extras["tta_skipped"] = same
            continue
        cfg = TrainConfig.from_dict(r.config)
        # the limits of `bench --metric time-to-accuracy`, from the rung below (none for naive)
        t = time_to_accuracy(cfg, seeds=tta_seeds(base), label=r.label, progress=progress, limits=tta_limits(below))
        for x in t.runs:
            x.rung, x.dropped = name, r.dropped
            x.comparison = TTA_PART
            x.extras["metric"] = "time-to-accuracy"
        out.append(t)
        if not r.dropped:
            below = t
        if any(x.status == "interrupted" for x in t.runs):
            break
    return out


def tta_not_measured(results: list[RunResult], base: TrainConfig) -> dict[str, str]:
    """Rung name -> why its time to accuracy was not measured: the profile's choice, or every change a no-op."""
    return {**tta_skipped(base), **{r.rung: r.extras["tta_skipped"] for r in results
                                    if r.extras.get("tta_skipped")}}


def _by_rung(ttas: list[TimeToAccuracy]) -> dict[str, tuple[int, TimeToAccuracy]]:
    return {(t.runs[0].rung or t.label): (i, t) for i, t in enumerate(ttas) if t.runs}


def tta_below(ttas: list[TimeToAccuracy], index: int) -> TimeToAccuracy | None:
    """The time to accuracy of the rung ttas[index] built on: the nearest one below that was not dropped."""
    for t in reversed(ttas[:index]):
        if t.runs and not t.runs[0].dropped:
            return t
    return None


def contrasts(results: list[RunResult], ttas: list[TimeToAccuracy]) -> list[tuple[str, str]]:
    """(rung title, why) for each rung faster per image than the rung it built on, yet not faster to the target."""
    tta = _by_rung(ttas)
    out = []
    for i, r in enumerate(results):
        name, below = r.rung, built_on(results, i)
        if name not in tta or below is None or not (r.window_throughput and below.window_throughput):
            continue
        per_image, base = verdict(below.throughput, r.throughput), tta_below(ttas, tta[name][0])
        if not per_image.better or base is None:
            continue
        to_target = tta_verdict(base, tta[name][1])
        if to_target.faster or not to_target.told or (to_target.seconds is not None and to_target.seconds.noise):
            continue
        out.append((r.label, f"{per_image.ratio:.2f}x images/s over the rung it built on, but to the target: "
                             f"{to_target.plain}"))
    return out


def _speedups(results: list[RunResult], ttas: list[TimeToAccuracy]) -> list[dict[str, Any]]:
    """Per throughput rung: cumulative images/s over naive, and seconds-to-target of naive / the rung's."""
    tta = _by_rung(ttas)
    naive = results[0].throughput if results else Spread.of([])
    naive_tta = ttas[0].seconds if ttas and ttas[0].reached else None
    rows = []
    for r in results:
        speed = ratio_of(naive, r.throughput)  # NaN where a side finished no timed window
        row: dict[str, Any] = {"label": r.label, "status": r.status, "dropped": bool(r.dropped),
                               "speed": speed, "tta": None}
        name = r.rung
        if r.extras.get("tta_skipped"):
            row["tta"] = "no-op here"
        elif name in tta:
            t = tta[name][1]
            diverged = any(x.status == "diverged" for x in t.runs)
            if t.reached and naive_tta is not None and not diverged:
                gain = ratio_of(t.seconds, naive_tta)  # naive's seconds over the rung's: > 1 is faster to the target
                row["tta"] = (gain, t.reached, len(t.runs), bool(t.runs[0].dropped))
            else:
                row["tta"] = "DIVERGED" if diverged else ("not reached" if not t.reached else "no naive time")
        rows.append(row)
    return rows


def _bar(ax, i: int, spread: Spread, text: str, **style: Any) -> None:
    """A bar at the median with min-max whiskers, `text` above it."""
    ax.bar(i, spread.median, **style)
    ax.errorbar(i, spread.median, yerr=[[spread.median - spread.low], [spread.high - spread.median]], color="black",
                capsize=3, lw=1)
    ax.annotate(text, (i, spread.high), textcoords="offset points", xytext=(0, 3), ha="center", fontsize=7.5)


def plot_speed_and_outcome(results: list[RunResult], ttas: list[TimeToAccuracy], title: str = ""):
    """Speed-up over naive per rung in images/s and in seconds to the target; faster per image only: outlined red."""
    from matplotlib.patches import Patch

    from ..plots import ShownFigure, data_note

    rows = _speedups(results, ttas)
    flagged = {label for label, _ in contrasts(results, ttas)}
    n = len(rows)
    fig = ShownFigure(figsize=(min(16.0, 4.0 + 1.4 * n), 5.6), layout="constrained")
    ax_s, ax_t = fig.subplots(1, 2, sharex=True)
    for i, row in enumerate(rows):
        edge = "tab:red" if row["label"] in flagged else "black"
        lw = 2.5 if row["label"] in flagged else 0.6
        speed, diverged = row["speed"], row["status"] == "diverged"
        if math.isnan(speed.median):
            ax_s.text(i, 0.02, row["status"].upper(), rotation=90, ha="center", va="bottom", fontsize=8,
                      color="tab:red")
        else:
            _bar(ax_s, i, speed, f"{speed.median:.2f}x" + ("\nDIVERGED" if diverged else ""), edgecolor=edge,
                 linewidth=lw, color="tab:orange" if diverged else ("white" if row["dropped"] else "tab:blue"),
                 hatch="xx" if diverged else ("//" if row["dropped"] else None))
        tta = row["tta"]
        if tta is None:
            ax_t.text(i, 0.02, "not run\nhere", ha="center", va="bottom", fontsize=7.5, color="gray")
        elif isinstance(tta, str):
            ax_t.text(i, 0.02, tta, rotation=90, ha="center", va="bottom", fontsize=8,
                      color="gray" if tta == "no-op here" else "tab:red")
        else:
            gain, reached, seeds, dropped = tta
            _bar(ax_t, i, gain, f"{gain.median:.2f}x\n{reached}/{seeds} seeds", edgecolor=edge, linewidth=lw,
                 color="white" if dropped else "tab:green", hatch="//" if dropped else None)
    for ax in (ax_s, ax_t):
        ax.axhline(1.0, color="black", lw=0.6)
        ax.set_ylim(bottom=0)
        ax.margins(y=0.2)
        ax.set_xticks(range(n), [row["label"] for row in rows], rotation=35, ha="right", fontsize=8)
    ax_s.set_ylabel("speed-up over naive, images/s\n(median; whiskers: min-max over windows)")
    ax_s.set_title("throughput: faster per image", fontsize=10)
    target = f"{ttas[0].target:.0%}" if ttas else "the target"
    ax_t.set_ylabel(f"speed-up over naive, seconds to {target}\n(median over seeds; whiskers: min-max)")
    ax_t.set_title(f"time to {target} held-out accuracy: faster to a result", fontsize=10)
    legend = ((any(row["status"] == "diverged" for row in rows),
               dict(facecolor="tab:orange", hatch="xx", label="diverged: speed not credited")),
              (any(row["dropped"] for row in rows),
               dict(facecolor="white", hatch="//", label="dropped: not carried up the ladder")),
              (flagged, dict(facecolor="white", edgecolor="tab:red", linewidth=2.5,
                             label="faster per image, not faster to a result")))
    handles = [Patch(**{"edgecolor": "black", **kw}) for shown, kw in legend if shown]
    if handles:
        fig.legend(handles=handles, fontsize=8, loc="outside lower center", ncols=len(handles))
    runs = results + [r for t in ttas for r in t.runs]
    fig.suptitle(f"{title or 'the ladder'}: per image and to a result\n{data_note(runs)}", fontsize=10)
    return fig


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


def stack_top(results: list[RunResult]) -> RunResult | None:
    """The highest rung above naive that finished, was kept (not dropped as a trap) and sampled its steps: the
    ladder's tuned run; None where no rung above naive has such a measurement (naive is never set against itself)."""
    kept = [r for r in results[1:] if not why_not_top(r)]
    return kept[-1] if kept else None


def why_not_top(r: RunResult) -> str:
    """Why a rung cannot stand for the top of the ladder in the step anatomy, or "" where it can."""
    if r.dropped:
        return f"dropped ({r.dropped})"
    if r.status != "ok":
        return f"{r.status.replace('_', '-')} ({r.extras.get('not_trained') or r.error or 'stopped early'})"
    return "" if r.forward_seconds else "no sampled steps"


def anatomy_pair(results: list[RunResult]) -> tuple[list[RunResult], str]:
    """The runs the step anatomy sets side by side, naive and the top of the ladder, and a note: where no rung
    above naive has a usable measurement, naive alone and why each rung above it is not usable."""
    top = stack_top(results)
    if top is not None:
        return [results[0], top], ""
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


def compile_check_skip(base: TrainConfig) -> str | None:
    """Why the compile + bf16 check does not run under base's profile, or None when it does."""
    return compile_skip(base)


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


def describe_compile_check(runs: list[RunResult], base: TrainConfig | None = None) -> str:
    """Each run's status and last loss, then whether compile + bf16 diverged here while eager bf16 did not."""
    if not runs:
        where = device_name(resolve_device(base.device)) if base is not None else "this device"
        return f"not checked: {where} has no native bf16, so the bf16 case does not arise here"
    eager, compiled = runs
    lines = [f"{r.label}: {r.status}" + (f" at step {r.diverged_step} (last finite loss {r.last_finite_loss:.3f})"
                                         if r.status == "diverged" and r.last_finite_loss is not None else "")
             + (f", last loss read {r.losses[-1][1]:.3f}" if r.losses else ", no loss read") for r in runs]
    if compiled.step_seconds:
        lines[1] += f"; its first step (compilation included) took {compiled.step_seconds[0]:.1f} s"
    env, n = compiled.env, compiled.steps_done
    where = (f"torch {env.get('torch', '?')} on {env.get('device_name', '?')}, model {compiled.config.get('model')}, "
             f"{n} step{'' if n == 1 else 's'} of the compiled run")
    if not_run := [r for r in runs if r.not_started]:
        said = f"not checked: {not_run[0].error}"
    elif compiled.status == "failed":
        said = f"torch.compile failed here ({compiled.error}): the case could not be checked"
    elif compiled.status == "diverged":
        said = ("both diverged here: the divergence is not torch.compile's" if eager.status == "diverged" else
                "it reproduces here: torch.compile + bf16 diverged while bf16 in eager mode did not")
    elif eager.status == "diverged":
        said = "bf16 eager diverged and the compiled run did not: not the case reported"
    else:
        said = "it does not reproduce here: both stayed finite; your torch may carry the fix"
    return "\n".join([*lines, f"-> {said} ({where})"])
