"""Notebook 06: C12 (AdamW + cosine "converges faster") in time to accuracy over seeds, one change at a time;
learning-rate schedules; optimiser state; and the optimiser step's implementation (for-loop, foreach, fused)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..claims import Judgement
from ..comparisons import comparison
from ..config import TrainConfig, as_run_here, positive_int
from ..measure import Spread, now, resolve_device
from ..models import build_model
from ..outcomes import TimeToAccuracy, time_to_accuracy, tta_finding, tta_groups
from ..profiles import profile_of
from ..results import RunResult
from ..train import sweep
from ..training import make_optimizer, make_scheduler

NAME = "06_adamw_and_schedules"
C12_COMPARISON = f"{NAME}:c12_time_to_accuracy"

# Sensible settings per optimiser: AdamW's decoupled decay is larger than Adam's L2; SGD needs a far larger lr.
OPTIMIZER_PRESETS: dict[str, dict[str, Any]] = {
    "adam": {"optimizer": "adam", "lr": 2e-3, "weight_decay": 5e-4},
    "adamw": {"optimizer": "adamw", "lr": 2e-3, "weight_decay": 0.05},
    "sgd": {"optimizer": "sgd", "lr": 0.05, "weight_decay": 5e-4, "momentum": 0.9},
}

CLAIM_WEIGHT_DECAY = 1e-2  # C12's example weight decay for AdamW; every variant keeps the profile's lr
SCHEDULES = ("none", "cosine", "onecycle")
OPT_IMPLS = ("for-loop", "foreach", "fused")


def preset(base: TrainConfig, name: str) -> TrainConfig:
    """base with the OPTIMIZER_PRESETS settings of optimiser `name`."""
    if name not in OPTIMIZER_PRESETS:
        raise ValueError(f"preset: name={name!r} is not allowed: choose one of "
                         f"{', '.join(map(repr, OPTIMIZER_PRESETS))}")
    return base.replace(**OPTIMIZER_PRESETS[name])


@dataclass(frozen=True)
class Change:
    """One variant of the C12 comparison: what it changed against the variant before it."""

    label: str
    change: str
    config: TrainConfig


def c12_changes(base: TrainConfig) -> list[Change]:
    """Adam -> AdamW (same decay, decoupled) -> AdamW with the claim's weight decay -> + cosine."""
    wd0 = OPTIMIZER_PRESETS["adam"]["weight_decay"]
    adam = base.replace(optimizer="adam", weight_decay=wd0, scheduler="none", opt_impl="default")
    out = [Change("Adam", f"the baseline: Adam, lr {base.lr:g}, weight decay {wd0:g} as L2 in the gradient", adam),
           Change("AdamW", f"the optimiser only: the same weight decay {wd0:g}, decoupled from the adaptive step",
                  adam.replace(optimizer="adamw"))]
    out.append(Change(f"AdamW, wd {CLAIM_WEIGHT_DECAY:g}",
                      f"the weight decay only: {wd0:g} -> {CLAIM_WEIGHT_DECAY:g} (the claim's figure)",
                      out[-1].config.replace(weight_decay=CLAIM_WEIGHT_DECAY)))
    out.append(Change(out[-1].label + " + cosine", "the schedule only: CosineAnnealingLR over the run's step budget",
                      out[-1].config.replace(scheduler="cosine")))
    return out


@comparison(C12_COMPARISON)
def c12_time_to_accuracy(base: TrainConfig, progress: bool = True) -> list[RunResult]:
    """C12's variants (c12_changes), each trained to the profile's target accuracy over its tta_seeds, seed-major
    (a slow spell hits every variant alike); stops if interrupted."""
    runs: list[RunResult] = []
    for seed in profile_of(base).tta_seeds:
        for c in c12_changes(base):
            one = time_to_accuracy(c.config, seeds=(seed,), label=c.label, progress=progress)
            for r in one.runs:
                r.extras["change"] = c.change
            runs += one.runs
            if any(r.status == "interrupted" for r in one.runs):
                return runs
    return runs


def stability_note(base: TimeToAccuracy, other: TimeToAccuracy) -> str:
    """'More stably', as far as a few seeds tell: seeds diverged or missing the target, and their steps' range."""
    def one(t: TimeToAccuracy) -> str:
        s = t.steps
        bad = sum(r.status == "diverged" for r in t.runs)
        spread = f"steps to target {s.low:.0f}-{s.high:.0f}" if s.n else "no seed reached it"
        return f"{t.label}: reached in {t.reached} of {len(t.runs)} seeds, {bad} diverged, {spread}"
    return f"{one(other)}; {one(base)}"


def judge_c12(ttas: list[TimeToAccuracy]) -> Judgement:
    """C12's verdict: the last variant (AdamW + cosine) against the first (Adam), in time to accuracy over seeds.
    When the target is reached before the schedule has acted, the test could not come out otherwise: the
    verdict says the schedule was not tested here, and why."""
    if len(ttas) < 2:
        raise ValueError("judge_c12 needs the Adam variant and at least one other")
    f = tta_finding(ttas[0], ttas[-1], steps_too=True)
    evidence = f"{f.evidence}. Stability: {stability_note(ttas[0], ttas[-1])}"
    untested = schedule_not_acted(ttas[-1], ttas[0])
    if untested:
        return Judgement(f"not testable here ({untested})", f"in time to target: {f.verdict}; {evidence}")
    return Judgement(f.verdict, evidence)


SCHEDULE_ACTED = 0.9  # a schedule has acted once its learning rate has fallen below this share of its peak


def schedule_not_acted(t: TimeToAccuracy, base: TimeToAccuracy) -> str | None:
    """Why `t`'s schedule had not acted by the step its seeds reached the target (the later of t's and base's
    median steps), or None. The schedule spans warm-up + timed steps: the run's step budget."""
    runs = t.reached_runs
    if not runs or runs[0].config.get("scheduler", "none") == "none" or not base.steps.n:
        return None
    cfg = runs[0].config
    span = int(cfg.get("warmup_steps", 0)) + int(cfg["steps"])
    step = int(max(t.steps.median, base.steps.median))
    lrs = lr_schedules(TrainConfig.from_dict(cfg), max(span, 2), (cfg["scheduler"],))[cfg["scheduler"]]
    reached = lrs[: min(step, len(lrs) - 1) + 1]
    peak = max(lrs)
    if min(reached) / peak < SCHEDULE_ACTED:
        return None
    decay = (f" (and weight decay {cfg['weight_decay']:g} had acted for only {step} steps)"
             if cfg.get("weight_decay") else "")
    return (f"the target was reached by step {step} of the {span} its {cfg['scheduler']} schedule spans, while the "
            f"learning rate was still {reached[-1] / peak:.0%} of its peak: the schedule had not acted{decay}; "
            f"a longer run, or a harder target, would test it")


def judge_c12_results(results: list[RunResult]) -> Judgement:
    """C12 on the runs of c12_time_to_accuracy (the bundled reference results' form)."""
    return judge_c12(tta_groups(results))


def lr_schedules(base: TrainConfig, total_steps: int, names: tuple[str, ...] = SCHEDULES) -> dict[str, list[float]]:
    """The learning rate at each of `total_steps` steps per schedule, from fastlab.run's scheduler, stepped alike."""
    positive_int("lr_schedules: total_steps", total_steps, 2)
    out = {}
    for name in names:
        cfg = base.replace(scheduler=name, opt_impl="default")
        param = torch.nn.Parameter(torch.zeros(1))
        opt = make_optimizer(cfg, [param])
        sched = make_scheduler(cfg, opt, total_steps) if name != "none" else None
        lrs = []
        for _ in range(total_steps):
            lrs.append(opt.param_groups[0]["lr"])
            opt.step()  # no gradient: a no-op update, but the scheduler expects a step first
            if sched is not None:
                sched.step()
        out[name] = lrs
    return out


def optimizer_state_bytes(base: TrainConfig, name: str | None = None) -> tuple[int, int]:
    """(bytes of the model's parameters, bytes of the optimiser's state after one step), counted from the tensors
    of a real optimiser built as fastlab.run builds it (name: an OPTIMIZER_PRESETS entry, default base's own)."""
    cfg = preset(base, name) if name else base
    cfg = cfg.replace(device="cpu", opt_impl="default")
    torch.manual_seed(cfg.seed)
    net = build_model(cfg.model)
    opt = make_optimizer(cfg, net.parameters())
    for p in net.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    params = sum(p.numel() * p.element_size() for p in net.parameters())
    state = sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values()
                if isinstance(v, torch.Tensor))
    return params, state


@comparison(f"{NAME}:opt_impl", arms=len(OPT_IMPLS))
def opt_impls(base: TrainConfig, progress: bool = True) -> list[RunResult]:
    """AdamW with a for-loop, foreach and fused optimiser step (the step's share is sampled in warm-up)."""
    return sweep("opt_impl", list(OPT_IMPLS), preset(base, "adamw"), progress=progress)


@dataclass(frozen=True)
class StepTiming:
    impl: str
    optimizer: str
    steps_per_second: Spread  # 1 / (seconds of one optimizer.step()), over the timed repeats
    params: int  # number of parameter tensors the step updates
    no_op: str = ""  # why the asked-for implementation could not be used here

    @property
    def milliseconds(self) -> float:
        return 1000 / self.steps_per_second.median


def time_optimizer_step(base: TrainConfig, impl: str, repeats: int = 30, warmup: int = 5) -> StepTiming:
    """Time optimizer.step() alone on base.model's parameters with random gradients, synchronised, after `warmup`
    steps; built as fastlab.run builds it, so a missing implementation falls back the same way and says so."""
    cfg = base.replace(opt_impl=impl)  # TrainConfig refuses an unknown impl
    device = resolve_device(cfg.device)
    torch.manual_seed(cfg.seed)
    net = build_model(cfg.model).to(device)
    cfg, no_ops, _ = as_run_here(cfg, device)
    opt = make_optimizer(cfg, net.parameters())
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    for p in net.parameters():
        p.grad = torch.randn(p.shape, generator=gen, device=device) * 1e-3
    rates = []
    for i in range(warmup + repeats):
        t0 = now(device)
        opt.step()
        if i >= warmup:
            rates.append(1 / (now(device) - t0))
    return StepTiming(impl, cfg.optimizer, Spread.of(rates), len(list(net.parameters())), no_ops.get("opt_impl", ""))

