"""Notebook 03: kernel selection and memory layout: cudnn.benchmark, channels_last, TF32, and the pitfall of input
shapes that change every step. cuDNN caches plans per thread, so each timing runs in a fresh process."""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, field

import torch
from torch import nn

from .. import claims, isolation
from ..claims import Judgement
from ..comparisons import comparison
from ..config import TrainConfig, low_precision, positive_int
from ..measure import MemoryMeter, Spread, now, resolve_device
from ..models import build_model
from ..results import RunResult
from ..train import interleave
from ..verdicts import Comparison, runs_verdict

NAME = "03_cudnn_benchmark_and_channels_last"
FIXED_SIZE = 32  # the size every training batch has; warm-up of the shape timing runs at it
VARYING_SIZES = (24, 26, 28, 30, 34, 36, 38, 40)  # never 32, so none was tuned during warm-up; mean pixels ~ 32x32


@comparison(f"{NAME}:cudnn_benchmark", arms=2)
def compare_cudnn_benchmark(base: TrainConfig, progress: bool = True) -> list[RunResult]:
    return interleave([(f"cudnn.benchmark {'on' if on else 'off'}", base.replace(cudnn_benchmark=on))
                       for on in (False, True)], baseline=base.replace(cudnn_benchmark=False), progress=progress)


@comparison(f"{NAME}:channels_last", arms=4)
def compare_channels_last(base: TrainConfig, progress: bool = True) -> list[RunResult]:
    """channels_last against NCHW in fp32, and in the low precision of this device; each pair against its NCHW."""
    results: list[RunResult] = []
    for amp in ("off", low_precision(base.device)):
        nchw = base.replace(amp=amp, channels_last=False)
        results += interleave([(f"{'fp32' if amp == 'off' else amp}, {'channels_last' if cl else 'NCHW'}",
                                nchw.replace(channels_last=cl)) for cl in (False, True)],
                              baseline=base.replace(amp="off", channels_last=False), progress=progress)
    return results


@comparison(f"{NAME}:tf32", arms=3)
def compare_tf32(base: TrainConfig, progress: bool = True) -> list[RunResult]:
    """fp32 throughout: conv TF32 off (strict) against on (torch's default), then TF32 matmuls too."""
    strict = base.replace(amp="off", tf32=False, matmul_precision="highest")
    tf32 = strict.replace(tf32=True)
    return interleave([("strict fp32 (conv TF32 off)", strict), ("conv TF32 on (torch's default)", tf32),
                       ("+ TF32 matmuls (matmul_precision='high')", tf32.replace(matmul_precision="high"))],
                      progress=progress)


def channels_last_gain(results: list[RunResult]) -> dict[str, Comparison]:
    """For each precision: channels_last against NCHW at that precision."""
    out: dict[str, Comparison] = {}
    for amp in dict.fromkeys(r.config["amp"] for r in results):
        first = {r.config["channels_last"]: r for r in reversed(results) if r.config["amp"] == amp}
        if len(first) == 2:
            out["fp32" if amp == "off" else amp] = runs_verdict(first[False], first[True])
    return out


@dataclass
class ShapeTiming:
    """Forward+backward steps timed one by one (synchronised) on a sequence of input sizes."""

    label: str
    sizes: list[int]
    benchmark: bool
    device: str
    warmup_seconds: float  # the untimed first steps, at FIXED_SIZE
    step_seconds: list[float] = field(default_factory=list)
    peak_memory_mb: float = 0.0
    memory_kind: str = ""
    no_op: str | None = None  # why cudnn.benchmark did nothing here, if it did nothing

    @property
    def step_ms(self) -> Spread:
        return Spread.of([1000 * s for s in self.step_seconds])


def _check_sizes(sizes: list[int]) -> None:
    if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s < 16 for s in sizes):
        raise ValueError(f"time_shapes(sizes={sizes!r}) is not allowed: a non-empty list of image sizes, each an "
                         f"integer >= 16 (the nets pool the image three times)")


def time_shapes(sizes: list[int], *, benchmark: bool, model: str | nn.Module = "tiny", batch_size: int = 32,
                warmup_steps: int = 2, device: str = "auto", channels_last: bool = False,
                label: str = "", seed: int = 0) -> ShapeTiming:
    """Time forward+backward of `model` on random SYNTHETIC images of each size in turn, each step synchronised (so
    queued GPU work and autotuning count); warm-up runs at FIXED_SIZE, reported apart. cudnn.benchmark is restored."""
    _check_sizes(sizes)
    if not isinstance(benchmark, bool):
        raise ValueError(f"time_shapes(benchmark={benchmark!r}) is not allowed: True or False")
    positive_int("time_shapes: batch_size", batch_size)
    positive_int("time_shapes: warmup_steps", warmup_steps, 0)
    dev = resolve_device(device)
    torch.manual_seed(seed)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    net = (build_model(model) if isinstance(model, str) else model).to(dev, memory_format=fmt)
    gen = torch.Generator().manual_seed(seed)
    inputs = {s: torch.randn(batch_size, 3, s, s, generator=gen) for s in dict.fromkeys([FIXED_SIZE, *sizes])}
    labels = torch.randint(0, 10, (batch_size,), generator=gen).to(dev)
    result = ShapeTiming(label=label or f"sizes {sizes[0]}..., benchmark {'on' if benchmark else 'off'}",
                         sizes=list(sizes), benchmark=benchmark, device=str(dev), warmup_seconds=0.0)
    if benchmark and dev.type != "cuda":
        result.no_op = f"cudnn.benchmark: cuDNN runs only on NVIDIA GPUs; this ran on {dev.type}"

    def step(size: int) -> None:
        x = inputs[size].to(dev).contiguous(memory_format=fmt)
        net.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(net(x), labels).backward()

    saved = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = benchmark
    try:
        t0 = now(dev)
        for _ in range(warmup_steps):
            step(FIXED_SIZE)
        result.warmup_seconds = now(dev) - t0
        meter = MemoryMeter(dev)  # reset here: the peak is that of the timed steps
        result.memory_kind = meter.kind
        for size in sizes:
            t0 = now(dev)
            step(size)
            result.step_seconds.append(now(dev) - t0)
            meter.sample()
        result.peak_memory_mb = meter.peak()
    finally:
        torch.backends.cudnn.benchmark = saved
    return result


def varying_sizes(steps: int, seed: int = 0) -> list[int]:
    """`steps` sizes from VARYING_SIZES in a shuffled order; a size repeats only after all others were used."""
    rng = random.Random(seed)
    out: list[int] = []
    while len(out) < steps:
        block = list(VARYING_SIZES)
        rng.shuffle(block)
        out += block
    return out[:steps]


def mean_pixel_ratio(sizes: list[int]) -> float:
    """Mean pixels per image of `sizes` over FIXED_SIZE's: how much more work the varying sizes do per step."""
    _check_sizes(sizes)
    return statistics.mean(s * s for s in sizes) / FIXED_SIZE**2


def shape_pitfall(base: TrainConfig, steps: int = len(VARYING_SIZES)) -> list[ShapeTiming]:
    """Fixed vs varying input sizes, cudnn.benchmark off and on, each in a fresh process (empty cuDNN plan caches)."""
    out = []
    for benchmark in (False, True):
        for name, sizes in (("fixed 32x32", [FIXED_SIZE] * steps), ("varying sizes", varying_sizes(steps))):
            out.append(isolation.call(time_shapes, sizes, benchmark=benchmark, model=base.model,
                                      batch_size=base.batch_size, device=base.device,
                                      label=f"{name}, benchmark {'on' if benchmark else 'off'}", seed=base.seed))
    return out


def judge_benchmark(bench: list[RunResult], shapes: list[ShapeTiming] | None = None) -> Judgement:
    """C6: does cudnn.benchmark pay with fixed shapes (training runs, warm-up apart) and what with changing
    shapes (the shape timings, benchmark on against off)? No-op where cuDNN does not run."""
    off, on = bench[0], bench[-1]
    if "cudnn_benchmark" in on.no_ops:  # cuDNN is NVIDIA's library: without its GPU the claim cannot be tested
        return Judgement(claims.no_accelerator(on.no_ops["cudnn_benchmark"]),
                       f"benchmark on: {on.summary()}; {warmup_against(on, off)}")
    findings = {"shapes are fixed": claims.verdict_speedup(off, on)}
    if shapes:
        varying = {t.benchmark: t for t in shapes if len(set(t.sizes)) > 1}
        if True in varying and False in varying:
            f = claims.verdict_less(varying[False].step_ms, varying[True].step_ms, what="step time", unit="ms")
            findings["shapes change every step"] = Judgement(f.verdict.replace("less step time", "faster steps"),
                                                           f.evidence)
    combined = claims.verdict_conditions(findings)
    return combined._replace(evidence=f"{combined.evidence}; {warmup_against(on, off)} (autotuning lands there)")


def warmup_against(on: RunResult, off: RunResult) -> str:
    """Each arm's warm-up, benchmark on then off: a figure only for a warm-up that ran, else why it did not."""
    return f"benchmark on: {on.warmup_words()}; off: {off.warmup_words()}"
