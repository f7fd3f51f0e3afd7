"""The run's clocks and checks: timed windows read after a synchronise, and divergence seen in values read anyway.

window_ends says where the timed windows end (the only places the clock is read, so no step pays a sync of its
own). DivergenceWatch is the one divergence rule, for fastlab.run and fastlab.watch alike.

    throughput of a window = images per step x steps in the window / window wall time
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .results import RunResult

# Below fp16's smallest subnormal a GradScaler scale means every recent step overflowed: the run has diverged.
MIN_GRAD_SCALE = 2.0**-24
# A finite loss this many times the run's first (taken before any update) has blown up: far beyond a loss's wobble.
BLOWUP_FACTOR = 1000.0


def window_ends(warmup: int, steps: int, windows: int) -> dict[int, int]:
    """Step count at the end of each timed window -> steps in that window (the last takes the remainder)."""
    ends = [warmup + steps // windows * i for i in range(1, windows)] + [warmup + steps]
    return {end: end - start for start, end in zip([warmup, *ends], ends)}


class StepClock:
    """A loop's clock, read by its watch at each step's end (times passed in: the watch reads time.perf_counter):
    each step's seconds since the last, the timed windows ([images, seconds] each), and the time left out of both
    (between epochs, inside w.paused())."""

    def __init__(self) -> None:
        self.start = self.last = self.window_start = 0.0
        self.window_images = self.window_steps = 0  # of the window open now
        self.windows: list[list[float]] = []  # [images, seconds] of each closed window
        self.excluded = 0.0

    def begin(self, t: float) -> None:
        self.start = self.last = self.window_start = t

    def exclude(self, seconds: float) -> None:
        """Leave `seconds` just spent out of the step and window clocks."""
        self.last += seconds
        self.window_start += seconds
        self.excluded += seconds

    def step(self, t: float, images: int, timed: bool, boundary: bool) -> float:
        """A step ended at t: its seconds since the last; a timed step counts into the open window, which a
        boundary closes."""
        seconds, self.last = t - self.last, t
        if timed:
            self.window_images += images
            self.window_steps += 1
            if boundary:
                self.close_window(t)
        return seconds

    def close_window(self, t: float) -> None:
        self.windows.append([self.window_images, t - self.window_start])
        self.window_start, self.window_images, self.window_steps = t, 0, 0

    def restart(self, t: float) -> None:
        """The next step's and window's time start at t (what came before is not the loop's time)."""
        self.last = self.window_start = t

    def training_seconds(self, t: float) -> float:
        """Wall time of the steps up to t, warm-up included, the left-out time not."""
        return t - self.start - self.excluded

    def timed_seconds(self, t: float) -> float:
        """Seconds of the timed steps up to t: the closed windows' and the open one's."""
        return t - self.window_start + sum(seconds for _, seconds in self.windows)

    def close_tail(self, on_cpu: bool, window_steps: int) -> int:
        """The steps after the last full window: on a CPU, a window of their own (if at least half a window) or part
        of the one before; elsewhere untimed, as their queued work's end is unknown. Returns the untimed steps."""
        untimed = 0
        if not on_cpu:
            untimed = self.window_steps
        elif self.window_steps * 2 >= window_steps or not self.windows:
            self.close_window(self.last)
        else:
            self.windows[-1][0] += self.window_images
            self.windows[-1][1] += self.last - self.window_start
        self.window_steps = self.window_images = 0
        return untimed

    def throughput(self) -> list[float]:
        return [images / seconds for images, seconds in self.windows]

    def window_seconds(self) -> list[float]:
        return [seconds for _, seconds in self.windows]


class DivergenceWatch:
    """The one divergence rule: a loss that is non-finite or BLOWUP_FACTOR times the first, a collapsed GradScaler
    scale, or non-finite parameters. It checks only values the run reads anyway: no sync of its own."""

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
        """The run's first loss, kept unread: the blow-up rule's reference. Later calls are ignored."""
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


class KeptLosses:
    """A loop's losses, kept unread (reading a tensor each step would be a host-device sync): every log_every-th
    step's and the last step's, read once at the end (one sync) and judged by the divergence rule."""

    def __init__(self, log_every: int, divergence: DivergenceWatch) -> None:
        self.log_every, self.divergence = log_every, divergence
        self.kept: list[tuple[int, Any]] = []  # (step, loss) every log_every steps
        self.last: tuple[int, Any] | None = None  # the last step's: read at the end too

    @property
    def given(self) -> bool:
        return self.last is not None

    def keep(self, k: int, loss: Any) -> None:
        """Step k's loss (a tensor or a number), kept unread."""
        self.last = (k - 1, loss.detach() if isinstance(loss, torch.Tensor) else float(loss))
        self.divergence.first_loss(self.last[1])
        if k % self.log_every == 0:
            self.kept.append(self.last)

    def read(self, res: RunResult) -> None:
        """The kept losses and the last step's into res.losses, read at once; the first that diverged is booked."""
        if self.last is None:
            return
        last_logged = bool(self.kept) and self.kept[-1][0] == self.last[0]
        kept = self.kept + ([] if last_logged else [self.last])
        tensors = [v.float().mean() for _, v in kept if isinstance(v, torch.Tensor)]
        read = iter(torch.stack(tensors).tolist() if tensors else [])
        res.losses = [(step, next(read) if isinstance(v, torch.Tensor) else v) for step, v in kept]
        for step, value in res.losses:
            if self.divergence.loss(step, value):
                break


@dataclass(frozen=True)
class Checkpoints:
    """Evaluate held-out accuracy every `every` steps (time kept apart) and stop once it reaches `target`;
    stop as time_limited once `max_training_seconds` of training (warm-up included) pass without reaching it."""

    every: int
    target: float
    max_training_seconds: float | None = None
