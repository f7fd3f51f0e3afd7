"""Read a run, name its bottleneck, say what to try next, and measure whether it helped.

    findings = fastlab.advise(result)                  # ranked Findings, each with its evidence
    advice = fastlab.advise(result, verify=True)       # ... and the top one tried: advice.verification

Each rule holds a measured number (or a knob) of result (never this machine) against a threshold below and
proposes a config change. Runs of your own loop (fastlab.watch) cannot be re-run: verify points to compare_loops.
"""

from __future__ import annotations

import html
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .config import TrainConfig, positive_int
from .measure import Spread, resolve_device
from .results import RunResult
from .train import describe_changes, run
from .verdicts import CREDITED, Comparison, runs_verdict, turns, verdict

# Removing a share s of a step gains at most 1 / (1 - s) (Amdahl): s >= 0.15 (1.18x) clears +-15% window noise.
DATA_WAIT_SHARE = 0.15  # data wait / step time at or above which the loader sets the pace
OPTIMIZER_SHARE = 0.15  # optimizer.step() / step time (sampled in warm-up) at or above which its implementation matters
SHORT_STEP_S = 0.015  # ~10-20 us of host time per op x ~1000 ops: a shorter GPU step is paced by the host
CPU_SMALL_BATCH = 8  # on a CPU, a batch this small gives too little work per op
# This share of NVML samples under GPU_UTIL_LOW_PCT, with some data wait (none: launch overhead), means starving.
GPU_UTIL_LOW_PCT = 60.0
GPU_UTIL_LOW_SHARE = 0.25
GPU_UTIL_MIN_SAMPLES = 10
DATA_WAIT_SHARE_WITH_UTIL = DATA_WAIT_SHARE / 2
MEMORY_HEADROOM_SHARE = 0.40  # activations ~ batch: under 40% of the device, doubling it leaves a margin
MEMORY_LIMIT_SHARE = 0.90  # above 90%, fragmentation alone can make the next larger shape run out of memory
TENSOR_CORE_CC = 7.0  # Volta
BF16_CC = 8.0  # Ampere
# The reader's own DataLoader: workers pickle every batch (a fixed cost each) and compete for the cores.
LOADER_SMALL_BATCH = 16  # images per batch at or under which that per-batch cost is a large share
LOADER_SMALL_BATCH_BYTES = 2**20
LOADER_MIN_CORES = 3  # workers plus the training process need this many cores
LOADER_OFF_CPU_SHARE = 0.25  # a wait with CPU time under this share sleeps (disk, network): no core needed
LOADER_MAX_WORKERS = 8
LOG_EVERY = 10  # one host-device sync per 10 steps (the bench ladder's choice)
BATCH_GROWTH = 4  # the overhead-bound remedy: fixed costs shared by 4x the images
# A probable leak (C11): each of LEAK_CHUNKS stretches' median above the last, a robust (Theil-Sen) rise above the
# floor and LEAK_NOISE_FACTOR x the noise, the last stretch still rising: growth that stops is not a leak.
LEAK_MIN_STEPS = 8
LEAK_CHUNKS = 4
LEAK_NOISE_FACTOR = 4.0
LEAK_CHUNK_NOISE = 1.0
LEAK_TAIL_SHARE = 0.5
LEAK_MIN_MB = {"process_rss": 32.0}  # a CPU's resident set holds glibc heap growth (up to 32 MiB)
LEAK_MIN_MB_DEFAULT = 4.0

# Divergence, then memory, then bottlenecks in the order they hide each other, then advice from the config.
PRIORITY = ("diverged", "out_of_memory", "memory_leak", "data_bound", "overhead_bound", "optimizer_bound",
            "fp32_on_tensor_cores", "layout_and_kernels", "host_sync_every_step", "memory_near_limit",
            "memory_headroom", "loss_tensor_kept", "eval_with_autograd")

NOTEBOOKS = {
    "data": "01_data_loading", "amp": "02_mixed_precision", "kernels": "03_cudnn_benchmark_and_channels_last",
    "batch": "04_batch_size", "hygiene": "05_no_grad_detach_item", "optimizer": "06_adamw_and_schedules",
    "compile": "07_compile_and_export",
}
WATCHED = "watched"  # RunResult.extras key set by fastlab.watch
CUSTOM_DATASETS = "Datasets passed to fastlab.run"  # RunResult.dataset["source"] of a run on torch Datasets


@dataclass(frozen=True)
class Evidence:
    """One number (or knob) read from the result, and the rule it was held against."""

    what: str
    value: float | str
    rule: str = ""  # e.g. ">= 15%": the threshold that made this count
    unit: str = ""  # "%", "ms", "MiB", "GiB" or "" (how value is printed)

    def shown(self) -> str:
        v, u = self.value, self.unit
        text = (v if isinstance(v, str) else f"{v:.0%}" if u == "%" else f"{v:.1f} ms" if u == "ms"
                else f"{v:,.1f} {u}" if u else f"{v:g}")
        return f"{self.what} = {text}" + (f" (rule: {self.rule})" if self.rule else "")


@dataclass(frozen=True)
class Finding:
    """A named bottleneck, the evidence that triggered it, and the config change to try."""

    key: str  # one of PRIORITY
    bottleneck: str
    evidence: tuple[Evidence, ...]
    technique: str
    notebooks: tuple[str, ...]
    changes: dict[str, Any]  # apply with TrainConfig.from_dict(result.config).replace(**changes)
    why: str
    alternatives: tuple[dict[str, Any], ...] = ()
    metric: str = "train"  # what verify compares: "train" or "eval" images/s, or "finite" (the loss stays finite)
    confidence: str = ""  # how sure the remedy is, and why ("high: ..."); empty where the rule does not weigh it

    def text(self) -> str:
        change = f"  -> changes {describe_changes(self.changes)}" if self.changes else ""
        return "\n".join([self.bottleneck, *(f"  evidence: {e.shown()}" for e in self.evidence),
                          f"  try: {self.technique}{change}", f"  why: {self.why}",
                          f"  notebook: {', '.join(self.notebooks)}"]
                         + (["  or: " + "; ".join(map(describe_changes, self.alternatives))] if self.alternatives else [])
                         + ([f"  how sure: {self.confidence}"] if self.confidence else []))


class Advice(list):
    """The ranked findings of one result (a list of Finding), with the verification when one was run."""

    def __init__(self, result: RunResult, findings: list[Finding]) -> None:
        super().__init__(findings)
        self.result = result
        self.verification: Verification | None = None

    def text(self) -> str:
        """The result's summary, its watch notes, then each finding (what `python -m fastlab advise` prints)."""
        r = self.result
        lines = [f"{r.summary()}; on {r.env.get('device_name', '?')}"]
        lines += [f"  note: {n}" for n in _watch(r).get("notes", [])]
        done = f"failed after {r.steps_done} steps" if r.steps_done else "measured nothing"
        if not self:
            lines.append(f"  Nothing to advise: the run {done} (see above)." if r.status == "failed" else
                         "  No bottleneck crossed its threshold: nothing to advise from this run.")
        lines += [f"{i}. " + f.text().replace("\n", "\n   ") for i, f in enumerate(self, 1)]
        return "\n".join(lines + ([self.verification.text()] if self.verification else []))


def _pct(x: float) -> str:
    return f"{x * 100:g}%"  # 0.15 -> "15%", 0.075 -> "7.5%": thresholds printed exactly


def _share(what: str, value: float, op: str, threshold: float, more: str = "") -> Evidence:
    """A share of the step (or of the device) held against a threshold share: printed as percentages."""
    return Evidence(what, value, f"{op} {_pct(threshold)}{more}", "%")


def _amdahl(share: float) -> str:
    """The most a step can speed up when a share of it costs nothing: 1 / (1 - share) (Amdahl), as "1.18x"."""
    return f"{1 / (1 - min(share, 0.99)):.2f}x"


def _finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _step_seconds(r: RunResult) -> float:
    """Mean wall time of a timed step, from the synchronised windows: images per step / images per second."""
    t = r.throughput.median
    return r.images_per_step / t if r.window_throughput and t > 0 else float("nan")


def _only_different(cfg: dict[str, Any], proposed: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in proposed.items() if cfg.get(k) != v}


def _watch(r: RunResult) -> dict[str, Any]:
    """What fastlab.watch recorded of the reader's loop (notes, syncs, earlier runs...); {} for fastlab.run's."""
    return r.extras.get("watch") or {}


def _cores(r: RunResult) -> int:
    """The cores the run could use (its affinity, not the host's count), as recorded with it; never this machine's."""
    return int(r.env.get("usable_cpus") or r.env.get("cpu_count") or 1)


def _env_number(r: RunResult, key: str) -> float:
    """A number of result.env ("compute_capability", "gpu_memory_gb"), nan where absent."""
    try:
        return float(r.env.get(key) or "nan")
    except ValueError:
        return float("nan")


def _diverged(r: RunResult, cfg: dict[str, Any], gpu: bool) -> Finding | None:
    """Changes that commonly make a diverging run learn again, only for techniques it used; the learning rate last."""
    if r.status != "diverged":
        return None
    amp, comp, lr = cfg.get("amp"), cfg.get("compile"), cfg.get("lr")
    remedies: list[tuple[dict[str, Any], str, str, str]] = []  # (change, notebook, what to try, why)
    if amp == "fp16":  # bf16 has fp32's range where it is native
        native_bf16 = r.env.get("device_type") == "cpu" or _env_number(r, "compute_capability") >= BF16_CC
        remedies.append(({"amp": "bf16" if native_bf16 else "off"}, "amp", "bf16 (or fp32) instead of fp16",
                         "fp16's narrow range overflows"))
    if comp not in (None, "off"):
        remedies.append(({"compile": "off"}, "compile", "torch.compile off (or its default mode)",
                         "a compiled kernel may accumulate reductions in low precision"))
        if comp != "default":
            remedies.append(({"compile": "default"}, "compile", "", ""))
    if amp == "bf16":
        remedies.append(({"amp": "off"}, "amp", "fp32 instead of bf16", "bf16 keeps few digits"))
    known = _finite(lr) and lr > 0
    lower = f"a lower learning rate ({lr / 10:g})" if known else "a tenth of your learning rate"
    remedies.append(({"lr": lr / 10} if known else {}, "optimizer",
                     lower + ("" if remedies else ", or gradient clipping (torch.nn.utils.clip_grad_norm_)"),
                     "too large a step overshoots"))
    evidence = [Evidence("status", _diverged_at(r), "loss, grad scale or parameters non-finite")]
    if r.last_finite_loss is not None:
        evidence.append(Evidence("last finite training loss", float(r.last_finite_loss)))
    knobs = {k: cfg[k] for k in ("amp", "compile", "lr") if k in cfg}
    if knobs:
        evidence.append(Evidence(", ".join(knobs), ", ".join(str(v) for v in knobs.values())))
    changes = [c for c, *_ in remedies if c]
    notebooks = tuple(dict.fromkeys(NOTEBOOKS[nb] for c, nb, _, _ in remedies if c)) or (NOTEBOOKS["optimizer"],)
    check = ("watch the changed loop and compare the two with fastlab.compare_loops" if r.extras.get(WATCHED) else
             "verify reruns with the change and checks that its loss stays finite")
    why = f"a run that stopped learning is not fast: {', '.join(w for *_, w in remedies if w)}; {check}"
    return Finding("diverged", "diverged: the loss became non-finite or blew up, so this run's speed is not credited",
                   tuple(evidence), "one change at a time: " + "; ".join(t for *_, t, _ in remedies if t), notebooks,
                   changes[0] if changes else {}, why, tuple(changes[1:]), metric="finite")


def _diverged_at(r: RunResult) -> str:
    at = f" at step {r.diverged_step}" if r.diverged_step is not None else ""
    return f"diverged{at}: {r.error or 'a non-finite loss'}"


def _theil_sen(ys: list[float], xs: list[float] | None = None) -> tuple[float, float]:
    """Robust line through (xs[i], ys[i]) (xs: 0, 1, 2, ... by default): (slope, median distance from it)."""
    stride = max(1, len(ys) // 200)  # at most ~200 points: the pairwise slopes stay cheap on long runs
    pts = list(zip(xs if xs is not None else range(len(ys)), ys))[::stride]
    slope = statistics.median((b[1] - a[1]) / (b[0] - a[0]) for i, a in enumerate(pts) for b in pts[i + 1:])
    intercept = statistics.median(y - slope * x for x, y in pts)
    return slope, statistics.median(abs(y - (intercept + slope * x)) for x, y in pts)


def memory_rise(trace: list[float], steps: list[int] | None = None) -> tuple[float, float, bool]:
    """(rise in MiB from a robust slope, noise in MiB, whether it rose steadily and still rises at the end).
    steps: each sample's step, where memory was not sampled every step."""
    if len(trace) < LEAK_MIN_STEPS:
        return float("nan"), float("nan"), False
    slope, noise = _theil_sen(trace, steps)
    span = (steps[-1] - steps[0]) if steps else len(trace) - 1
    size = len(trace) // LEAK_CHUNKS
    medians = [statistics.median(trace[i * size:(i + 1) * size]) for i in range(LEAK_CHUNKS)]
    steady = all(b - a > LEAK_CHUNK_NOISE * noise and b > a for a, b in zip(medians, medians[1:]))
    tail = len(trace) - size
    tail_slope, _ = _theil_sen(trace[tail:], steps[tail:] if steps else None)
    return slope * span, noise, steady and slope > 0 and tail_slope >= LEAK_TAIL_SHARE * slope


def _memory_leak(r: RunResult, cfg: dict[str, Any], gpu: bool) -> Finding | None:
    if not r.extras.get(WATCHED):
        return None  # fastlab.run's own loop leaks only through log_loss="tensor", named by its own rule
    warm = int(cfg.get("warmup_steps", 0))
    sampled = _watch(r).get("memory_steps")
    if sampled and len(sampled) == len(r.memory_trace_mb):  # sampled on some steps only: keep their step numbers
        pairs = [(s, mb) for s, mb in zip(sampled, r.memory_trace_mb) if s >= warm]
        steps, trace = [s for s, _ in pairs], [mb for _, mb in pairs]
    else:
        steps, trace = None, r.memory_trace_mb[warm:]
    rise, noise, steady = memory_rise(trace, steps)
    span = (steps[-1] - steps[0] + 1) if steps else len(trace)
    floor = LEAK_MIN_MB.get(r.memory_kind, LEAK_MIN_MB_DEFAULT)
    if not (steady and rise >= max(floor, LEAK_NOISE_FACTOR * noise)):
        return None
    kind = r.memory_kind.replace("_", " ") or "memory"
    evidence = (Evidence(f"rise of {kind} over {span} timed steps (robust slope)", rise,
                         f">= {floor:g} MiB and >= {LEAK_NOISE_FACTOR:g}x noise, rising in each of {LEAK_CHUNKS} "
                         f"stretches and in the last at >= {LEAK_TAIL_SHARE:.0%} of the run's slope", "MiB"),
                Evidence("per step", rise / max(1, span - 1), unit="MiB"),
                Evidence("noise (median distance from the trend)", noise, unit="MiB"))
    return Finding("memory_leak", "memory rises with every step: a probable leak", evidence,
                   "keep numbers, not tensors: losses.append(loss.item()) (every few steps: each .item() is a "
                   "host-device sync) or loss.detach(); evaluate under torch.inference_mode()",
                   (NOTEBOOKS["hygiene"],), {},
                   "a tensor still attached to autograd keeps its graph alive (C11: logging `loss` itself); without "
                   "backward() (evaluation without no_grad) that graph holds the forward pass's activations, so each "
                   "kept step adds them until the run runs out of memory")


def _data_bound(r: RunResult, cfg: dict[str, Any], gpu: bool) -> Finding | None:
    if cfg.get("loader") == "device":
        return None  # already device-resident: its "wait" is batch augmentation, no loader knob left to turn
    wait = r.data_wait_fraction()
    if not _finite(wait):
        return None
    util = [u for _, u in r.gpu_util] if gpu and len(r.gpu_util) >= GPU_UTIL_MIN_SAMPLES else []
    low_util = sum(u < GPU_UTIL_LOW_PCT for u in util) / len(util) if util else float("nan")
    evidence = [_share("data wait / step time", wait, ">=", DATA_WAIT_SHARE)]
    if _finite(r.copy_fraction()):  # timed apart, never counted as data wait (it waits for GPU work too)
        evidence.append(Evidence("host-to-device copy / step time (not data wait)", r.copy_fraction(), unit="%"))
    fires = wait >= DATA_WAIT_SHARE
    if _finite(low_util):
        evidence.append(_share(f"share of GPU utilisation samples under {GPU_UTIL_LOW_PCT:.0f}%", low_util, ">=",
                               GPU_UTIL_LOW_SHARE, f" with data wait >= {_pct(DATA_WAIT_SHARE_WITH_UTIL)}"))
        fires = fires or (low_util >= GPU_UTIL_LOW_SHARE and wait >= DATA_WAIT_SHARE_WITH_UTIL)
    if not fires:
        return None
    cpus = _cores(r)
    workers = cfg.get("num_workers", 0)
    more_workers = min(max(2, cpus), LOADER_MAX_WORKERS) if workers == 0 else min(workers * 2, max(cpus, 2))
    pinned = {"pin_memory": True, "non_blocking": True} if gpu else {}
    worker_change = _only_different(cfg, {"num_workers": more_workers, "persistent_workers": True, **pinned})
    device_change = _only_different(cfg, dict(loader="device", num_workers=0, pin_memory=False, non_blocking=False,
                                              persistent_workers=False, prefetch_factor=None))
    confidence = ""
    if r.extras.get(WATCHED):  # the reader's own loop: the remedy is said in terms of their loader
        changes, alternatives, technique, confidence, weighed = _watched_data_remedy(r, cfg, gpu)
        evidence += weighed
    elif r.dataset.get("source") == CUSTOM_DATASETS:
        # torch Datasets cannot go device-resident (that needs uint8 arrays): more workers is what is left, and
        # where the cores give no more, the Dataset's own work (a change outside the knobs)
        changes, alternatives = (worker_change if more_workers > workers else {}), ()
        technique = (f"more DataLoader workers ({more_workers})" + (" with pin_memory" if gpu else "")
                     if changes else f"a cheaper Dataset __getitem__ (its decoding and augmentation): {workers} "
                     f"workers already use the {cpus} cores")
    else:
        changes, alternatives = device_change, ((worker_change,) if more_workers > workers else ())
        technique = "the device-resident loader (whole set on the device, augmented per batch as tensor ops)"
    evidence.append(Evidence("loader, num_workers", f"{cfg.get('loader')}, {workers}"))
    return Finding("data_bound", "data-bound: the model waits for its batches", tuple(evidence), technique,
                   (NOTEBOOKS["data"],), changes,
                   f"removing the wait could make steps up to {_amdahl(wait)} faster "
                   "(Amdahl: 1 / (1 - wait share))", alternatives, confidence=confidence)


Remedy = tuple[dict[str, Any], str, str]  # (DataLoader change, what to do in words, how sure and why)


def _watched_data_remedy(r: RunResult, cfg: dict[str, Any], gpu: bool
                         ) -> tuple[dict[str, Any], tuple[dict[str, Any], ...], str, str, list[Evidence]]:
    """(changes, alternatives, technique, confidence, evidence) for the reader's own loader, weighing what workers
    cost here; never a setting the loop has, nor one an earlier watched run found no faster."""
    cores = _cores(r)
    batch = int(r.images_per_step or cfg.get("batch_size") or 1)
    watch = _watch(r)
    nbytes = int(watch.get("batch_bytes") or 0)
    small = batch <= LOADER_SMALL_BATCH or 0 < nbytes < LOADER_SMALL_BATCH_BYTES
    # CPU time over the wait tells a sleeping loader from a computing one only without workers
    share = watch.get("data_cpu_share")
    share = share if _finite(share) and not cfg.get("num_workers") else None
    weighed = [Evidence("usable CPU cores", cores, f"workers need >= {LOADER_MIN_CORES} to leave training a core"
                        + ("" if share is None else ", unless the wait is off the CPU")),
               Evidence("images per batch", batch, f"<= {LOADER_SMALL_BATCH} (or < 1 MiB a batch) is small")]
    if share is not None:
        weighed.append(_share("CPU time / wall time of the data wait", share, "<", LOADER_OFF_CPU_SHARE,
                              ": a wait off the CPU"))
    if nbytes:
        weighed.append(Evidence("bytes per batch", f"{nbytes / 2**10:,.0f} KiB"))
    off_cpu = share is not None and share < LOADER_OFF_CPU_SHARE
    candidates = []
    for proposed, words, sure in _loader_candidates(cfg, cores, batch, small, gpu, off_cpu):
        change = _only_different({**cfg, "batch_size": batch}, proposed)
        earlier = _tried_earlier(r, change, batch) if change else ""
        if earlier:
            weighed.append(Evidence("left out", f"{describe_changes(change)} was watched earlier in this session "
                                                f"({earlier}): not proposed again"))
        elif change or not proposed:  # never what the loop already has
            candidates.append((change, words, sure))
    lighter = ("move per-image work out of the loader: decode once and keep the images in memory, augment whole "
               "batches on the device (notebook 01's device-resident loader)")
    if not candidates:
        return {}, (), lighter, "low: no loader setting is left that is likely to help here", weighed
    (change, words, sure), rest = candidates[0], candidates[1:]
    return change, tuple(c for c, _, _ in rest), f"{words} in your loop; or {lighter}", sure, weighed


def _loader_candidates(cfg: dict[str, Any], cores: int, batch: int, small: bool, gpu: bool,
                       off_cpu: bool) -> list[Remedy]:
    """The loader changes worth trying, most likely first, each with how sure it is. off_cpu: the wait sleeps."""
    workers = int(cfg.get("num_workers") or 0)
    costs = "collate, the trip between processes, per-op overhead" if workers else "collate, per-op overhead"
    bigger: Remedy = ({"batch_size": batch * BATCH_GROWTH}, f"a larger batch ({batch * BATCH_GROWTH})",
                      f"medium: a batch of {batch} pays the per-batch costs ({costs}) for few images; a larger "
                      "batch may need a retuned learning rate")
    pin = {"pin_memory": True} if gpu else {}
    # workers for a loader that has none: a core left to training, or, for a wait that sleeps, two at least
    new_workers = min(max(2, cores) if off_cpu else cores - 1, LOADER_MAX_WORKERS)
    sleeps = (f"medium: the wait is mostly off the CPU (sleeping on a disk, the network or a lock): {new_workers} "
              "workers can wait side by side without a core each")
    spare = f"medium: {cores} cores leave {cores - 1} for workers"
    out: list[Remedy] = []
    if cfg.get("loader") != "dataloader":
        if cores >= LOADER_MIN_CORES or off_cpu:
            out.append(({}, f"a torch DataLoader with worker processes (num_workers={new_workers}) around your data",
                        sleeps if off_cpu else spare))
    elif workers > 0:
        crowded = workers + 1 > cores
        if crowded or small:
            why = ([f"{workers} workers and the training process share {cores} cores"] if crowded else []) + (
                [f"each batch of {batch} images is pickled between processes, a fixed cost per batch"] if small
                else [])
            out.append(({"num_workers": 0}, "DataLoader(num_workers=0) (batches made in the training process)",
                        f"{'high' if crowded and small else 'medium'}: " + "; ".join(why)))
        elif workers < cores - 1:
            change = {"num_workers": min(workers * 2, cores - 1, LOADER_MAX_WORKERS), "persistent_workers": True, **pin}
            out.append((change, f"DataLoader({describe_changes(change)})",
                        f"medium: {cores} cores leave room for more than {workers} workers"))
    elif cores >= LOADER_MIN_CORES or off_cpu:
        change = {"num_workers": new_workers, "persistent_workers": True, **pin}
        out.append((change, f"DataLoader({describe_changes(change)})", sleeps if off_cpu else
                    (f"low: {cores} cores leave {cores - 1} for workers, but each batch of {batch} images is pickled "
                     "between processes, which can cost more than it saves" if small else spare)))
    return out + ([bigger] if small else [])


def _tried_earlier(r: RunResult, change: dict[str, Any], batch: int) -> str:
    """Words for an earlier watched run (same data, this session) that ran with `change` and was no faster."""
    want = {"batch_size": batch, "num_workers": r.config.get("num_workers"), **change}
    for e in reversed(_watch(r).get("earlier", [])):
        if any(e.get(k) != v for k, v in want.items() if k in ("batch_size", "num_workers")):
            continue
        if e.get("status") not in CREDITED or not e.get("window_throughput"):
            return f"{e['label']}: {e.get('status')}, not credited"
        c = verdict(r.throughput, Spread.of(e["window_throughput"]))
        if c.direction in ("noise", "worse"):
            return f"{e['label']}: {c}"
    return ""


def _overhead_bound(r: RunResult, cfg: dict[str, Any], gpu: bool) -> Finding | None:
    wait = r.data_wait_fraction()
    step = _step_seconds(r)
    if not (_finite(wait) and _finite(step)) or wait >= DATA_WAIT_SHARE:
        return None
    batch = int(cfg.get("batch_size", 1))
    accum = int(cfg.get("grad_accum_steps", 1))
    compute = step * (1 - wait) / accum  # per micro-batch: launch costs are paid per forward/backward
    if (compute >= SHORT_STEP_S) if gpu else (batch > CPU_SMALL_BATCH):
        return None
    evidence = (_share("data wait / step time", wait, "<", DATA_WAIT_SHARE),
                Evidence("compute time per micro-batch", compute * 1000, f"< {SHORT_STEP_S * 1000:g} ms" if gpu else "",
                         "ms"),
                Evidence("batch_size", batch, "" if gpu else f"<= {CPU_SMALL_BATCH}"))
    growth = BATCH_GROWTH
    peak, total = r.peak_memory_mb, _env_number(r, "gpu_memory_gb") * 1024
    if gpu and _finite(total):  # keep the estimated peak (activations ~ batch) under the near-limit line
        while growth > 1 and peak * growth >= MEMORY_LIMIT_SHARE * total:
            growth //= 2
    train_images = int(r.dataset.get("train_images") or cfg.get("train_images") or batch * growth)
    new_batch = min(batch * growth, max(batch, train_images // 2))  # at least two batches per epoch
    compile_change = _only_different(cfg, {"compile": "reduce-overhead" if gpu else "default"})
    options = ([{"batch_size": new_batch}] if new_batch > batch else []) + ([compile_change] if compile_change else [])
    if not options:
        return None
    compiled = "CUDA graphs: torch.compile(mode='reduce-overhead')" if gpu else "torch.compile (fewer, fused ops)"
    technique = " or ".join(([f"a larger batch ({new_batch})"] if new_batch > batch else [])
                            + ([compiled] if compile_change else []))
    return Finding("overhead_bound", "launch/overhead-bound: small steps, each paying fixed per-op costs",
                   evidence, technique, (NOTEBOOKS["batch"], NOTEBOOKS["compile"]), options[0],
                   "per-op costs (Python, dispatch, kernel launch) are paid per micro-batch, so more images per op "
                   "or fewer, fused ops spread them thinner; a larger batch may need a retuned learning rate",
                   tuple(options[1:]))


def _optimizer_bound(r: RunResult, cfg: dict[str, Any], gpu: bool) -> Finding | None:
    share = r.optimizer_share()
    impl = cfg.get("opt_impl", "default")
    if not _finite(share) or share < OPTIMIZER_SHARE or impl == "fused":
        return None
    evidence = (_share("optimizer.step() / step time (sampled in warm-up)", share, ">=", OPTIMIZER_SHARE),
                Evidence("optimizer, opt_impl", f"{cfg.get('optimizer')}, {impl}"))
    alternatives = ({"opt_impl": "foreach"},) if impl in ("default", "for-loop") else ()
    return Finding("optimizer_bound", "optimiser-bound: the parameter update is a large share of each step",
                   evidence, "the fused optimiser (the whole update in a few kernels; foreach: one per op over all "
                   "tensors)", (NOTEBOOKS["optimizer"],), {"opt_impl": "fused"},
                   f"a for-loop update runs a dozen small ops per parameter tensor; at most "
                   f"{_amdahl(share)} if the update cost nothing", alternatives)


def _precision(r: RunResult, cfg: dict[str, Any], gpu: bool) -> Finding | None:
    cc = _env_number(r, "compute_capability")
    if not gpu or not cc >= TENSOR_CORE_CC or cfg.get("amp") != "off":  # nan: unknown
        return None
    amp = "bf16" if cc >= BF16_CC else "fp16"
    changes = _only_different(cfg, {"amp": amp, "channels_last": True})
    evidence = (Evidence("amp", "off (fp32)", "off on a GPU with tensor cores"),
                Evidence(f"compute capability of {r.env.get('device_name', '?')}", f"{cc:.1f}",
                         f">= {TENSOR_CORE_CC:.1f}"))
    return Finding("fp32_on_tensor_cores", "fp32 on a GPU with tensor cores", evidence,
                   f"{amp} autocast" + (" (with GradScaler)" if amp == "fp16" else "")
                   + (" and channels_last" if "channels_last" in changes else ""),
                   (NOTEBOOKS["amp"], NOTEBOOKS["kernels"]), changes,
                   "tensor cores run 16-bit matrix maths at several times the fp32 rate and halve memory traffic; "
                   "they want NHWC (channels_last) layouts. Launch-bound steps see little of it.",
                   ({"tf32": True},) if cc >= BF16_CC and not cfg.get("tf32") else ())


def _layout_and_kernels(r: RunResult, cfg: dict[str, Any], gpu: bool) -> Finding | None:
    cc = _env_number(r, "compute_capability")
    if not gpu or cfg.get("amp") not in ("fp16", "bf16"):
        return None  # in fp32 the precision finding already brings channels_last; unknown (a watched loop): silent
    tensor_cores = {"channels_last": True} if cc >= TENSOR_CORE_CC else {}
    changes = _only_different(cfg, {"cudnn_benchmark": True, **tensor_cores})
    if not changes:
        return None
    evidence = tuple(Evidence(k, str(cfg.get(k)), "False on CUDA") for k in changes)
    return Finding("layout_and_kernels", "16-bit maths without the layout/algorithm settings that feed it",
                   evidence, "channels_last and cudnn.benchmark", (NOTEBOOKS["kernels"],), changes,
                   "channels_last avoids layout transposes around tensor-core convolutions; cudnn.benchmark times "
                   "the algorithms once per input shape (fixed shapes only; it costs warm-up time and memory)")


def _host_sync(r: RunResult, cfg: dict[str, Any], gpu: bool) -> Finding | None:
    """loss.item() every step on CUDA; in a watched loop run with sync_debug=True, the syncs torch itself caught."""
    caught = _watch(r).get("syncs") or {}
    if not gpu:
        return None
    if r.extras.get(WATCHED):
        if caught.get("per_step", 0) < 1:
            return None
        evidence = (Evidence("host-device syncs per timed step (torch.cuda.set_sync_debug_mode)", caught["per_step"],
                             ">= 1"),
                    *(Evidence("synced at", f"{where} ({n}x)") for where, n in caught.get("where", [])[:3]))
        title, changes = "a host-device sync every step", {}
        technique = (f"read values on the host (loss.item(), .cpu(), a tensor in an `if`) every {LOG_EVERY} steps, "
                     "or keep them on the device")
    elif cfg.get("log_loss") != "item" or int(cfg.get("log_every", 1)) != 1:
        return None
    else:
        step = _step_seconds(r)
        evidence = (Evidence("log_loss, log_every", f"item, {cfg.get('log_every')}", "loss.item() every step on CUDA"),
                    *([Evidence("step time", step * 1000, unit="ms")] if _finite(step) else []))
        title, changes = "a host-device sync every step (loss.item())", {"log_every": LOG_EVERY}
        technique = f"read the loss every {LOG_EVERY} steps"
    return Finding("host_sync_every_step", title, evidence, technique, (NOTEBOOKS["hygiene"],), changes,
                   ".item() and friends wait for the GPU to finish, so the host cannot queue the next step ahead; "
                   "it matters most when steps are short")


def _memory(r: RunResult, cfg: dict[str, Any], gpu: bool) -> Finding | None:
    oom = r.status == "failed" and "out of memory" in (r.error or "")
    total = _env_number(r, "gpu_memory_gb") * 1024
    if not gpu or (not oom and (not _finite(total) or r.peak_memory_mb <= 0)):
        return None
    batch, accum = int(cfg.get("batch_size", 1)), int(cfg.get("grad_accum_steps", 1))
    share = r.peak_memory_mb / total if _finite(total) else float("nan")
    if oom or share >= MEMORY_LIMIT_SHARE:
        # 16-bit first; else the same images per optimiser step in smaller micro-batches
        changes = ({"amp": "bf16" if _env_number(r, "compute_capability") >= BF16_CC else "fp16"}
                   if cfg.get("amp") == "off" else
                   {"batch_size": batch // 2, "grad_accum_steps": accum * 2} if batch >= 2 else {})
        evidence = ((Evidence("status", f"failed: {r.error}"),) if oom else
                    (_share("peak memory / GPU memory", share, ">=", MEMORY_LIMIT_SHARE),
                     Evidence("peak memory", r.peak_memory_mb, unit="MiB")))
        key = "out_of_memory" if oom else "memory_near_limit"
        title = "out of GPU memory" if oom else "close to the GPU's memory limit"
        return Finding(key, title, evidence,
                       "mixed precision, gradient accumulation (same images per step, smaller micro-batches), "
                       "activation checkpointing", (NOTEBOOKS["amp"], NOTEBOOKS["batch"]), changes,
                       "16-bit activations take half the memory; accumulation trades micro-batch size for steps; "
                       "checkpointing recomputes activations instead of keeping them (a model change, not a knob)")
    if share < MEMORY_HEADROOM_SHARE and r.ok:
        return Finding("memory_headroom", "memory headroom left on the GPU",
                       (_share("peak memory / GPU memory", share, "<", MEMORY_HEADROOM_SHARE),
                        Evidence("peak memory", r.peak_memory_mb, unit="MiB"),
                        Evidence("GPU memory", total / 1024, unit="GiB")),
                       f"a larger batch ({batch * 2})", (NOTEBOOKS["batch"],), {"batch_size": batch * 2},
                       "more images per step amortise per-step costs while memory allows; "
                       "it may need a retuned learning rate")
    return None


def _loss_tensor_kept(r: RunResult, cfg: dict[str, Any], gpu: bool) -> Finding | None:
    if cfg.get("log_loss") != "tensor":
        return None
    evidence = [Evidence("log_loss", "tensor", "'tensor': total_loss += loss keeps each step's graph")]
    if r.kept_loss_tensors is not None:
        evidence.append(Evidence("loss tensors kept alive", r.kept_loss_tensors))
    if len(r.memory_trace_mb) >= 2:
        evidence.append(Evidence("memory growth over the run", r.memory_trace_mb[-1] - r.memory_trace_mb[0],
                                 unit="MiB"))
    return Finding("loss_tensor_kept", "the logged loss keeps every step's graph alive", tuple(evidence),
                   f"log loss.item() (every {LOG_EVERY} steps) or loss.detach()", (NOTEBOOKS["hygiene"],),
                   _only_different(cfg, {"log_loss": "item", "log_every": LOG_EVERY}),
                   "a loss tensor still attached to autograd holds its activations: memory grows with every step")


def _eval_autograd(r: RunResult, cfg: dict[str, Any], gpu: bool) -> Finding | None:
    if cfg.get("eval_mode") != "autograd":
        return None
    evidence = [Evidence("eval_mode", "autograd", "evaluation without no_grad / inference_mode")]
    if r.eval_peak_memory_mb is not None:
        evidence.append(Evidence("evaluation peak memory", r.eval_peak_memory_mb, unit="MiB"))
    return Finding("eval_with_autograd", "validation records a graph it never uses", tuple(evidence),
                   "torch.inference_mode() (or torch.no_grad()) around evaluation", (NOTEBOOKS["hygiene"],),
                   {"eval_mode": "inference_mode"}, "without it every activation of the forward pass is kept "
                   "for a backward pass that never comes: slower and larger evaluation", ({"eval_mode": "no_grad"},),
                   metric="eval")


RULES: tuple[Callable[[RunResult, dict[str, Any], bool], Finding | None], ...] = (
    _diverged, _memory_leak, _data_bound, _overhead_bound, _optimizer_bound, _precision, _layout_and_kernels,
    _host_sync, _memory, _loss_tensor_kept, _eval_autograd)


def findings_for(result: RunResult) -> list[Finding]:
    """Every rule that fires on `result`, ranked by PRIORITY."""
    if not isinstance(result, RunResult):
        raise TypeError(f"advise(result=...) takes a fastlab RunResult, got {type(result).__name__}")
    gpu = result.env.get("device_type") == "cuda"
    found = [f for rule in RULES if (f := rule(result, result.config, gpu)) is not None]
    if any(f.key == "overhead_bound" and "batch_size" in f.changes for f in found):
        # the overhead remedy already grows the batch (within the memory the run left): one batch advice, not two
        found = [f for f in found if f.key != "memory_headroom"]
    return sorted(found, key=lambda f: PRIORITY.index(f.key))


@dataclass
class Verification:
    """The top (or chosen) finding tried: fresh baseline runs and changed runs, measured in this session, and the
    Comparison that judged them: its direction (better, worse, noise, not_comparable) and words are the verdict."""

    finding: Finding
    baseline: list[RunResult]
    changed: list[RunResult]
    metric: str  # "training images/s", "held-out images/s" or "training loss" (a divergence fix)
    comparison: Comparison  # changed against baseline; not_comparable where a side has no credited speed
    notes: list[str] = field(default_factory=list)
    # A divergence fix is judged on whether the reruns learn, not on speed: fixed is True when every rerun kept
    # finite losses, False when one still diverged, None otherwise; learning says what their losses did.
    fixed: bool | None = None
    learning: str = ""

    @property
    def sentence(self) -> str:
        """The verdict in words: the divergence check's for a divergence fix, else the comparison's."""
        return self.learning or self.comparison.words

    def text(self) -> str:
        speed = [f"  training images/s: {self.comparison.words}"] if self.learning else []
        return "\n".join([f"Tried {describe_changes(self.finding.changes)} (for: {self.finding.bottleneck}):",
                          f"  {self.metric}: {self.sentence}", *speed, *(f"  {n}" for n in self.notes)])


def _pick(findings: list[Finding], finding: int | str | Finding | None) -> Finding | None:
    if finding is None or isinstance(finding, Finding):
        return finding or next((f for f in findings if f.changes), None)
    keys = [f.key for f in findings]
    if isinstance(finding, str) and finding in keys:
        return findings[keys.index(finding)]
    if type(finding) is int and 0 <= finding < len(findings):
        return findings[finding]
    raise ValueError(f"verify(finding={finding!r}) is not allowed: this result's findings are {keys or 'none'} "
                     f"(a key, or an index 0..{len(findings) - 1})")


def _judge(finding: Finding, base_runs: list[RunResult], new_runs: list[RunResult]) -> Verification:
    """The changed runs against the fresh baseline, in training (or, for an eval finding, held-out) images/s; a
    time-limited run keeps its finished windows, with a note."""
    if finding.metric == "finite":
        return _judge_divergence(finding, new_runs)
    notes = [f"{r.label}: {r.error}" for r in base_runs + new_runs if r.status == "time_limited"]
    c = runs_verdict(base_runs, new_runs, interleaved=True)
    if finding.metric != "eval":
        return Verification(finding, base_runs, new_runs, "training images/s", c, notes)
    if c.comparable:  # one evaluation pass a run, each run its own repeat: one pass a side cannot tell
        rates = [[r.dataset["eval_images"] / r.eval_seconds for r in runs
                  if r.dataset.get("eval_images") and r.eval_seconds] for runs in (base_runs, new_runs)]
        c = verdict(*(Spread.of(xs, [[x] for x in xs]) for xs in rates), unit="held-out images/s")
        notes += [f"{r.label}: evaluation peak {r.eval_peak_memory_mb:,.0f} MiB" for r in base_runs[:1] + new_runs[:1]
                  if r.eval_peak_memory_mb is not None]
        if c.single_pair:
            notes.append("one evaluation pass a side: verify(..., repeats=3) runs enough to tell a gain from noise")
    return Verification(finding, base_runs, new_runs, "held-out images/s", c, notes)


def _judge_divergence(finding: Finding, new_runs: list[RunResult]) -> Verification:
    """A fix for divergence works when every rerun ends not diverged, with finite logged losses. The diverged
    run's own speed is not credited: its comparison is not_comparable, and no speed-up over it is claimed."""
    after = Spread.of([w for r in new_runs for w in r.window_throughput])
    c = Comparison("not_comparable", math.nan, Spread.of([]), after, side="base", status="diverged",
                   reason="the diverged run's own speed is not credited, so no speed-up over it is claimed")

    def judged(fixed: bool | None, learning: str) -> Verification:
        return Verification(finding, [], new_runs, "training loss", c, [], fixed, learning)

    if (d := next((r for r in new_runs if r.status == "diverged"), None)) is not None:
        return judged(False, f"still diverges: {d.label}: {_diverged_at(d)}")
    if (b := next((r for r in new_runs if r.status in ("failed", "interrupted")), None)) is not None:
        return judged(None, f"{b.label}: {b.status} ({b.error or 'stopped'}); no verdict")
    losses = [float(v) for r in new_runs for _, v in r.losses]
    if not losses or not all(math.isfinite(x) for x in losses):
        return judged(False, "still diverges: the rerun logged no finite loss")
    last = new_runs[-1].losses[-1]
    acc = [r.eval_accuracy for r in new_runs if r.eval_accuracy is not None]
    return judged(True, f"no longer diverges: every logged loss finite over {sum(r.steps_done for r in new_runs)} "
                        f"steps (last {last[1]:.3g} at step {last[0]})"
                  + (f", held-out accuracy {min(acc):.1%}-{max(acc):.1%} over {len(acc)} run(s)" if acc else "")
                  + (f"; it trained at {after.median:,.0f} images/s" if after.n else ""))


def verify(result: RunResult, finding: int | str | Finding | None = None, *, repeats: int = 1, dataset: Any = None,
           model: Any = None, progress: bool = False, runner: Callable[..., RunResult] = run) -> Verification | None:
    """Apply a finding's changes (default: the top finding that has any) and measure them against a fresh baseline,
    in turns so both see the same machine load; None when no finding has a change to try."""
    if result.extras.get(WATCHED):
        raise ValueError("this result is a run of your own loop (fastlab.watch): fastlab cannot re-run it. Make the "
                         "change in your loop and measure both versions in turns with "
                         "fastlab.compare_loops(before_fn, after_fn, repeats=3)")
    chosen = _pick(findings_for(result), finding)
    positive_int("verify: repeats", repeats)
    if chosen is None:
        return None
    if not chosen.changes:
        raise ValueError(f"finding {chosen.key!r} has no config change to try (its remedy is outside the knobs)")
    if result.dataset.get("source") == CUSTOM_DATASETS and dataset is None:
        raise ValueError("this result trained on torch Datasets passed to fastlab.run: pass the same pair as "
                         "verify(dataset=(train, held_out)) so the re-runs train on them too")
    base_cfg = TrainConfig.from_dict(result.config)
    new_cfg = base_cfg.replace(**chosen.changes)
    here = resolve_device(base_cfg.device).type
    measured_on = result.env.get("device_type", here)
    if here != measured_on:
        raise ValueError(f"this result was measured on {measured_on} but would re-run here on {here}: verify on a "
                         f"machine with {measured_on}, where the advice applies")
    base_runs: list[RunResult] = []
    new_runs: list[RunResult] = []
    sides = [(base_runs, base_cfg, "baseline (fresh)"), (new_runs, new_cfg, describe_changes(chosen.changes))]
    if chosen.metric == "finite":  # a diverged run's speed is never compared: no baseline, only whether it learns
        sides = sides[1:]
    for i, side in turns(len(sides), repeats):  # in turns: A B, then B A
        runs, cfg, label = sides[side]
        runs.append(runner(cfg, label=f"{label} #{i + 1}" if repeats > 1 else label, dataset=dataset, model=model,
                           progress=progress))
    judged = _judge(chosen, base_runs, new_runs)
    for r in new_runs[:1]:
        judged.notes += [f"no-op here: {k}: {v}" for k, v in r.no_ops.items()]
    if any(r.synthetic for r in base_runs + new_runs):
        judged.notes.append("measured on SYNTHETIC data")
    return judged


def advise(result: RunResult, verify: bool = False, **verify_args: Any) -> Advice:
    """The ranked findings of `result`; with verify=True the top one is also tried (advice.verification).
    verify_args go to fastlab.verify (finding, repeats, dataset, model, progress)."""
    advice = Advice(result, findings_for(result))
    if verify:
        advice.verification = _verify(result, **verify_args)
    elif verify_args:
        raise ValueError(f"advise() got {sorted(verify_args)}, which only apply with verify=True")
    return advice


_verify = verify


def results_advice_text(results: list[RunResult]) -> str:
    """The advice for every run of a results file (`python -m fastlab advise`): diverged runs named first."""
    diverged = [r for r in results if r.status == "diverged"]
    head = ([f"DIVERGED (speed not credited): {', '.join(r.label for r in diverged)}; advice for "
             f"{'it' if len(diverged) == 1 else 'them'} first.", ""] if diverged else [])
    ordered = diverged + [r for r in results if r.status != "diverged"]
    return "\n".join(head + [advise(r).text() + "\n" for r in ordered]).rstrip("\n")


def advice_html(result: RunResult) -> str:
    """The advice on one result (Advice.text) as HTML, for a Panel's advice area: Panel(..., describe=advice_html)."""
    return (f"<b>Advice for {html.escape(result.label)}:</b>"
            f"<pre style='white-space: pre-wrap'>{html.escape(advise(result).text())}</pre>")
