"""What fastlab.run's harness asks of the watch besides measuring: its timed windows, and when the loop must end early
(a stop event, max_seconds, divergence, an accuracy target reached, a training-time limit used up).

The reader's instrument (fastlab.watch) measures and nothing else. The harness hands its watch a RunLimits, and the
watch asks it at the touches the loop already makes: after each step (after_step), before each batch (must_stop),
at a paused block's start (check_pause) and end (checkpoint). A watch without one asks an OwnLoop, whose answers
are a reader's loop's: its own windows, nothing stops it, every accuracy is the run's.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .clocks import KeptLosses, window_ends
from .results import RunResult


class RunEnded(Exception):
    """Raised by w.paused() under RunLimits once the run has ended in a way that skips evaluation."""


class OwnLoop:
    """A reader's own loop, with no harness around it: the watch keeps its own timed windows and describes the run
    itself, nothing stops the loop and every held-out accuracy is the run's. RunLimits overrides each answer."""

    harness: ClassVar[bool] = False  # fastlab.run's run: its windows planned, its result described by the harness
    result: RunResult | None = None
    agree: Callable[[bool], bool] | None = None
    sample_parts = False
    waiting: Any = None

    def start(self, warmup_steps: int) -> None:
        """Nothing planned: the watch closes a window every window_steps steps."""

    def window_end(self, k: int, own: bool) -> bool:
        """Whether step k ends a timed window: `own`, the watch's own rule."""
        return own

    def after_step(self, res: RunResult, k: int, boundary: bool, *, training_seconds: float, timed_seconds: float,
                   timed: bool) -> None:
        """No limit to check after a reader's step."""

    def must_stop(self, res: RunResult) -> bool:
        return False

    def check_pause(self, res: RunResult) -> None:
        """A reader's evaluation always runs."""

    def checkpoint(self, res: RunResult, steps: int, accuracy: float, training_seconds: float) -> bool:
        return True

    def describe_data(self, res: RunResult, data: dict[str, Any]) -> None:
        """The loader's dataset is the run's (fastlab.run's harness describes its data itself)."""
        res.dataset = data


@dataclass
class RunLimits(OwnLoop):
    """The harness's run: its timed windows and its stops. The fields are the harness's; `stopping` is why the loop
    must end ("interrupted", "time_limited", "diverged", "reached"), once it must."""

    steps: int  # timed optimiser steps after the warm-up
    windows: int  # split into this many timed windows (the last takes the remainder)
    max_seconds: float = 0.0
    stops: tuple[threading.Event, ...] = ()
    checkpoint_every: int = 0  # the training function evaluates every so many steps (time to accuracy)
    target_accuracy: float | None = None
    max_training_seconds: float | None = None
    agree: Callable[[bool], bool] | None = None  # data-parallel: every rank takes each stop decision together
    on_step: Callable[[int, int], None] | None = None  # on_step(steps done, total steps)
    sample_parts: bool = False  # time the copy, forward, backward and optimiser of warm-up steps 2.. (step_parts)
    evaluate_after_trap: bool = True  # False: a diverged or time-limited run skips its held-out evaluation
    result: RunResult | None = None  # the result to fill (the harness's: its config, label and environment stay)
    # a shared value (multiprocessing RawValue "d"; a ctypes.c_double for a run in this process) that
    # fastlab.isolation.Watchdog reads: the monotonic time the loop began waiting for a batch, negated inside a
    # paused block, 0.0 otherwise
    waiting: Any = None
    stopping: str | None = field(default=None, init=False)
    window_ends: dict[int, int] = field(default_factory=dict, init=False)  # step (1-based) -> steps in its window
    total: int = field(default=0, init=False)  # warm-up and timed steps
    harness: ClassVar[bool] = True

    def start(self, warmup_steps: int) -> None:
        """The watch's warm-up is known: where the timed windows end, and the steps in all."""
        self.window_ends = window_ends(warmup_steps, self.steps, self.windows)
        self.total = warmup_steps + self.steps

    def window_end(self, k: int, own: bool) -> bool:
        return k in self.window_ends

    def describe_data(self, res: RunResult, data: dict[str, Any]) -> None:
        pass

    def after_step(self, res: RunResult, k: int, boundary: bool, *, training_seconds: float, timed_seconds: float,
                   timed: bool) -> None:
        """After step k: the training-time limit (training_seconds: the steps' wall time so far), the
        time budget (timed_seconds: the timed steps' so far; a timed step past the warm-up, not the last), the
        caller's on_step."""
        limit = self.max_training_seconds
        if limit and training_seconds > limit and self.stopping is None:
            res.error = (f"stopped after {training_seconds:.0f} s of training without reaching the target (its "
                         f"budget: {limit:.0f} s)")
            res.stopped_by = "max_training_seconds"  # a trap limit (outcomes.TrapLimits)
            self.stopping = "time_limited"
        over = bool(self.max_seconds) and timed and k < self.total and timed_seconds > self.max_seconds
        if self.agree is not None:  # every rank stops at the same step, or the others wait in the next all-reduce
            over = boundary and k < self.total and self.agree(over)
        if over and self.stopping is None:
            res.stopped_by = "max_seconds"  # the harness's own budget: never a trap
            res.error = f"stopped at its max_seconds={self.max_seconds:g} budget after {k} steps"
            self.stopping = "time_limited"
        if self.on_step is not None:
            self.on_step(k, self.total)

    def must_stop(self, res: RunResult) -> bool:
        """Whether the loop must end before its next batch (res.status says why)."""
        if self.stopping is None and any(e.is_set() for e in self.stops):
            self.stopping = "interrupted"
        if self.stopping is None and res.status == "diverged":
            self.stopping = "diverged"
        if self.stopping in ("interrupted", "time_limited") and res.status in ("ok", "time_limited"):
            res.status = self.stopping
        return self.stopping is not None

    def check_pause(self, res: RunResult) -> None:
        """At a paused block's start: RunEnded where the run has ended in a way that skips its evaluation."""
        if res.status == "interrupted" or (not self.evaluate_after_trap and res.status in ("diverged", "time_limited")):
            raise RunEnded(res.status)

    def checkpoint(self, res: RunResult, steps: int, accuracy: float, training_seconds: float) -> bool:
        """A held-out accuracy after `steps` steps: on the time-to-accuracy curve where it is a checkpoint (and the
        loop stops once it reaches the target). Returns whether it is the run's accuracy (a checkpoint short of the
        target is not: the run's is its final evaluation's)."""
        every = self.checkpoint_every
        if not (every and steps % every == 0):
            return True
        res.tta_curve.append([training_seconds, steps, float(accuracy)])
        if self.target_accuracy is None or accuracy < self.target_accuracy:
            return False
        self.stopping = "reached"
        return True

    def finish(self, res: RunResult, window_seconds: list[float], losses: KeptLosses) -> RunResult:
        """The watch's end: the timed windows' seconds and the kept losses (read once, judged) go into the harness's
        result, whose config, environment and data description stay; the watch's own notes do not."""
        res.window_seconds = window_seconds
        losses.divergence.agree = None  # no all-reduce here: it would hang if another rank failed
        losses.read(res)
        res.extras.pop("watch", None)
        return res


@contextlib.contextmanager
def waiting_for(waiting: Any, paused: bool) -> Iterator[None]:
    """While the block runs, the loop is marked in the parent's shared value (RunLimits.waiting) as waiting for a
    batch (or, paused, inside a paused block: its held-out evaluation), so a hung loader is ended in a bounded time.
    Nothing without that value (a reader's own loop, a run in this process)."""
    if waiting is None:
        yield
        return
    waiting.value = -time.monotonic() if paused else time.monotonic()
    try:
        yield
    finally:
        waiting.value = 0.0
