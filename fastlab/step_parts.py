"""The parts of one training step, each timed on its own: the copy, the forward, the backward, the optimiser.

fastlab.run samples warm-up steps after the first this way (fastlab.pictures draws them): global forward and
optimiser step hooks, present only in those steps (never for a compiled model, which would compile again), mark
each part's ends with a synchronise, so a part's time is its own even on a GPU.

    copy      from the batch's arrival (the end of next()) to the model's call (x.to(device), channels_last)
    forward   the outermost module's call
    backward  from the forward's end to the next fetch or the optimiser's step (loss.backward())
    optimiser optimizer.step() (inside GradScaler.step with fp16)
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from .measure import synchronize
from .results import RunResult


class StepParts:
    """Times the parts of the steps between begin() and end(result) (see the module's text); begin() does nothing
    unless enabled."""

    def __init__(self, device: torch.device, enabled: bool) -> None:
        self.device = device
        self.enabled = enabled
        self._handles: list[Any] = []
        self._thread = 0
        self._depth = 0
        self._mark = self._begin = 0.0  # the last mark's time; begin()'s
        self._after = ""  # what ended at that mark: "fetch", "forward" or ""
        self.seconds: dict[str, float] = {}  # copy, forward, backward, optimizer_step
        self.until_optimizer_end = 0.0

    def begin(self) -> None:
        if not self.enabled:
            return
        self._thread = threading.get_ident()
        self.seconds = dict.fromkeys(("copy", "forward", "backward", "optimizer_step"), 0.0)
        self.until_optimizer_end = 0.0
        self._book(None)
        self._begin = self._mark
        self._handles = [register_module_forward_pre_hook(self._pre), register_module_forward_hook(self._post),
                         register_optimizer_step_pre_hook(self._opt_pre),
                         register_optimizer_step_post_hook(self._opt_post)]

    def end(self, res: RunResult) -> None:
        """Remove the hooks and add the step's parts to res (none when GradScaler skipped the optimiser step)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self.until_optimizer_end:
            res.sampled_step_seconds.append(self.until_optimizer_end)
            for part, seconds in self.seconds.items():
                getattr(res, f"{part}_seconds").append(seconds)

    @property
    def active(self) -> bool:
        return bool(self._handles)

    def _book(self, part: str | None, after: str = "") -> None:
        """Synchronise, book the time since the last mark to `part` (None: to no part), and mark now."""
        synchronize(self.device)
        t = time.perf_counter()
        if part is not None:
            self.seconds[part] += t - self._mark
        self._mark, self._after = t, after

    def _ours(self) -> bool:
        # backward's recomputation (checkpointing) runs forwards too: not a forward of the loop's
        return threading.get_ident() == self._thread and torch._C._current_graph_task_id() == -1

    def fetch_started(self) -> None:
        if self.active and self._after == "forward":
            self._book("backward")

    def fetch_ended(self) -> None:
        if self.active:
            self._book(None, "fetch")

    def _pre(self, module: torch.nn.Module, args: tuple) -> None:
        if self._ours():
            self._depth += 1
            if self._depth == 1:
                self._book("copy" if self._after == "fetch" else None)

    def _post(self, module: torch.nn.Module, args: tuple, output: Any) -> None:
        if self._ours():
            self._depth -= 1
            if self._depth == 0:
                self._book("forward", "forward")

    def _opt_pre(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        if threading.get_ident() == self._thread:
            self._book("backward" if self._after == "forward" else None)

    def _opt_post(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        if threading.get_ident() == self._thread:
            self._book("optimizer_step")
            self.until_optimizer_end = self._mark - self._begin
