"""The parts of one training step, each timed on its own: the copy, the forward, the backward, the optimiser.

fastlab.run's watch samples warm-up steps after the first this way (fastlab.pictures draws them): torch's global
forward hooks and optimiser step hooks mark where each part begins and ends, with a synchronise at each mark, so
a part's time is its own even on a GPU, where work is otherwise queued and overlaps. The hooks exist only during
the sampled steps. A compiled model is not sampled: hooks that come and go would make it compile again.

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


class StepParts:
    """Times the parts of the steps between begin() and end() (see the module's text)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._handles: list[Any] = []
        self._thread = 0
        self._depth = 0
        self._mark = 0.0  # the last event's time
        self._after = ""  # what that event was: "fetch", "forward" or ""
        self.copy = self.forward = self.backward = self.optimizer = 0.0
        self.until_optimizer_end = 0.0  # the step's sampled part: from begin() to the optimiser step's end
        self._begin = 0.0

    def _now(self) -> float:
        synchronize(self.device)
        return time.perf_counter()

    def begin(self) -> None:
        self._thread = threading.get_ident()
        self.copy = self.forward = self.backward = self.optimizer = self.until_optimizer_end = 0.0
        self._after = ""
        self._begin = self._mark = self._now()
        self._handles = [register_module_forward_pre_hook(self._pre), register_module_forward_hook(self._post),
                         register_optimizer_step_pre_hook(self._opt_pre),
                         register_optimizer_step_post_hook(self._opt_post)]

    def end(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    @property
    def active(self) -> bool:
        return bool(self._handles)

    def _ours(self) -> bool:
        # backward's recomputation (checkpointing) runs forwards too: not a forward of the loop's
        return threading.get_ident() == self._thread and torch._C._current_graph_task_id() == -1

    def fetch_started(self) -> None:
        if self.active and self._after == "forward":
            self.backward += self._now() - self._mark
            self._after = ""

    def fetch_ended(self) -> None:
        if self.active:
            self._mark, self._after = self._now(), "fetch"

    def _pre(self, module: torch.nn.Module, args: tuple) -> None:
        if not self._ours():
            return
        self._depth += 1
        if self._depth == 1:
            t = self._now()
            if self._after == "fetch":
                self.copy += t - self._mark
            self._mark, self._after = t, ""

    def _post(self, module: torch.nn.Module, args: tuple, output: Any) -> None:
        if not self._ours():
            return
        self._depth -= 1
        if self._depth == 0:
            t = self._now()
            self.forward += t - self._mark
            self._mark, self._after = t, "forward"

    def _opt_pre(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        if threading.get_ident() != self._thread:
            return
        t = self._now()
        if self._after == "forward":
            self.backward += t - self._mark
        self._mark, self._after = t, ""

    def _opt_post(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        if threading.get_ident() != self._thread:
            return
        t = self._now()
        self.optimizer += t - self._mark
        self.until_optimizer_end = t - self._begin
        self._mark = t
