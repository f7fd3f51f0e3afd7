"""The technique ladder: the naive configuration, each technique added on top of the last, then all on.

`python -m fastlab bench` runs it and writes results.json; the figure and the Markdown table are
drawn from that file (write_report), so they can always be redrawn from what was measured.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import TrainConfig, config_for
from .measure import bf16_supported, is_noise, resolve_device
from .results import RunResult, load_document, save_results
from .train import run

# Naive and large batch size per profile and model: the naive rung uses the small one.
LADDER_BATCH = {"smoke": (32, 64), "cpu": (64, 128), "gpu": (128, 512)}
LADDER_BATCH_COMPACT_GPU = (128, 1024)


@dataclass(frozen=True)
class Rung:
    name: str
    title: str
    changes: dict[str, Any]
    why: str


def ladder(base: TrainConfig) -> list[Rung]:
    """The rungs for this machine. Changes are cumulative: each rung keeps those before it."""
    device = resolve_device(base.device)
    small, large = LADDER_BATCH.get(base.profile, (base.batch_size, base.batch_size * 2))
    if base.profile == "gpu" and base.model == "compact":
        small, large = LADDER_BATCH_COMPACT_GPU
    workers = min(os.cpu_count() or 1, 8 if device.type == "cuda" else 2)
    amp = "bf16" if bf16_supported(device) else "fp16"
    return [
        Rung("naive", "naive", dict(loader="dataloader", num_workers=0, pin_memory=False, non_blocking=False,
                                    persistent_workers=False, prefetch_factor=None, amp="off", tf32=False,
                                    cudnn_benchmark=False, channels_last=False, compile="off", batch_size=small,
                                    optimizer="adam", opt_impl="for-loop", log_every=1),
             "fp32, loading in the training process, Adam, a small batch, loss read every step"),
        Rung("workers", "+workers, pin_memory", dict(num_workers=workers, pin_memory=True, non_blocking=True,
                                                     persistent_workers=True),
             f"{workers} worker processes decode and augment in parallel; pinned memory makes copies async"),
        Rung("amp", f"+{amp} autocast", dict(amp=amp), "lower precision halves memory traffic and uses tensor cores"),
        Rung("cudnn", "+cudnn.benchmark", dict(cudnn_benchmark=True), "cuDNN times its algorithms per shape"),
        Rung("channels_last", "+channels_last", dict(channels_last=True), "NHWC is the layout tensor cores want"),
        Rung("fused_adamw", "+fused AdamW", dict(optimizer="adamw", opt_impl="fused", weight_decay=0.05),
             "one kernel updates every parameter; decoupled weight decay"),
        Rung("device_loader", "+device-resident data",
             dict(loader="device", num_workers=0, pin_memory=False, non_blocking=False, persistent_workers=False,
                  log_every=10),
             "the whole set on the device, augmented per batch as tensor ops; loss read every 10 steps"),
        Rung("large_batch", f"+batch {large}", dict(batch_size=large), "fewer, larger kernels per image"),
        Rung("all_on", "all on (+compile, tf32)",
             dict(compile="reduce-overhead" if device.type == "cuda" else "default", tf32=True),
             "torch.compile fuses kernels; reduce-overhead replays CUDA graphs"),
    ]


RUNG_NAMES = [r.name for r in ladder(TrainConfig(device="cpu", profile="smoke"))]


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


# A rung that makes this machine more than this much slower than the rung below it (or fails, or runs out
# of its time budget) is a trap here, not a step up: it is shown, then left out of the rungs above it.
# Smaller slowdowns are kept, since techniques combine (bf16 pays once channels_last and a large batch join it).
DROP_BELOW_RATIO = 0.5


def drop_reason(result: RunResult, below: RunResult | None) -> str | None:
    """Why a rung's change should not be carried up the ladder, or None to keep it."""
    if below is None:
        return None
    if result.status in ("failed", "time_limited") or not result.window_throughput:
        return f"{result.status}: {result.error or 'no timed window finished'}"
    ratio = result.throughput.median / below.throughput.median
    if ratio < DROP_BELOW_RATIO and not is_noise(below.throughput, result.throughput):
        return f"{ratio:.2f}x the rung below it (under {DROP_BELOW_RATIO}x): a trap on this machine"
    return None


def run_ladder(base: TrainConfig, rungs: list[Rung], progress: bool = True) -> list[RunResult]:
    """Run the rungs cumulatively; a rung that is a trap here (see drop_reason) is not carried up.
    Stops early (keeping what ran) when a run is interrupted."""
    results: list[RunResult] = []
    kept: dict[str, Any] = {}
    below: RunResult | None = None
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(rungs), desc="bench ladder", unit="rung")
    for rung in rungs:
        cfg = base.replace(**{**kept, **rung.changes})
        result = run(cfg, label=rung.title, progress=progress)
        result.extras["rung"] = rung.name
        result.extras["why"] = rung.why
        reason = drop_reason(result, below) if result.status != "interrupted" else None
        if reason:
            result.extras["dropped"] = reason
        else:
            kept.update(rung.changes)
            below = result
        results.append(result)
        if bar is not None:
            bar.set_postfix_str(f"{rung.name}: {result.throughput.median:,.0f} img/s")
            bar.update(1)
        if result.status == "interrupted":
            break
    if bar is not None:
        bar.close()
    return results


def default_out_dir() -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("bench-results") / stamp


def bench(out_dir: str | Path | None = None, profile: str | None = None, model: str | None = None,
          only: list[str] | None = None, skip: list[str] | None = None, progress: bool = True) -> Path:
    """Run the ladder, write results.json, bench.png and bench.md into out_dir; returns out_dir."""
    base = config_for(profile)
    if model:
        base = base.replace(model=model)
    rungs = select_rungs(ladder(base), only, skip)
    out = Path(out_dir) if out_dir else default_out_dir()
    results = run_ladder(base, rungs, progress=progress)
    save_results(out / "results.json", results, meta={"kind": "bench", "profile": base.profile, "model": base.model})
    write_report(out / "results.json")
    return out


def write_report(results_path: str | Path) -> tuple[Path, Path]:
    """Draw bench.png and bench.md beside a results file, from that file alone."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from .plots import figure_png, plot_waterfall
    from .results import RunResult

    results_path = Path(results_path)
    doc = load_document(results_path)
    results = [RunResult.from_dict(r) for r in doc["results"]]
    png = results_path.parent / "bench.png"
    png.write_bytes(figure_png(plot_waterfall(results, title="fastlab bench"), dpi=110))
    md = results_path.parent / "bench.md"
    md.write_text(markdown_table(results))
    return png, md


def markdown_table(results: list[RunResult]) -> str:
    """The ladder as a Markdown table; each figure is computed from the results, with its formula below."""
    if not results:
        return "No results.\n"
    env = results[0].env
    data = "SYNTHETIC data" if results[0].synthetic else f"real {results[0].dataset.get('name', '?')}"
    lines = [f"fastlab bench on {env.get('device_name')}, torch {env.get('torch')}, profile "
             f"{env.get('profile')}, model {results[0].config.get('model')}, {data}, {env.get('date')}", "",
             "| rung | images/s median (min-max) | vs naive | vs the rung it builds on | peak memory MiB | data wait | "
             "held-out acc. | no-ops here |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    base = results[0]
    below: RunResult | None = None  # the last rung carried up: what each rung is built on
    for r in results:
        t = r.throughput
        if r.status == "failed" or not r.window_throughput:
            dropped = " (dropped from the rungs above)" if r.extras.get("dropped") else ""
            lines.append(f"| {r.label}{dropped} | {r.status}: {r.error or 'no timed window finished'} | | | | | | |")
            continue
        vs_base = f"{t.median / base.throughput.median:.2f}x" if base.window_throughput else ""
        if below is None or not below.window_throughput:
            vs_prev = ""
        elif is_noise(below.throughput, t):
            vs_prev = f"{t.median / below.throughput.median:.2f}x (noise)"
        else:
            vs_prev = f"{t.median / below.throughput.median:.2f}x"
        if not r.extras.get("dropped"):
            below = r
        acc = f"{r.eval_accuracy:.1%}" if r.eval_accuracy is not None else ""
        no_ops = ", ".join(r.no_ops)
        status = "" if r.ok else f" ({r.status})"
        if r.extras.get("dropped"):
            status += " (dropped from the rungs above)"
        wait = r.data_wait_fraction()
        lines.append(f"| {r.label}{status} | {t.median:,.0f} ({t.low:,.0f}-{t.high:,.0f}) | {vs_base} | {vs_prev} | "
                     f"{r.peak_memory_mb:,.0f} | {'' if math.isnan(wait) else f'{wait:.0%}'} | {acc} | {no_ops} |")
    reasons = {k: v for r in results for k, v in r.no_ops.items()}
    if reasons:
        lines += ["", "No-ops here: " + "; ".join(f"{k}: {v}" for k, v in reasons.items()) + "."]
    dropped = [f"{r.label}: {r.extras['dropped']}" for r in results if r.extras.get("dropped")]
    if dropped:
        lines += ["", "Dropped rungs (measured, then left out of the rungs above): " + "; ".join(dropped) + "."]
    lines += ["", "images/s = batch_size x grad_accum_steps x steps in a window / window wall time; median, min and max "
              "over the timed windows (warm-up excluded). 'noise': the median of one rung lies inside the other's "
              "min-max range. Peak memory: " + (results[0].memory_kind or "?").replace("_", " ") + "."]
    return "\n".join(lines) + "\n"
