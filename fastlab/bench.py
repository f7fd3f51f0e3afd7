"""The technique ladder: the naive configuration, each technique added on top of the last, then all on.

`python -m fastlab bench` runs it and writes results.json; the figure and the Markdown table are
drawn from that file (write_report), so they can always be redrawn from what was measured.
"""

from __future__ import annotations

import datetime as _dt
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .calibration import sized
from .config import TrainConfig, comparison_repeats, config_for, plan_arm, preferred_amp
from .files import write_atomic
from .measure import Spread, bf16_is_trap, resolve_device, usable_cpu_count
from .outcomes import (
    DEFAULT_SEEDS,
    TimeToAccuracy,
    TrapLimits,
    built_on,
    seconds_per_image,
    stopped_by_harness_budget,
    time_to_accuracy,
    tta_groups,
)
from .plots import figure_png, own_knobs, plot_tta_ladder, plot_waterfall
from .profiles import profile_of
from .results import RunResult, load_document, merge_repeats, save_results
from .train import run, skip_or_demonstrate
from .verdicts import ratio_of, step_slowdown, turns, verdict


@dataclass(frozen=True)
class Rung:
    name: str
    title: str
    changes: dict[str, Any]
    why: str


def ladder(base: TrainConfig) -> list[Rung]:
    """The rungs for this machine, cumulative: naive (torch's defaults), then one technique per rung (its title)."""
    device = resolve_device(base.device)
    small, large = profile_of(base).ladder_batches(base.model, base.batch_size)  # the naive rung uses the small one
    workers = min(usable_cpu_count(), 8 if device.type == "cuda" else 2)
    amp = preferred_amp(device)
    if amp == "off":  # a CPU without native bf16: the rung stays, as the known trap (shown in one short run)
        amp = "bf16"
    stock = TrainConfig()
    why = {rung: words[{"cuda": 0, "cpu": 1}.get(device.type, 2)] for rung, words in RUNG_WHY.items()}
    return [
        Rung("naive", "naive", dict(loader="dataloader", num_workers=0, pin_memory=False, non_blocking=False,
                                    persistent_workers=False, prefetch_factor=None, amp="off", tf32=stock.tf32,
                                    matmul_precision=stock.matmul_precision, cudnn_benchmark=False,
                                    channels_last=False, compile="off", batch_size=small, optimizer="adam",
                                    opt_impl="default", weight_decay=stock.weight_decay),
             "stock PyTorch: fp32 (torch's TF32 defaults), loading in the training process, Adam, a small batch"),
        Rung("workers", f"+{workers} workers, pin_memory", dict(num_workers=workers, pin_memory=True,
                                                               non_blocking=True, persistent_workers=True),
             why["workers"]),
        Rung("amp", f"+{amp} autocast", dict(amp=amp),
             why["amp"] + ("" if amp == "bf16" else " (fp16 with GradScaler: this device has no native bf16)") +
             (" (this CPU has no native bf16: a known trap, shown in one short run)" if bf16_is_trap(device) else "")),
        Rung("cudnn", "+cudnn.benchmark", dict(cudnn_benchmark=True), why["cudnn"]),
        Rung("channels_last", "+channels_last", dict(channels_last=True), why["channels_last"]),
        Rung("fused_adamw", "+AdamW (fused step, weight decay 0.05)",
             dict(optimizer="adamw", opt_impl="fused", weight_decay=0.05),
             "the checklist's optimiser, said together: decoupled weight decay (AdamW, 0.05) and its fused step"),
        Rung("device_loader", "+device-resident data",
             dict(loader="device", num_workers=0, pin_memory=False, non_blocking=False, persistent_workers=False),
             "the whole set on the device, augmented per batch as tensor ops"),
        Rung("large_batch", f"+batch {large}", dict(batch_size=large), "fewer, larger kernels per image"),
        Rung("all_on", "+torch.compile (all on)",
             dict(compile="reduce-overhead" if device.type == "cuda" else "default"),
             "torch.compile fuses kernels" + ("; reduce-overhead replays CUDA graphs" if device.type == "cuda" else "")),
    ]


# What a rung does on a CUDA GPU, a CPU and another device (MPS), true where it runs.
_WORKERS = "the DataLoader settings: worker processes decode and augment in parallel"
_NO_CUDNN = "a no-op here: cuDNN runs only on NVIDIA GPUs"
RUNG_WHY: dict[str, tuple[str, str, str]] = {
    "workers": (f"{_WORKERS}; pinned memory lets the copy to the GPU run asynchronously (non_blocking)",
                f"{_WORKERS}, on the same cores as training; pin_memory and non_blocking do nothing without a GPU",
                f"{_WORKERS}; pin_memory and non_blocking act only on copies to a CUDA GPU"),
    "amp": ("lower precision halves memory traffic and runs matmuls and convolutions on tensor cores",
            "lower precision halves memory traffic; a CPU has no tensor cores, and bf16 pays only where it has bf16 "
            "instructions (AVX-512 BF16): elsewhere it can be many times slower",
            "lower precision halves memory traffic"),
    "cudnn": ("cuDNN times its algorithms per shape and keeps the fastest", _NO_CUDNN, _NO_CUDNN),
    "channels_last": ("NHWC is the layout tensor cores want",
                      "NHWC: oneDNN has channels-last kernels; whether they beat NCHW here is measured",
                      "NHWC: whether it beats NCHW on this device is measured"),
}


RUNG_NAMES = [r.name for r in ladder(TrainConfig(device="cpu", profile="smoke"))]


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
    """The ladder for base, less the rungs its profile skips (skipped_rungs)."""
    return select_rungs(ladder(base), skip=list(skipped_rungs(base)))


def select_rungs(rungs: list[Rung], only: list[str] | None = None, skip: list[str] | None = None) -> list[Rung]:
    names = {r.name for r in rungs}
    for given in (only or []) + (skip or []):
        if given not in names:
            raise ValueError(f"unknown rung {given!r}; rungs are: {', '.join(r.name for r in rungs)}")
    both = set(only or []) & set(skip or [])
    if both:
        raise ValueError(f"rung(s) {sorted(both)} given to both --only and --skip; name each in one of them")
    keep = [r for r in rungs if (not only or r.name in only or r.name == "naive") and r.name not in (skip or [])]
    if not keep or keep[0].name != "naive":
        raise ValueError("the naive rung is the baseline every speed-up is measured against; it cannot be skipped")
    return keep


def speedups(results: list[RunResult], ttas: Sequence[TimeToAccuracy] = ()) -> list[dict[str, Any]]:
    """Per rung, against the first (naive): "speed", images/s over naive's (a Spread, NaN where a side timed no
    window); "tta", naive's seconds to target over the rung's as (Spread, reached, seeds, dropped), or why there is
    none ("no-op here", "DIVERGED", "not reached", "no naive time"), or None where it was not run."""
    tta = {t.runs[0].rung or t.label: t for t in ttas if t.runs}
    naive = results[0].throughput if results else Spread.of([])
    naive_tta = ttas[0].seconds if ttas and ttas[0].reached else None
    rows = []
    for r in results:
        row: dict[str, Any] = {"label": r.label, "status": r.status, "dropped": bool(r.dropped),
                               "speed": ratio_of(naive, r.throughput), "tta": None}
        if r.extras.get("tta_skipped"):
            row["tta"] = "no-op here"
        elif (t := tta.get(r.rung)) is not None:
            diverged = any(x.status == "diverged" for x in t.runs)
            if t.reached and naive_tta is not None and not diverged:  # > 1: faster to the target
                row["tta"] = (ratio_of(t.seconds, naive_tta), t.reached, len(t.runs), bool(t.runs[0].dropped))
            else:
                row["tta"] = "DIVERGED" if diverged else ("not reached" if not t.reached else "no naive time")
        rows.append(row)
    return rows


# A rung under this speed ratio to the rung below (or failed, diverged, out of time) is a trap, not carried up.
# Milder slowdowns are kept: techniques combine (bf16 pays once channels_last and a large batch join it).
DROP_BELOW_RATIO = 0.5


def drop_reason(result: RunResult, below: RunResult | None) -> str | None:
    """Why a rung's change should not be carried up the ladder, or None. A stop by the harness's budget is judged by
    what it measured: its windows, else its step time against the rung below's (a rung too slow to time a window
    is a trap when its steps are), else it is not measured, and not carried up."""
    if below is None:
        return None
    budget_stop = stopped_by_harness_budget(result)
    if budget_stop and not result.window_throughput:
        slowdown, steps = step_slowdown(below, result)
        ran_out = f"the harness's time budget ran out before its first timed window ({result.error})"
        if slowdown > 1 / DROP_BELOW_RATIO:
            return (f"{1 / slowdown:.2f}x the rung below it by step time (under {DROP_BELOW_RATIO}x; {steps}): a trap "
                    f"on this machine; {ran_out}")
        against = "against the rung below, " if slowdown == slowdown else ""  # nan: a side has no step time
        return f"not measured: {ran_out}; {against}{steps}"
    if result.status in ("failed", "diverged") or (result.status == "time_limited" and not budget_stop) \
            or not result.window_throughput:
        return f"{result.status}: {result.error or 'no timed window finished'}"
    if not below.window_throughput:
        return None  # nothing to compare with (the rung below went unmeasured)
    # the first pass has one run per rung: a guard against carrying a trap up, not a verdict, so the windows alone
    c = verdict(Spread.of(below.window_throughput), Spread.of(result.window_throughput))
    if c.ratio < DROP_BELOW_RATIO and not c.noise:
        return f"{c.ratio:.2f}x the rung below it (under {DROP_BELOW_RATIO}x): a trap on this machine"
    return None


def run_ladder(base: TrainConfig, rungs: list[Rung], progress: bool = True,
               on_result: Callable[[RunResult], None] | None = None,
               max_seconds: float | Callable[[], float] | None = None, budget_s: float | None = None,
               not_run: dict[str, str] | None = None, repeats: int | None = None,
               on_update: Callable[[list[RunResult]], None] | None = None) -> list[RunResult]:
    """Run the rungs cumulatively; a trap (drop_reason) is not carried up; stops when a run is interrupted.

    max_seconds: each rung's timed budget (or a function called per rung); no rung starts after budget_s of wall
    time (not_run says why). Repeats alternate direction so a steady drift lands on every rung alike."""
    results: list[RunResult] = []
    configs: list[TrainConfig] = []
    kept: dict[str, Any] = {}
    bar = _rung_bar(len(rungs), "bench ladder", progress)
    started = time.monotonic()
    for rung in rungs:
        spent = time.monotonic() - started
        if budget_s is not None and spent >= budget_s:
            if not_run is not None:
                not_run[rung.title] = f"the ladder's budget of {budget_s:g} s was spent ({spent:.0f} s)"
            continue
        cfg = base.replace(**{**kept, **rung.changes})
        if max_seconds is not None:
            budget = max_seconds() if callable(max_seconds) else max_seconds
            cfg = cfg.replace(max_seconds=max(budget, 1.0))
        result = (skip_or_demonstrate(base.replace(**kept), cfg, rung.title, progress=progress)
                  or run(cfg, label=rung.title, progress=progress))  # no-op, a short trap run, or a full run
        result.rung = rung.name
        below = built_on(results, len(results))  # a rung dropped or not trained is not built on
        reason = drop_reason(result, below) if result.status not in ("interrupted", "no_op") else None
        reason = reason or (f"a trap here: {result.trap}" if result.trap else None)
        if reason:
            result.dropped = reason
        else:
            kept.update(rung.changes)
        results.append(result)
        configs.append(cfg)
        if on_result is not None:
            on_result(result)
        if on_update is not None:
            on_update(list(results))
        bar.set_postfix_str(f"{rung.name}: {result.throughput.median:,.0f} img/s" if result.window_throughput else
                            f"{rung.name}: {result.status.replace('_', ' ')}")  # no figure for what did not run
        bar.update(1)
        if result.status == "interrupted":
            break
    bar.close()
    rounds = repeats if repeats is not None else comparison_repeats(base)
    if rounds > 1 and results and results[-1].status != "interrupted":
        results = _repeat_rungs(results, configs, rounds, progress, on_update)
    return results


def _repeat_rungs(first: list[RunResult], configs: list[TrainConfig], rounds: int, progress: bool,
                  on_update: Callable[[list[RunResult]], None] | None) -> list[RunResult]:
    """Passes 2..rounds over the rungs that timed a window, alternating direction; each rung's runs merged."""
    runs = [[r] for r in first]
    again = [i for i, r in enumerate(first) if r.window_throughput and not r.trap]  # a trap: shown once
    for p, j in turns(len(again), rounds):
        if p == 0:
            continue  # the first pass ran already
        i = again[j]
        r = run(configs[i], label=first[i].label, progress=progress)
        r.rung, r.dropped = first[i].rung, first[i].dropped
        runs[i].append(r)
        merged = [merge_repeats(rs) for rs in runs]
        if on_update is not None:
            on_update(merged)
        if r.status == "interrupted":
            return merged
    return [merge_repeats(rs) for rs in runs]


def _rung_bar(total: int, desc: str, progress: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="rung", disable=not progress)


def tta_drop_reason(tta: TimeToAccuracy) -> str | None:
    """A rung whose seeds never reach the target (or diverge) is not carried up the time-to-accuracy ladder."""
    diverged = [r for r in tta.runs if r.status == "diverged"]
    if diverged:
        return f"diverged in {len(diverged)} of {len(tta.runs)} seeds ({diverged[0].error})"
    if tta.reached == 0:
        return f"target {tta.target:.0%} not reached in any seed"
    return None


def tta_limits(below: TimeToAccuracy | None) -> TrapLimits | None:
    """A rung's trap limits from the rung it builds on, by DROP_BELOW_RATIO (see outcomes.TrapLimits)."""
    if below is None or not below.reached:
        return None
    per_image = [s for r in below.runs if (s := seconds_per_image(r)) is not None]  # synchronised windows
    return TrapLimits(max_training_seconds=below.seconds.high / DROP_BELOW_RATIO,
                      max_seconds_per_image=statistics.median(per_image) / DROP_BELOW_RATIO if per_image else None)


def rung_tta(cfg: TrainConfig, rung: str, label: str, below: TimeToAccuracy | None, seeds: tuple[int, ...],
             progress: bool = True, dropped: str | None = None) -> TimeToAccuracy:
    """One rung's time to accuracy over seeds, with the trap limits of the rung it builds on (tta_limits); its runs
    tagged with the rung and why it is dropped (`dropped`, by default tta_drop_reason)."""
    tta = time_to_accuracy(cfg, seeds=seeds, label=label, progress=progress, limits=tta_limits(below))
    reason = tta_drop_reason(tta) if dropped is None else dropped
    for r in tta.runs:
        r.rung, r.dropped = rung, reason or ""
        r.extras["metric"] = "time-to-accuracy"
    return tta


def run_tta_ladder(base: TrainConfig, rungs: list[Rung], seeds: tuple[int, ...] = DEFAULT_SEEDS,
                   progress: bool = True, on_result: Callable[[list[RunResult]], None] | None = None,
                   not_run: dict[str, str] | None = None) -> list[TimeToAccuracy]:
    """The ladder on time-to-accuracy over `seeds`; a rung of no-ops here is not run (not_run gets its reason).
    on_result: after each rung, with every run so far."""
    out: list[TimeToAccuracy] = []
    kept: dict[str, Any] = {}
    below: TimeToAccuracy | None = None
    bar = _rung_bar(len(rungs), "time-to-accuracy ladder", progress)
    device = resolve_device(base.device)
    for rung in rungs:
        cfg = base.replace(**{**kept, **rung.changes})
        plan = plan_arm(base.replace(**kept), cfg, device)
        if plan.kind == "no-op":
            if not_run is not None:
                not_run[rung.title] = plan.reason
            bar.update(1)
            continue
        tta = rung_tta(cfg, rung.name, rung.title, below, seeds, progress)
        if not tta_drop_reason(tta):
            kept.update(rung.changes)
            below = tta
        out.append(tta)
        if on_result is not None:
            on_result([r for t in out for r in t.runs])
        bar.update(1)
        if any(r.status == "interrupted" for r in tta.runs):
            break
    bar.close()
    return out


def default_out_dir() -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("bench-results") / stamp


METRICS = ("throughput", "time-to-accuracy")


def bench(out_dir: str | Path | None = None, profile: str | None = None, model: str | None = None,
          only: list[str] | None = None, skip: list[str] | None = None, progress: bool = True,
          metric: str = "throughput", seeds: int = len(DEFAULT_SEEDS)) -> Path:
    """Run the ladder and write results.json (after every rung), bench.png and bench.md into out_dir; returns it."""
    if metric not in METRICS:
        raise ValueError(f"metric={metric!r} is not allowed: choose one of {', '.join(map(repr, METRICS))}")
    base = config_for(profile)
    if model:
        base = base.replace(model=model)
    rungs = select_rungs(ladder(base), only, skip)
    out = Path(out_dir) if out_dir else default_out_dir()
    path = out / "results.json"
    meta: dict[str, Any] = {"kind": "bench", "metric": metric, "profile": base.profile, "model": base.model}
    if metric == "throughput":  # every rung the same steps, sized by time from the naive rung's calibration
        naive, meta["calibration"] = sized(base.replace(**rungs[0].changes), len(rungs) * comparison_repeats(base))
        base = base.replace(steps=naive.steps)
    started = time.perf_counter()

    def save(results: list[RunResult]) -> None:
        meta["wall_seconds"] = time.perf_counter() - started  # so far: a run cut short says how long it ran
        save_results(path, results, meta=meta)

    if metric == "throughput":
        save(run_ladder(base, rungs, progress=progress, on_update=save))
    else:
        meta["not_run"] = {}
        ttas = run_tta_ladder(base, rungs, seeds=tuple(range(seeds)), progress=progress, on_result=save,
                              not_run=meta["not_run"])
        save([r for t in ttas for r in t.runs])
    write_report(path)
    return out


def write_report(results_path: str | Path) -> tuple[Path, Path]:
    """Draw bench.png and bench.md beside a results file, from that file alone."""
    results_path = Path(results_path)
    doc = load_document(results_path)
    results = [RunResult.from_dict(r) for r in doc["results"]]
    if doc.get("meta", {}).get("metric") == "time-to-accuracy":
        fig = plot_tta_ladder(tta_groups(results), not_run=doc["meta"].get("not_run"))
    else:
        fig = plot_waterfall(results, title="fastlab bench")
    png = results_path.parent / "bench.png"
    write_atomic(png, figure_png(fig, dpi=110))
    md = results_path.parent / "bench.md"
    write_atomic(md, report_markdown(doc))
    return png, md


def report_markdown(doc: dict[str, Any]) -> str:
    """bench.md of a results document (as load_document reads it): its table, notes and wall time."""
    results = [RunResult.from_dict(r) for r in doc["results"]]
    meta = doc.get("meta", {})
    if meta.get("metric") == "time-to-accuracy":
        text = tta_markdown_table(tta_groups(results), meta.get("not_run"))
    else:
        text = markdown_table(results)
    if meta.get("wall_seconds") and results:
        text += (f"\nThe whole command ran for {meta['wall_seconds'] / 60:.1f} minutes of wall time (set-up, training "
                 "and evaluation).\n")
    return text


def _heading(what: str, first: RunResult, extra: str = "") -> str:
    """A table's first line: what ran where, on which data."""
    env = first.env
    return (f"fastlab {what} on {env.get('device_name')}, torch {env.get('torch')}, profile {env.get('profile')}, "
            f"model {first.config.get('model')}, {first.data_name}, {extra}{env.get('date')}")


def tta_markdown_table(ttas: list[TimeToAccuracy], not_run: dict[str, str] | None = None) -> str:
    """The time-to-accuracy ladder as a Markdown table, computed from the runs."""
    if not ttas or not ttas[0].runs:
        return "No results.\n"
    lines = [_heading("time-to-accuracy ladder", ttas[0].runs[0], f"target {ttas[0].target:.0%} held-out accuracy, "
                      f"{len(ttas[0].runs)} seeds per rung (fewer where a note says why), "), "",
             "| rung | training s to target, median (min-max) | reached | vs naive | median steps | best accuracy "
             "median (min-max) | images/s median | no-ops here |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    base = ttas[0].seconds
    notes: list[str] = []
    for t in ttas:
        s, b = t.seconds, t.best_accuracy
        dropped = t.runs[0].dropped
        name = t.label + (f" (dropped: {dropped})" if dropped else "")
        speed = Spread.of([r.throughput.median for r in t.runs if r.window_throughput]).median
        no_ops = ", ".join(sorted({k for r in t.runs for k in r.no_ops}))
        if t.seeds_not_run:
            notes.append(f"{t.label}: {t.seeds_not_run}.")
        if t.reached:
            c = verdict(base, s, "s", higher_is_better=False)
            vs = f"{c.gain:.2f}x" if c.comparable and s.median else ""
            if c.comparable and t is not ttas[0] and c.noise:
                vs += " (noise)"
            time_cell, steps = f"{s.median:.1f} ({s.low:.1f}-{s.high:.1f})", f"{t.steps.median:.0f}"
        else:
            time_cell, vs, steps = "not reached", "", ""
        best = f"{b.median:.1%} ({b.low:.1%}-{b.high:.1%})" if b.n else "not evaluated (stopped first)"
        lines.append(f"| {name} | {time_cell} | {t.reached}/{len(t.runs)} | {vs} | {steps} | {best} "
                     f"| {'' if math.isnan(speed) else f'{speed:,.0f}'} | {no_ops} |")
    if notes:
        lines += ["", "Seeds not run: " + " ".join(notes)]
    if not_run:
        lines += ["", "Not run here (every knob of the rung is a no-op on this device): " +
                  "; ".join(f"{k}: {v}" for k, v in not_run.items()) + "."]
    lines += ["", "Training seconds to target: wall time of every training step (warm-up and compilation included) up "
              "to the evaluation checkpoint that first reached the target; evaluation time excluded. Median, min and "
              "max over the seeds that reached it; 'vs naive' = naive's median / the rung's median; 'noise': a "
              "median inside the other's range. Each rung keeps the changes of the rungs below it that reached "
              "the target without diverging. Above naive, a seed that takes over twice the slowest time of the rung "
              "it builds on is stopped (the throughput ladder's trap rule, 0.5x); a rung whose first seed diverges, "
              "is stopped while taking over twice as long per image, or spends its budget in warm-up, runs no more "
              "seeds. A compiled rung compiles from empty caches in every seed, as a first run does."]
    return "\n".join(lines) + "\n"


def only_no_ops(r: RunResult, below: RunResult) -> bool:
    """Whether every config field in which r differs from the rung below (a seed too) is a no-op of r here."""
    changed = own_knobs(r, below, ignore=("max_seconds",))
    return bool(changed) and all(k in r.no_ops for k in changed)


def _wait_cell(r: RunResult) -> str:
    """'12%' of data wait, '12% + 30% copy' where a host-to-device copy was timed apart."""
    wait, copy = r.data_wait_fraction(), r.copy_fraction()
    if math.isnan(wait):
        return ""
    return f"{wait:.0%}" + ("" if math.isnan(copy) else f" + {copy:.0%} copy")


def markdown_table(results: list[RunResult]) -> str:
    """The ladder as a Markdown table; each figure is computed from the results, with its formula below."""
    if not results:
        return "No results.\n"
    copies = any(not math.isnan(r.copy_fraction()) for r in results)  # a device to copy to: shown apart
    lines = [_heading("bench", results[0]), "",
             "| rung | images/s median (min-max) | vs naive | vs the rung it builds on | peak memory MiB | "
             f"data wait{' (+ copy)' if copies else ''} | "
             "held-out acc. (one run) | no-ops here |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    over_naive = speedups(results)
    drifts: list[str] = []
    for i, (r, row) in enumerate(zip(results, over_naive)):
        t, below = r.throughput, built_on(results, i)
        if r.status == "failed" or not r.window_throughput:
            dropped = " (dropped from the rungs above)" if r.dropped else ""
            lines.append(f"| {r.label}{dropped} | {r.status}: {r.error or 'no timed window finished'} | | | | | | |")
            continue
        vs_base = "" if math.isnan(row["speed"].median) else f"{row['speed'].median:.2f}x"
        if below is None or not below.window_throughput:
            vs_prev = ""
        else:
            c = verdict(below.throughput, t)
            # one pass (a single pair) cannot tell the machine's drift from an effect of any size: not "noise"
            vs_prev = f"{c.ratio:.2f}x" + (" (one run each)" if c.single_pair else " (noise)" if c.noise else "")
        if below is not None and vs_prev and only_no_ops(r, below):
            # the same computation as the rung below: a difference is the machine drifting, not the knob
            drifts.append(f"{r.label} ({vs_prev})")
            vs_prev += " (no-op: drift)"
        acc = f"{r.eval_accuracy:.1%}" if r.eval_accuracy is not None else ""
        no_ops = ", ".join(r.no_ops)
        status = "" if r.ok else f" ({r.status}{': speed not credited' if r.status == 'diverged' else ''})"
        if r.dropped:
            status += " (dropped from the rungs above)"
        lines.append(f"| {r.label}{status} | {t.median:,.0f} ({t.low:,.0f}-{t.high:,.0f}) | {vs_base} | {vs_prev} | "
                     f"{r.peak_memory_mb:,.0f} | {_wait_cell(r)} | {acc} | {no_ops} |")
    reasons = {k: v for r in results for k, v in r.no_ops.items()}
    if reasons:
        lines += ["", "No-ops here: " + "; ".join(f"{k}: {v}" for k, v in reasons.items()) + "."]
    if drifts:
        lines += ["", "Every change of " + ", ".join(drifts) + " is a no-op here, so it computed exactly what the "
                  "rung below it did: the difference is how the machine's speed drifted between the two runs, and "
                  "a bound on how far any other difference in this table can be trusted."]
    dropped = [f"{r.label}: {r.dropped}" for r in results if r.dropped]
    if dropped:
        lines += ["", "Dropped rungs (measured, then left out of the rungs above): " + "; ".join(dropped) + "."]
    lines += ["", "images/s = batch_size x grad_accum_steps x steps in a window / window wall time; median, min and max "
              "over the timed windows (warm-up excluded), of every repeat when the ladder ran more than once (naive to "
              "top, then back down: a steady drift lands on every rung alike). " + (
                  "Data wait: time blocked on the next batch / step time; '+ copy': the host-to-device copy's share, "
                  "apart (without non_blocking it also waits for the previous step's GPU work). " if copies else "") +
              "'noise': fastlab.verdicts.is_noise, the one "
              "noise rule: a difference that some repeat does not show outside its intervals of the median; 'one run "
              "each': a single pass, where the machine's drift cannot be told from an effect of any size. Peak memory: " + (results[0].memory_kind or "?").replace("_", " ") + ". Held-out accuracy "
              "is one run per rung: a difference between rungs cannot be told from seed noise (`--metric "
              "time-to-accuracy` measures the outcome over seeds). A diverged rung's speed is shown, never credited."]
    return "\n".join(lines) + "\n"
