"""What a watched loop's first step did: the facts an exercise's check reads to say whether a technique's line is
in the learner's loop (fastlab.exercise.TECHNIQUES), never its source text.

    with FirstStepFacts("cuda") as seen:   # fastlab.watch(facts=True) puts this around the first w.step
        ...one training step...
    seen.facts  # {"model": "ResNet", "autocast": "bfloat16", "input_layout": "channels_last", ...}

Recorded through torch's global module forward and optimiser step hooks during that one step only (no timed step
is hooked; a torch.compile'd model compiles again at the next step). saved_mb is the activations autograd saved for
backward, exact where a CPU's resident set hides them.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_pre_hook


def layout(x: Any) -> str | None:
    """A 4-D batch's memory layout: "contiguous" (NCHW), "channels_last" (NHWC) or "strided"; None otherwise."""
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        return None
    if x.is_contiguous():
        return "contiguous"
    return "channels_last" if x.is_contiguous(memory_format=torch.channels_last) else "strided"


class FirstStepFacts:
    """Hooks that record, in the thread that entered, what one training step did (see the module's text)."""

    def __init__(self, device_type: str) -> None:
        self.device_type = device_type
        self.facts: dict[str, Any] = {
            "model": None, "graph_module": False, "autocast": None, "input_layout": None, "weights_layout": None,
            "eval_forwards": 0, "eval_with_grad": 0, "recomputed": 0, "saved_mb": 0.0, "optimizer": None,
            "fused": None, "lr": None, "scheduled": False, "cudnn_benchmark": torch.backends.cudnn.benchmark}
        self._thread = threading.get_ident()
        self._depth = 0
        self._stack = contextlib.ExitStack()  # the hooks, the saved-tensor hooks and the warning filter
        self._saved: dict[int, StorageWeakRef] = {}  # storage address -> the storage saved there (each counted once)
        self._saved_bytes = 0
        self._params: set[int] = set()  # the model's own storages: saved weights are not activations

    def __enter__(self) -> FirstStepFacts:
        self._stack.enter_context(warnings.catch_warnings())
        # torch warns that a compiled module's hooks fire twice: ours count it once
        warnings.filterwarnings("ignore", message=r"Using `torch.compile\(module\)` when there are global hooks")
        for handle in (register_module_forward_pre_hook(self._pre),
                       register_module_forward_hook(self._post, always_call=True),
                       register_optimizer_step_pre_hook(self._optimizer_step)):
            self._stack.enter_context(handle)
        self._stack.enter_context(torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t))
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()
        self.facts["saved_mb"] = self._saved_bytes / 2**20
        self._saved.clear()

    def _ours(self) -> bool:
        """A call this step made: not inside a graph torch.compile is tracing (checked first: dynamo cannot trace
        get_ident), and in this thread."""
        return not torch.compiler.is_compiling() and threading.get_ident() == self._thread

    def _pre(self, module: torch.nn.Module, args: tuple) -> None:
        if not self._ours():
            return
        if torch._C._current_graph_task_id() != -1:  # a forward that backward runs: checkpointing's recomputation
            self.facts["recomputed"] += 1
            return
        self._depth += 1
        if self._depth > 1:  # a submodule: the outermost call says what the loop called
            return
        f = self.facts
        if not module.training:
            f["eval_forwards"] += 1
            f["eval_with_grad"] += torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
        if f["model"] is None:
            f["model"] = type(module).__name__
            f["graph_module"] = isinstance(module, torch.fx.GraphModule)
            if torch.is_autocast_enabled(self.device_type):
                f["autocast"] = str(torch.get_autocast_dtype(self.device_type)).removeprefix("torch.")
            f["input_layout"] = layout(next((a for a in args if isinstance(a, torch.Tensor)), None))
            f["weights_layout"] = layout(next((p for p in module.parameters() if p.dim() == 4), None))
        self._params |= {p.data_ptr() for p in module.parameters()}

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        # the outermost hooks: checkpoint's own (entered inside the step) take its segments' saves
        if t.layout == torch.strided and t.data_ptr() not in self._params:
            storage = t.untyped_storage()
            seen = self._saved.get(storage.data_ptr())
            if seen is None or seen.expired():  # a new storage (an address freed by backward may come back)
                self._saved[storage.data_ptr()] = StorageWeakRef(storage)
                self._saved_bytes += storage.nbytes()
        return t

    def _post(self, module: torch.nn.Module, args: tuple, output: Any) -> None:
        if self._ours() and torch._C._current_graph_task_id() == -1:
            self._depth -= 1

    def _optimizer_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        if not self._ours() or self.facts["optimizer"] is not None:
            return
        group = optimizer.param_groups[0]
        self.facts.update(optimizer=type(optimizer).__name__, fused=bool(group.get("fused")), lr=float(group["lr"]),
                          scheduled="initial_lr" in group)  # an LRScheduler sets initial_lr on its groups
