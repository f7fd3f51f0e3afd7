"""The run's clocks and checks: timed windows read after a synchronise, and divergence seen in values read anyway.

WindowClock reads the clock only after a synchronise at the end of warm-up and of each timed window, so queued GPU
work is always counted and no step pays a sync of its own. DivergenceWatch, the one divergence rule (fastlab.run
and fastlab.watch), checks the losses and GradScaler scales the loop reads anyway for non-finite or blown-up values,
and the parameters once at the end.

    throughput of a window = images per step x steps in the window / window wall time
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from .config import TrainConfig
from .measure import now, synchronize
from .results import RunResult

# Below fp16's smallest subnormal a GradScaler scale means every recent step overflowed: the run has diverged.
MIN_GRAD_SCALE = 2.0**-24
# A finite loss this many times the run's first loss has blown up, though no NaN appeared: three orders of magnitude
# is far beyond the wobble of a training loss. The first loss is taken before any update, so a blow-up at the very
# first update still counts.
BLOWUP_FACTOR = 1000.0


def window_ends(warmup: int, steps: int, windows: int) -> dict[int, int]:
    """Step count at the end of each timed window -> steps in that window (the last takes the remainder)."""
    size = steps // windows
    ends, start = {}, warmup
    for i in range(windows):
        end = warmup + steps if i == windows - 1 else start + size
        ends[end] = end - start
        start = end
    return ends


class WindowClock:
    """Warm-up, then timed windows. The clock is read after a synchronise at the end of warm-up and of each
    window, never in between (a sync per step would change what is measured). Time spent inside paused()
    (evaluation checkpoints) counts nowhere."""

    def __init__(self, result: RunResult, device: torch.device, cfg: TrainConfig) -> None:
        self.res, self.device = result, device
        self.warmup, self.total, self.max_seconds = cfg.warmup_steps, cfg.warmup_steps + cfg.steps, cfg.max_seconds
        self.ends = window_ends(cfg.warmup_steps, cfg.steps, cfg.windows)
        self.t_start = self.window_start = 0.0

    def start(self) -> None:
        self.t_start = self.window_start = now(self.device)

    def is_boundary(self, done: int) -> bool:
        return done == self.warmup or done in self.ends

    def step_done(self, done: int, t0: float, wait: float, memory_mb: float, copy: float = 0.0) -> float:
        """Book step `done` (1-based) that began at t0; returns the clock read at its end."""
        res = self.res
        if self.is_boundary(done):
            synchronize(self.device)
        t1 = time.perf_counter()
        res.step_seconds.append(t1 - t0)
        res.data_wait_seconds.append(wait)
        res.copy_seconds.append(copy)
        res.memory_trace_mb.append(memory_mb)
        res.steps_done = done
        if done == self.warmup:
            res.warmup_seconds = t1 - self.t_start
            self.window_start = t1
        elif done in self.ends:
            res.extras.setdefault("window_seconds", []).append(t1 - self.window_start)
            res.window_throughput.append(res.images_per_step * self.ends[done] / (t1 - self.window_start))
            res.timed_seconds += t1 - self.window_start
            self.window_start = t1
        return t1

    def over_budget(self, done: int, t1: float) -> bool:
        """Whether the timed steps (warm-up excluded) have used up max_seconds, with steps left to run."""
        if not self.max_seconds or done <= self.warmup or done >= self.total:
            return False
        return t1 - self.window_start + self.res.timed_seconds > self.max_seconds

    def training_seconds(self) -> float:
        """Wall time of every training step so far, warm-up included, pauses excluded (after a sync)."""
        return now(self.device) - self.t_start

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        synchronize(self.device)
        t = time.perf_counter()
        try:
            yield
        finally:
            synchronize(self.device)
            gap = time.perf_counter() - t
            self.t_start += gap
            self.window_start += gap


class DivergenceWatch:
    """The one divergence rule, for fastlab's own runs and a watched loop alike: a loss that is non-finite, or
    BLOWUP_FACTOR times the first loss of the run (given with first_loss, read only when a later loss is read),
    a collapsed GradScaler scale, or non-finite parameters. It checks only values the run reads anyway: no
    host-device sync of its own during timed steps."""

    def __init__(self, result: RunResult, agree: Callable[[bool], bool] | None = None) -> None:
        self.res = result
        self.agree = agree  # with several processes, all must stop together: any one's divergence ends all
        self.reference: torch.Tensor | float | None = None  # the first loss seen: before any update has blown it up

    def _check(self, bad: bool, step: int, what: str) -> bool:
        """Whether the run diverged at `step`; the first divergence is booked on the result (status, step, why)."""
        if self.agree is not None:
            mine, bad = bad, self.agree(bad)
            if bad and not mine:
                what = f"another rank diverged at step {step}"
        if bad and self.res.status in ("ok", "time_limited"):  # a failed or stopped run keeps its own status
            self.res.status, self.res.diverged_step, self.res.error = "diverged", step, what
        return bad

    def first_loss(self, loss: torch.Tensor | float) -> None:
        """The run's first loss (kept as given, a tensor is not read here): the blow-up rule's reference. Later
        calls are ignored."""
        if self.reference is None:
            self.reference = loss.detach() if isinstance(loss, torch.Tensor) else float(loss)

    def loss(self, step: int, value: float) -> bool:
        """Whether a loss read at `step` means the run diverged: non-finite, or blown up against the first loss."""
        if isinstance(self.reference, torch.Tensor):
            self.reference = float(self.reference)  # read after this loss's own read: its value is ready
        if not (self.reference and math.isfinite(self.reference)):  # none given, or no use (0, NaN): this one
            self.reference = value
        if not math.isfinite(value):
            return self._check(True, step, f"the training loss became {value} at step {step}")
        self.res.last_finite_loss = value
        ratio = abs(value / self.reference) if self.reference else 0.0
        return self._check(ratio >= BLOWUP_FACTOR, step,
                           f"the training loss blew up: {value:.3g} at step {step}, {ratio:,.0f}x the run's first "
                           f"loss {self.reference:.3g} (>= {BLOWUP_FACTOR:,.0f}x counts as diverged)")

    def grad_scale(self, step: int, value: float) -> bool:
        return self._check(not math.isfinite(value) or value < MIN_GRAD_SCALE, step,
                           f"GradScaler's scale collapsed to {value:g} by step {step}: every recent step overflowed")

    def parameters(self, step: int, net: nn.Module) -> bool:
        """Once, after the timed steps: a non-finite weight means the run diverged, whatever the last loss said."""
        params = [p.detach() for p in net.parameters() if p.is_floating_point()]
        bad = bool(params) and not bool(torch.stack([torch.isfinite(p).all() for p in params]).all())
        return self._check(bad, step, f"a parameter was non-finite after step {step}")


@dataclass(frozen=True)
class Checkpoints:
    """Evaluate held-out accuracy every `every` steps (time kept apart) and stop once it reaches `target`;
    stop as time_limited once `max_training_seconds` of training (warm-up included) pass without reaching it."""

    every: int
    target: float
    max_training_seconds: float | None = None
