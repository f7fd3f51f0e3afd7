"""What to do with one arm of a comparison: train it, skip it as a no-op here, or run it once as a trap.

train.compare/sweep, bench's ladder and comparisons.run_arms all plan their arms here, so it imports none of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import TrainConfig
from .device_support import no_op_reasons, trap_reasons
from .measure import environment, resolve_device
from .results import RunResult

# Fields an arm may differ in without being a different computation (the seed, the labels' budget).
_NOT_KNOBS = ("seed", "max_seconds", "profile")
DEMONSTRATION_STEPS = 3  # timed steps of a trap's one demonstration run (enough for a median step time)
# A trap can cost a hundred times the baseline's step: its demonstration stops after this many timed seconds.
DEMONSTRATION_SECONDS = 10.0
DEMONSTRATION_EVAL_IMAGES = 16  # its accuracy is never compared: a few held-out images keep the record complete


@dataclass(frozen=True)
class ArmPlan:
    """What to do with one arm: "train" it, skip it as a "no-op" here, or run it once as a "trap" demonstration."""

    kind: str
    reason: str = ""


def plan_arm(baseline: TrainConfig, arm: TrainConfig, device: torch.device | str | None = None) -> ArmPlan:
    """How to run `arm` against `baseline` on `device` (default: the arm's). A knob counts as a no-op when it is
    one in either direction (set in the arm, or set in the baseline and undone by the arm)."""
    dev = resolve_device(arm.device) if device is None else torch.device(device)
    changed = [k for k in baseline.diff(arm) if k not in _NOT_KNOBS]
    if not changed:
        return ArmPlan("train")  # the baseline itself (or a repeat of it with another seed)
    idle = {**no_op_reasons(baseline, dev), **no_op_reasons(arm, dev)}
    if all(k in idle for k in changed):
        return ArmPlan("no-op", "; ".join(f"{k}: {idle[k]}" for k in changed))
    traps = trap_reasons(arm, dev)
    hit = [k for k in changed if k in traps]
    if hit:
        return ArmPlan("trap", "; ".join(f"{k}: {traps[k]}" for k in hit))
    return ArmPlan("train")


def not_trained(arm: TrainConfig, label: str, reason: str) -> RunResult:
    """The result of an arm that was not trained because it could teach nothing here: status "no_op", the reason."""
    dev = resolve_device(arm.device)
    return RunResult(config=arm.to_dict(), label=label, status="no_op",
                     error=f"every change is a no-op here ({reason})",
                     no_ops=no_op_reasons(arm, dev), env=environment(dev, arm.profile),
                     images_per_step=arm.batch_size * arm.grad_accum_steps, extras={"not_trained": reason})


def demonstration_config(arm: TrainConfig) -> TrainConfig:
    """A trap's demonstration: one warm-up step, DEMONSTRATION_STEPS timed (or DEMONSTRATION_SECONDS), few images."""
    budget = min(arm.max_seconds, DEMONSTRATION_SECONDS) if arm.max_seconds else DEMONSTRATION_SECONDS
    return arm.replace(warmup_steps=1, steps=DEMONSTRATION_STEPS, windows=1, max_seconds=budget,
                       eval_images=min(arm.eval_images, arm.batch_size, DEMONSTRATION_EVAL_IMAGES))
