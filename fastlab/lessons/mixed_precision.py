"""Notebook 02: fp32 vs fp16 (with GradScaler) vs bf16 over seeds and at two batch sizes (C3, C4), and the
torch.amp demos: fp16 gradients underflowing without loss scaling (C5), GradScaler's scale finding its level."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import torch
from torch import nn

from .. import claims
from ..claims import Judgement
from ..comparisons import comparison
from ..config import THOROUGH_SEEDS, TrainConfig, low_precision, positive_int, thorough, trap_reasons
from ..data import load_data, make_dataloader
from ..measure import Spread, resolve_device
from ..models import build_model
from ..outcomes import accuracy_spread, outcome_verdict
from ..profiles import profile_of
from ..results import RunResult, step_time
from ..train import interleave
from ..verdicts import runs_verdict, verdict

FP16_SMALLEST_SUBNORMAL = 2.0**-24  # below about half of this, an fp16 value rounds to exactly zero
FP16_SMALLEST_NORMAL = float(torch.finfo(torch.float16).tiny)  # 2**-14: below it fp16 loses precision
FP16_MAX = float(torch.finfo(torch.float16).max)  # 65504: above it a value overflows to inf
GRADSCALER_INIT_SCALE = 2.0**16  # torch.amp.GradScaler's default init_scale


def batch_sizes(base: TrainConfig) -> tuple[int, int]:
    """(small, large) batch for the launch-bound comparison: a quarter of the profile's batch, and the batch."""
    return max(1, base.batch_size // 4), base.batch_size


LABELS = {"off": "fp32", "fp16": "fp16 + GradScaler", "bf16": "bf16"}


def seeds_for(base: TrainConfig) -> tuple[int, ...]:
    """The profile's seeds (Profile.precision_seeds); under FASTLAB_THOROUGH=1, where the profile takes it,
    config.THOROUGH_SEEDS."""
    preset = profile_of(base)
    if preset.thorough and thorough():
        return THOROUGH_SEEDS
    return preset.precision_seeds


@comparison("02_mixed_precision:precision", arms=6, repeated=False)  # 3 precisions x 2 seeds
def compare_precision(base: TrainConfig, progress: bool = True) -> list[RunResult]:
    """fp32, fp16 + GradScaler and bf16 autocast over the profile's seeds; a known trap here runs once, short."""
    fp32 = base.replace(amp="off")
    arms = [(LABELS[amp], base.replace(amp=amp)) for amp in ("off", "fp16", "bf16")]
    return interleave(arms, baseline=fp32, seeds=seeds_for(base), progress=progress)


@comparison("02_mixed_precision:batch_size", arms=4)
def compare_batch_size(base: TrainConfig, progress: bool = True) -> list[RunResult]:
    amp = low_precision(base.device)
    arms: list[RunResult] = []
    for b in batch_sizes(base):
        fp32 = base.replace(batch_size=b, amp="off")
        arms += interleave([(f"batch {b}, {'fp32' if a == 'off' else a}", base.replace(batch_size=b, amp=a))
                            for a in ("off", amp)], baseline=fp32, progress=progress)
    return arms


def variant(result: RunResult) -> str:
    return result.extras.get("variant") or LABELS.get(result.config.get("amp"), result.label)


def by_variant(results: list[RunResult]) -> dict[str, list[RunResult]]:
    """Runs grouped by precision (over seeds), in the order they ran."""
    out: dict[str, list[RunResult]] = {}
    for r in results:
        out.setdefault(variant(r), []).append(r)
    return out


def first_seed(results: list[RunResult]) -> list[RunResult]:
    """One run per variant (the first seed's), for plots that show one bar per variant."""
    return [runs[0] for runs in by_variant(results).values()]


# ---------------------------------------------------------------- reading the results


def final_loss(result: RunResult, last: int = 5) -> float:
    """Mean of the last `last` logged training losses (one loss is too noisy to compare precisions)."""
    positive_int("final_loss: last", last)
    values = [v for _, v in result.losses[-last:]]
    return sum(values) / len(values) if values else math.nan


def versus(base: RunResult, other: RunResult) -> str:
    """`other` against `base` in one line. A trap's short run, or a run that finished no timed window, by both runs'
    step times (results.step_time, the one description of a run's step everywhere), never "nothing measured"; else
    the verdict on their timed windows."""
    if other.trap or not other.window_throughput:
        return f"{step_time(other)} against {step_time(base)} in {base.label}"
    return str(runs_verdict(base, other))


def batch_pairs(results: list[RunResult]) -> dict[int, tuple[RunResult, RunResult]]:
    """For each batch size: (its fp32 run, its low-precision run)."""
    runs: dict[int, dict[bool, RunResult]] = {}  # batch -> {is fp32: its first run}
    for r in results:
        runs.setdefault(int(r.config["batch_size"]), {}).setdefault(r.config["amp"] == "off", r)
    return {batch: (pair[True], pair[False]) for batch, pair in runs.items() if len(pair) == 2}


# ---------------------------------------------------------------- write it yourself


def exercise_trap(cfg: TrainConfig, device: torch.device) -> str | None:
    """Why autocast in this device's half precision (low_precision) is a known trap here (config.trap_reasons),
    or None where it is not."""
    return trap_reasons(cfg.replace(amp=low_precision(device)), device).get("amp")


# ---------------------------------------------------------------- why fp16 needs GradScaler


@dataclass
class UnderflowReport:
    """Gradients of one nearly-fitted regression step: fp32 reference vs fp16 autocast, unscaled and scaled."""

    loss_scale: float
    device: str
    output_grads: int  # gradient elements w.r.t. the network's (fp16) output
    output_zero_unscaled: int  # ...that are exactly zero in fp16 without scaling, though not in fp32
    output_zero_scaled: int  # ...the same, with the loss multiplied by loss_scale
    param_grads: int
    param_zero_unscaled: int
    param_zero_scaled: int
    log2_reference: list[float] = field(default_factory=list, repr=False)  # log2 |output grad| in fp32


def _check_positive(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ValueError(f"{name}={value!r} is not allowed: a finite number > 0")


def _regression_problem(device: torch.device, batch: int, residual: float, seed: int):
    """A small MLP and targets it already fits to within `residual`: late training, where gradients are tiny."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    x = torch.randn(batch, 32, generator=gen)
    with torch.no_grad():
        target = net(x) + residual * torch.randn(batch, 10, generator=gen)
    return net.to(device), x.to(device), target.to(device)


def _gradients(net: nn.Module, x: torch.Tensor, target, dtype: torch.dtype | None,
               scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(output gradient, unscaled parameter gradients) via GradScaler; target: MSE targets, or output -> loss."""
    dev = x.device
    scaler = torch.amp.GradScaler(dev.type, init_scale=scale, enabled=scale != 1.0)
    opt = torch.optim.SGD(net.parameters(), lr=0.0)  # only so that unscale_ can find the gradients
    opt.zero_grad(set_to_none=True)
    with torch.autocast(dev.type, dtype=dtype or torch.float32, enabled=dtype is not None):
        out = net(x)
        out.retain_grad()
        loss = target(out) if callable(target) else nn.functional.mse_loss(out, target)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    params = torch.cat([p.grad.flatten() for p in net.parameters()])
    return out.grad.detach().float().flatten(), params.detach()


def gradient_underflow(loss_scale: float = GRADSCALER_INIT_SCALE, residual: float = 1e-3, batch: int = 2048,
                       device: torch.device | str = "cpu", seed: int = 0) -> UnderflowReport:
    """The gradients fp16 flushes to zero, unscaled and scaled: a nearly fitted net's are ~ residual/batch."""
    _check_positive("gradient_underflow(loss_scale)", loss_scale)
    _check_positive("gradient_underflow(residual)", residual)
    positive_int("gradient_underflow(batch)", batch)
    dev = resolve_device(device) if isinstance(device, str) else device
    net, x, target = _regression_problem(dev, batch, residual, seed)
    ref_out, ref_par = _gradients(net, x, target, None, 1.0)
    un_out, un_par = _gradients(net, x, target, torch.float16, 1.0)
    sc_out, sc_par = _gradients(net, x, target, torch.float16, loss_scale)
    out_nonzero, par_nonzero = ref_out != 0, ref_par != 0
    return UnderflowReport(
        loss_scale=loss_scale, device=str(dev), output_grads=ref_out.numel(),
        output_zero_unscaled=int(((un_out == 0) & out_nonzero).sum()),
        output_zero_scaled=int(((sc_out == 0) & out_nonzero).sum()),
        param_grads=ref_par.numel(),
        param_zero_unscaled=int(((un_par == 0) & par_nonzero).sum()),
        param_zero_scaled=int(((sc_par == 0) & par_nonzero).sum()),
        log2_reference=torch.log2(ref_out[out_nonzero].abs()).cpu().tolist(),
    )


@dataclass
class NetUnderflow:
    """The workbook net's parameter gradients `steps` fp32 steps into a real run, and the share fp16 flushes to zero."""

    model: str
    steps: int
    batch_size: int
    param_grads: int
    zero_unscaled: int  # zero under fp16 autocast without scaling, nonzero in fp32
    zero_scaled: int  # the same with GradScaler's default initial scale
    device: str
    grad_images: int = 0  # images the compared gradients were taken on (0: the whole batch)

    @property
    def share(self) -> float:
        return self.zero_unscaled / self.param_grads

    def summary(self) -> str:
        taken = (f"; gradients of its first {self.grad_images} images, as fp16 is a known trap on this device"
                 if self.grad_images else "")
        return (f"the {self.model} net after {self.steps} fp32 steps (batch {self.batch_size}, {self.device}{taken}): "
                f"{self.zero_unscaled:,} of {self.param_grads:,} parameter gradients ({self.share:.2%}) are zero under "
                f"fp16 autocast without scaling; {self.zero_scaled:,} with GradScaler at {GRADSCALER_INIT_SCALE:g}")


TRAP_GRAD_IMAGES = 8  # where fp16 is a known trap (slow: config.trap_reasons), gradients of this many images


def net_gradient_underflow(cfg: TrainConfig, steps: int = 20) -> NetUnderflow:
    """C5 in a real run: `steps` fp32 Adam steps of the workbook net, then a batch's fp32, fp16 and scaled gradients."""
    positive_int("net_gradient_underflow(steps)", steps)
    dev = resolve_device(cfg.device)
    data, _ = load_data(cfg, None)
    torch.manual_seed(cfg.seed)
    net = build_model(cfg.model).to(dev)
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr)
    loader = make_dataloader(data.train_images, data.train_labels, batch_size=cfg.batch_size, train=True, seed=cfg.seed)
    batches = itertools.chain.from_iterable(itertools.repeat(loader, steps + 1))  # a smoke set is small
    for _ in range(steps):
        x, y = next(batches)
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(net(x.to(dev)), y.to(dev)).backward()
        opt.step()
    x, y = (t.to(dev) for t in next(batches))
    few = TRAP_GRAD_IMAGES if "amp" in trap_reasons(cfg.replace(amp="fp16"), dev) else 0
    if few:
        x, y = x[:few], y[:few]
    loss = lambda out: nn.functional.cross_entropy(out, y)  # noqa: E731 - one line, used three times
    ref = _gradients(net, x, loss, None, 1.0)[1]
    unscaled = _gradients(net, x, loss, torch.float16, 1.0)[1]
    scaled = _gradients(net, x, loss, torch.float16, GRADSCALER_INIT_SCALE)[1]
    nonzero = ref != 0
    return NetUnderflow(cfg.model, steps, cfg.batch_size, ref.numel(), int(((unscaled == 0) & nonzero).sum()),
                        int(((scaled == 0) & nonzero).sum()), str(dev), grad_images=min(few, len(y)))


def scaler_history(steps: int = 30, init_scale: float = 2.0**30, growth_interval: int = 3,
                   device: torch.device | str = "cpu", seed: int = 0) -> list[tuple[int, float, bool]]:
    """(step, scale, skipped) per fp16 step of the small MLP, its GradScaler started too high."""
    dev = resolve_device(device) if isinstance(device, str) else device
    net, x, target = _regression_problem(dev, 256, residual=0.1, seed=seed)
    opt = torch.optim.SGD(net.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler(dev.type, init_scale=init_scale, growth_interval=growth_interval)
    history = []
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.float16):
            loss = nn.functional.mse_loss(net(x), target)
        scaler.scale(loss).backward()
        before = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        history.append((step, before, scaler.get_scale() < before))  # the scale drops only on a skipped step
    return history


# ---------------------------------------------------------------- the verdicts on C3, C4 and C5


def quality_loss(base_runs: list[RunResult], other_runs: list[RunResult]) -> str | None:
    """Why `other` lost quality against `base` (divergence, or accuracy lower outside the seeds' spread), else None."""
    diverged = [r for r in other_runs if r.status == "diverged"]
    if diverged:
        return f"{len(diverged)} of {len(other_runs)} runs diverged ({diverged[0].error})"
    base, other = accuracy_spread(base_runs), accuracy_spread(other_runs)
    if base.n >= 2 and other.n >= 2 and verdict(base, other, "accuracy").direction == "worse":
        return f"held-out accuracy {other.median:.1%} vs {base.median:.1%}, lower outside the seeds' spread"
    return None


def judge_speed_and_quality(precision: list[RunResult], by_batch: list[RunResult] | None = None) -> Judgement:
    """C3: faster, with no loss of quality? Per low-precision dtype at the profile's batch (over seeds), and for
    the preferred dtype at the small batch too; combined into holds / holds only when ... / does not hold."""
    groups = by_variant(precision)
    fp32 = groups.get("fp32")
    if not fp32:
        raise ValueError("judge_speed_and_quality needs the fp32 runs of the precision comparison")
    batch = int(fp32[0].config["batch_size"])
    findings: dict[str, Judgement] = {}
    ratios: dict[str, float] = {}  # condition -> measured speed-up
    notes = [f"{name}: {outcome_verdict(fp32, runs)}" for name, runs in groups.items() if runs is not fp32]
    pairs = [(batch, fp32, runs) for runs in groups.values() if runs is not fp32]
    pairs += [(b, [base], [low]) for b, (base, low) in batch_pairs(by_batch or []).items() if b != batch]
    for b, base, runs in pairs:
        key = f"{runs[0].config['amp']} at batch {b}"
        lost = quality_loss(base, runs) if base is fp32 else None
        findings[key] = Judgement(f"does not hold here (quality lost: {lost})", "") if lost else \
            claims.verdict_speedup(base, runs)
        ratios[key] = verdict(claims.pooled_throughput(base), claims.pooled_throughput(runs)).ratio
    combined = claims.verdict_conditions(findings)
    best = max((ratios[c] for c, f in findings.items() if f.verdict.startswith("holds")), default=None)
    words = combined.verdict
    if best is not None and best < C3_CLAIMED_LOW:  # faster, but by less than the advice's figure
        words += f", short of the advice's up to 2-3x (best measured {best:.2f}x)"
    return combined._replace(verdict=words, evidence=combined.evidence + "; " + "; ".join(notes) +
                             "; the advice says up to 2-3x faster")


C3_CLAIMED_LOW = 2.0  # the low end of C3's "up to 2-3x faster"


def judge_memory(precision: list[RunResult], breakdown: Judgement | None = None) -> Judgement:
    """C4 ("about 50% less memory"). On CUDA: the allocator's peak of the same runs, per dtype. Elsewhere the
    process's resident memory cannot show it, so `breakdown`, the finding on the memory computed from tensor
    sizes (lessons.memory.judge_amp_memory of amp_pairs; the notebook passes it in), decides when it is given."""
    groups = by_variant(precision)
    fp32 = groups.get("fp32", [])
    if fp32 and fp32[0].memory_kind == "cuda_max_allocated":
        findings = {}
        for runs in groups.values():
            if runs is not fp32:
                findings[f"in {runs[0].config['amp']}"] = claims.verdict_less(
                    Spread.of([r.peak_memory_mb for r in fp32]), Spread.of([r.peak_memory_mb for r in runs]), 0.5,
                    what="peak memory")
        combined = claims.verdict_conditions(findings)
        return Judgement(combined.verdict, combined.evidence + "; master weights, gradients and optimiser state stay "
                                                             "fp32 under autocast")
    if breakdown is not None:
        return breakdown
    low = [runs for runs in groups.values() if runs is not fp32]
    f = claims.verdict_less(Spread.of([r.peak_memory_mb for r in fp32]),
                            Spread.of([r.peak_memory_mb for r in low[0]]), 0.5, what="process memory (RSS)")
    return Judgement(f.verdict, f.evidence + " (resident memory includes PyTorch itself: a weak test)")


def judge_underflow(report: UnderflowReport, net: NetUnderflow | None = None) -> Judgement:
    """C5: do gradients underflow in fp16 without the scaler, and does the scaler keep them? Decided by the
    demonstration (a regression built to underflow), so the verdict says so; `net`, when given, adds the share of
    the workbook net's own gradients that underflow in a real run."""
    r = report
    evidence = (f"in the demonstration (MSE over batch {r.output_grads // 10:,} x 10 outputs, targets fitted to a small "
                f"residual, built to underflow): parameter gradients zero in fp16: {r.param_zero_unscaled:,} of "
                f"{r.param_grads:,} without scaling, {r.param_zero_scaled:,} with GradScaler at {r.loss_scale:g}; "
                f"output gradients: {r.output_zero_unscaled:,} and {r.output_zero_scaled:,} of {r.output_grads:,}")
    lost, kept = r.param_zero_unscaled + r.output_zero_unscaled, r.param_zero_scaled + r.output_zero_scaled
    if lost == 0:
        words = "does not hold here (no gradient underflowed without the scaler in the demonstration)"
    elif kept >= lost:
        words = "does not hold here (the scaler did not keep the gradients that underflowed in the demonstration)"
    else:
        words = (f"holds in a demonstration built to underflow ({r.param_zero_unscaled / r.param_grads:.0%} of its "
                 f"parameter gradients underflow to zero without the scaler; {'none' if kept == 0 else kept} with it)")
    if net is None:
        return Judgement(words, evidence)
    return Judgement(words[:-1] + f"; in a real run of the workbook net, {net.share:.2%} of its parameter gradients "
                   f"underflow without it)", evidence + "; " + net.summary())
