"""Notebook 04: throughput against batch size (C7), the largest batch that fits (an out-of-memory-safe search by
short probes), the learning rate at a larger batch, and time to accuracy at the largest batch (C8)."""

from __future__ import annotations

import ctypes
import gc
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from .. import claims, outcomes
from ..claims import Judgement
from ..comparisons import comparison
from ..config import TrainConfig, positive_int
from ..measure import Spread, resolve_device
from ..outcomes import time_to_accuracy, tta_groups
from ..profiles import profile_of
from ..results import RunResult
from ..train import run, sweep
from ..verdicts import verdict

LR_DEMO_FACTOR = 4  # the learning-rate demo's larger batch, in profile batches
# lr for a batch k times larger: x k for SGD (Goyal et al. 2017); x sqrt(k) for Adam-family optimisers, whose update
# size does not grow with the gradient's scale.
LR_RULES = ("linear", "sqrt", "none")
DEFAULT_RULE = {"sgd": "linear", "adam": "sqrt", "adamw": "sqrt"}
SEARCH_CEILING = 65_536  # without max_batch: a tiny model on a roomy GPU would probe ever larger batches

Runner = Callable[..., RunResult]


def sizes_for(base: TrainConfig) -> list[int]:
    """The batch sizes the sizes comparison sweeps for base's profile (Profile.batch_grid: powers of two beside
    neighbours, as C7 judges each power of two with a neighbour on each side), else its batch and neighbours."""
    grid = profile_of(base).batch_grid
    if grid is not None:
        return list(grid)
    b = base.batch_size
    return sorted({max(1, b * 3 // 4), b, b * 5 // 4})


@comparison("04_batch_size:sizes", arms=lambda base: len(sizes_for(base)))
def sizes(base: TrainConfig, progress: bool = True) -> list[RunResult]:
    """One run per batch size of sizes_for(base): throughput and peak memory."""
    return sweep("batch_size", sizes_for(base), base, progress=progress)


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


# ------------------------------------------------------------------ the largest batch that fits


@dataclass
class Probe:
    """One short run of the search."""

    batch_size: int
    fits: bool
    status: str
    peak_memory_mb: float
    reason: str  # why it did or did not fit


@dataclass
class BatchSearch:
    """What find_max_batch found: the largest batch that fit, the smallest that did not, and the limit used."""

    largest: int | None  # None when even the smallest probe did not fit
    smallest_failing: int | None  # None when nothing failed (the search stopped at max_batch)
    limit: str  # the limit the search used, in words
    memory_kind: str = ""
    probes: list[Probe] = field(default_factory=list)

    def summary(self) -> str:
        tried = ", ".join(f"{p.batch_size}{'' if p.fits else ' (too big)'}" for p in self.probes)
        head = "no batch size fits" if self.largest is None else f"largest batch that fits: {self.largest} " + (
            "(nothing tried failed: the search stopped at its max_batch)" if self.smallest_failing is None
            else f"(batch {self.smallest_failing} did not)")
        return f"{head}; limit: {self.limit}; probes in order: {tried}"


def _return_freed_host_memory() -> None:
    """Hand freed heap back to the OS (glibc only), so a probe's RSS peak is not an earlier, bigger probe's."""
    gc.collect()
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):  # not glibc (musl): nothing to trim with
            pass


def probe_config(base: TrainConfig, batch_size: int, steps: int) -> TrainConfig:
    """A short run at one batch size: one warm-up step, `steps` timed steps, a training set of one batch."""
    return base.replace(batch_size=batch_size, steps=steps, warmup_steps=1, windows=1, train_images=batch_size,
                        eval_images=1)


def find_max_batch(base: TrainConfig, *, memory_budget_mb: float | None = None, max_batch: int | None = None,
                   start: int | None = None, resolution: int = 8, probe_steps: int = 2, runner: Runner = run,
                   progress: bool = False) -> BatchSearch:
    """The largest batch_size whose short run fits, by doubling from `start`, then bisecting to `resolution`. A probe
    fits when its run does not fail (CUDA out of memory) and its peak memory is within memory_budget_mb (on a CPU,
    process RSS: approximate). On a CPU, where nothing runs out of memory, a budget or max_batch is needed."""
    for name, value in (("max_batch", max_batch), ("start", start), ("resolution", resolution),
                        ("probe_steps", probe_steps)):
        if value is not None or name in ("resolution", "probe_steps"):
            positive_int(f"find_max_batch: {name}", value)
    if memory_budget_mb is not None and (isinstance(memory_budget_mb, bool) or
                                         not isinstance(memory_budget_mb, (int, float)) or memory_budget_mb <= 0):
        raise ValueError(f"find_max_batch: memory_budget_mb={memory_budget_mb!r} is not allowed: a number > 0 (MiB)")
    device = resolve_device(base.device)
    if device.type != "cuda" and memory_budget_mb is None and max_batch is None:
        raise ValueError(f"find_max_batch: on {device.type} nothing runs out of memory, so give memory_budget_mb "
                         f"(MiB of peak process memory) or max_batch (the largest batch to try)")
    limits = []
    if device.type == "cuda":
        limits.append("CUDA out of memory")
    if memory_budget_mb is not None:
        limits.append(f"a budget of {memory_budget_mb:,.0f} MiB on the run's peak memory")
    ceiling = max_batch if max_batch is not None else SEARCH_CEILING
    limits.append(f"max_batch={ceiling}" if max_batch is not None else f"a ceiling of {ceiling} (no max_batch given)")
    search = BatchSearch(largest=None, smallest_failing=None, limit=" / ".join(limits))

    def probe(batch: int) -> bool:
        if device.type == "cpu":
            _return_freed_host_memory()
        result = runner(probe_config(base, batch, probe_steps), label=f"probe batch {batch}", progress=progress)
        search.memory_kind = search.memory_kind or result.memory_kind
        if result.status == "failed":
            fits, reason = False, result.error or "failed"
        elif result.status == "interrupted":
            raise KeyboardInterrupt(f"find_max_batch: the probe at batch {batch} was interrupted")
        elif memory_budget_mb is not None and result.peak_memory_mb > memory_budget_mb:
            fits, reason = False, f"peak {result.peak_memory_mb:,.0f} MiB > budget {memory_budget_mb:,.0f} MiB"
        else:
            fits, reason = True, f"peak {result.peak_memory_mb:,.0f} MiB"
        search.probes.append(Probe(batch, fits, result.status, result.peak_memory_mb, reason))
        if fits:
            search.largest = max(search.largest or batch, batch)
        else:
            search.smallest_failing = min(search.smallest_failing or batch, batch)
        return fits

    batch = min(start or base.batch_size, ceiling)
    # Doubling: up until a probe does not fit or the ceiling is reached.
    while probe(batch) and batch < ceiling:
        batch = min(batch * 2, ceiling)
    # The first probe did not fit: halve until one does (or batch 1 does not).
    while search.largest is None and batch > 1:
        batch //= 2
        probe(batch)
    # Bisection between the largest that fit and the smallest that did not, on multiples of the resolution.
    while search.largest is not None and search.smallest_failing is not None:
        lo, hi = search.largest, search.smallest_failing
        if hi - lo <= resolution:
            break
        mid = (lo + hi) // 2 // resolution * resolution
        probe(mid if mid > lo else lo + resolution)  # below hi, as hi - lo > resolution
    return search


def notebook_search(base: TrainConfig, progress: bool = False) -> BatchSearch:
    """find_max_batch with the profile's search limits (Profile.search_max_batch, search_headroom_mb): on a CPU a
    budget of the process's memory now + the headroom."""
    preset = profile_of(base)
    budget = None
    if resolve_device(base.device).type != "cuda":
        import psutil

        _return_freed_host_memory()
        budget = psutil.Process().memory_info().rss / 2**20 + preset.search_headroom_mb
    return find_max_batch(base, memory_budget_mb=budget, max_batch=preset.search_max_batch, start=base.batch_size,
                          progress=progress)


# ------------------------------------------------------------------ the learning rate at a larger batch


def scaled_lr(lr: float, from_batch: int, to_batch: int, rule: str = "linear") -> float:
    """The learning rate for to_batch when `lr` suited from_batch: x k ("linear"), x sqrt(k) ("sqrt") or kept."""
    if rule not in LR_RULES:
        raise ValueError(f"scaled_lr: rule={rule!r} is not allowed: choose one of {', '.join(map(repr, LR_RULES))}")
    for name, value in (("from_batch", from_batch), ("to_batch", to_batch)):
        positive_int(f"scaled_lr: {name}", value)
    k = to_batch / from_batch
    return lr * {"linear": k, "sqrt": math.sqrt(k), "none": 1.0}[rule]


def same_images(base: TrainConfig, batch_size: int) -> TrainConfig:
    """base at another batch size, one warm-up step, and as many training images: (1 + steps) x batch_size."""
    steps = max(2, (base.warmup_steps + base.steps) * base.batch_size // batch_size) - 1
    return base.replace(batch_size=batch_size, warmup_steps=1, steps=steps, windows=min(base.windows, steps),
                        train_images=max(base.train_images, batch_size))


def lr_demo_configs(base: TrainConfig, factor: int = LR_DEMO_FACTOR, rule: str | None = None) -> list[tuple[str, TrainConfig]]:
    """(label, config) for: the base batch; factor x the batch at the same lr; at the lr scaled by `rule`."""
    positive_int("lr_demo_configs: factor", factor, 2)
    rule = rule or DEFAULT_RULE[base.optimizer]
    small = base.batch_size
    big = small * factor
    new_lr = scaled_lr(base.lr, small, big, rule)
    return [
        (f"batch {small}, lr {base.lr:g}", same_images(base, small)),
        (f"batch {big}, same lr {base.lr:g}", same_images(base, big)),
        (f"batch {big}, lr {new_lr:g} ({rule} rule)", same_images(base, big).replace(lr=new_lr)),
    ]


@comparison("04_batch_size:lr_scaling")
def lr_scaling(base: TrainConfig, progress: bool = True) -> list[RunResult]:
    """The same number of training images at the base batch, at a larger batch with the same lr, and scaled."""
    return [run(cfg, label=label, progress=progress) for label, cfg in lr_demo_configs(base)]


def final_loss(result: RunResult, last: int = 3) -> float:
    """Mean training loss over the last `last` logged steps (one step's loss is noisy)."""
    values = [v for _, v in result.losses[-last:]]
    return sum(values) / len(values) if values else float("nan")


# ------------------------------------------------------------------ C7: a power of two against its neighbours


@dataclass
class PowerReading:
    power: RunResult
    below: RunResult
    above: RunResult
    line: Spread  # the neighbours' line at the power of two: interpolated median, from their mins and maxes
    place: str  # "above", "on" or "below" the line

    def describe(self) -> str:
        p = self.power.throughput
        return (f"batch {self.power.images_per_step}: {p.median:,.0f} images/s (min {p.low:,.0f}, max {p.high:,.0f}) "
                f"against the line between batch {self.below.images_per_step} and {self.above.images_per_step} at "
                f"{self.line.median:,.0f} (from their ranges: {self.line.low:,.0f}-{self.line.high:,.0f}): "
                f"{self.place} the line")


def _interpolate(x: int, x0: int, x1: int, y0: float, y1: float) -> float:
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def read_powers(results: list[RunResult]) -> list[PowerReading]:
    """Each power of two with a neighbour on each side against their line: only a bump above it favours the power."""
    ok = sorted((r for r in results if r.window_throughput and r.status == "ok"), key=lambda r: r.images_per_step)
    out = []
    for i, r in enumerate(ok):
        if not is_power_of_two(r.images_per_step) or i == 0 or i == len(ok) - 1:
            continue
        lo, hi = ok[i - 1], ok[i + 1]
        x, x0, x1 = r.images_per_step, lo.images_per_step, hi.images_per_step
        a, b = lo.throughput, hi.throughput
        line = Spread(_interpolate(x, x0, x1, a.median, b.median), _interpolate(x, x0, x1, a.low, b.low),
                      _interpolate(x, x0, x1, a.high, b.high), min(a.n, b.n))
        t = r.throughput
        c = verdict(line, t)  # the noise rule, against the line and its range
        place = "on" if c.noise else "above" if c.ratio > 1 else "below"
        out.append(PowerReading(r, lo, hi, line, place))
    return out


def judge_powers(results: list[RunResult]) -> Judgement:
    """C7: is a power-of-two batch faster than its neighbours' line, outside their spread?"""
    readings = read_powers(results)
    if not readings:
        return Judgement("does not hold here (no power of two with a measured neighbour on each side to judge)",
                         "; ".join(r.summary() for r in results))
    evidence = "; ".join(r.describe() for r in readings)
    findings = {f"at batch {r.power.images_per_step}":
                Judgement("holds" if r.place == "above" else
                        f"does not hold here ({r.place} its neighbours' line)", r.describe()) for r in readings}
    combined = claims.verdict_conditions(findings)
    if combined.verdict == "does not hold here":
        return Judgement("does not hold here (no power of two stands above its neighbours' line outside the spread)",
                       evidence)
    return Judgement(combined.verdict, evidence)


# ------------------------------------------------------------------ C8: as large as fits, against time-to-accuracy

def large_batch(base: TrainConfig, largest: int | None = None) -> int:
    """The large batch of the time-to-accuracy comparison: the largest that fits (capped at Profile.largest_factor x
    the profile's batch), else LR_DEMO_FACTOR x."""
    cap = base.batch_size * profile_of(base).largest_factor
    return min(largest, cap) if largest and largest > base.batch_size else base.batch_size * LR_DEMO_FACTOR


def tta_configs(base: TrainConfig, large: int) -> list[tuple[str, TrainConfig]]:
    """The profile's batch at its lr, and the large batch with the lr scaled by the optimiser's usual rule."""
    rule = DEFAULT_RULE[base.optimizer]
    lr = scaled_lr(base.lr, base.batch_size, large, rule)
    return [(f"batch {base.batch_size}, lr {base.lr:g}", base),
            (f"batch {large}, lr {lr:g} ({rule} rule)",
             base.replace(batch_size=large, lr=lr, train_images=max(base.train_images, large)))]


@comparison("04_batch_size:time_to_accuracy")
def time_to_accuracy_by_batch(base: TrainConfig, progress: bool = True, largest: int | None = None) -> list[RunResult]:
    """Time-to-accuracy over seeds at the profile's batch and at the largest batch that fits (capped)."""
    out: list[RunResult] = []
    preset = profile_of(base)
    for label, cfg in tta_configs(base, large_batch(base, largest)):
        out += time_to_accuracy(cfg, seeds=preset.tta_seeds, label=label, progress=progress,
                                max_steps=preset.batch_tta_max_steps).runs
    return out


def judge_largest(results: list[RunResult]) -> Judgement:
    """C8: the larger batch, counted in images/s and in time to the target accuracy."""
    groups = tta_groups(results)
    if len(groups) < 2:
        raise ValueError("judge_largest needs the runs of two batch sizes")
    small, big = groups[0], groups[-1]
    findings = {"counted in images/s": claims.verdict_speedup(small.runs, big.runs)}
    rate_big, rate_small = big.reached / len(big.runs), small.reached / len(small.runs)
    counts = (f"the target was reached in {big.reached} of {len(big.runs)} seeds at the larger batch, "
              f"{small.reached} of {len(small.runs)} at the smaller, within the step and time budget")
    if rate_big == rate_small == 0:
        tta = Judgement("does not hold here (neither batch reached the target within the budget)", counts)
    elif rate_big > rate_small:
        tta = Judgement("holds (the larger batch reached the target in more seeds)", counts)
    elif rate_big < rate_small:
        tta = Judgement("does not hold here (the larger batch reached the target in fewer seeds)", counts)
    else:
        tta = outcomes.tta_finding(small, big)  # the rule of every time-to-accuracy gain: steps or speed show it
    findings["counted in time to accuracy"] = tta
    combined = claims.verdict_conditions(findings)
    return combined._replace(evidence=combined.evidence + f"; {small.summary()}; {big.summary()}")
