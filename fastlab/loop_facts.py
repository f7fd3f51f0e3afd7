"""What a watched loop's first step did: the facts an exercise's check reads to say whether a technique's line is
in the learner's loop (fastlab.exercise.TECHNIQUES), never its source text.

    with FirstStepFacts("cuda") as seen:   # fastlab.watch(facts=True) puts this around the first w.step
        ...one training step...
    seen.facts  # {"model": "ResNet", "autocast": "bfloat16", "input_layout": "channels_last", ...}

Recorded through torch's global module forward and optimiser step hooks during that one step only (no timed step
is hooked; a torch.compile'd model compiles again at the next step). saved_mb is the activations autograd saved for
backward, exact where a CPU's resident set hides them. A technique is read by its effect: autocast at any module
(not only the outermost), whether backward and the optimiser step ran inside it, whether the loss's gradient was
scaled (a GradScaler) and unscaled again before the step. The later steps record only what their optimiser steps
used (StepRates: the learning rate of each step, to match a schedule against its formula).
"""

from __future__ import annotations

import contextlib
import math
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


def nhwc(x: torch.Tensor) -> bool:
    """Whether a 4-D tensor is laid out channels_last (NHWC), as a convolution reads it: a tensor whose layouts agree
    (a 1x1 weight, one image of 1x1) is both."""
    return x.is_contiguous(memory_format=torch.channels_last)


class FirstStepFacts:
    """Hooks that record, in the thread that entered, what one training step did (see the module's text)."""

    def __init__(self, device_type: str) -> None:
        self.device_type = device_type
        self.facts: dict[str, Any] = {
            "model": None, "graph_module": False, "autocast": None, "input_layout": None, "weights_layout": None,
            "eval_forwards": 0, "eval_with_grad": 0, "recomputed": 0, "saved_mb": 0.0, "optimizer": None,
            "fused": None, "lr": None, "scheduled": False, "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "weight_decay": None, "lrs": [], "backward_autocast": None, "step_autocast": None,
            "output_grad_max": None, "unscaled_by": None, "convs": 0, "convs_input_nhwc": 0, "convs_weights_nhwc": 0,
            "first_conv_input_nhwc": None}
        self._thread = threading.get_ident()
        self._depth = 0
        self._stack = contextlib.ExitStack()  # the hooks, the saved-tensor hooks and the warning filter
        self._saved: dict[int, StorageWeakRef] = {}  # storage address -> the storage saved there (each counted once)
        self._saved_bytes = 0
        self._params: set[int] = set()  # the model's own storages: saved weights are not activations
        self._probe: list[Any] = []  # [a parameter, its gradient's largest magnitude when backward left it]

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
        f = self.facts
        if module.training and f["autocast"] is None and torch.is_autocast_enabled(self.device_type):
            # at any module: autocast entered inside the model (a wrapped forward) counts too
            f["autocast"] = str(torch.get_autocast_dtype(self.device_type)).removeprefix("torch.")
        if module.training and isinstance(module, torch.nn.Conv2d):
            self._convolution(module, args)
        if self._depth > 1:  # a submodule: the outermost call says what the loop called
            return
        if not module.training:
            f["eval_forwards"] += 1
            f["eval_with_grad"] += torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
        if f["model"] is None:
            f["model"] = type(module).__name__
            f["graph_module"] = isinstance(module, torch.fx.GraphModule)
            f["input_layout"] = layout(next((a for a in args if isinstance(a, torch.Tensor)), None))
            f["weights_layout"] = layout(next((p for p in module.parameters() if p.dim() == 4), None))
        if module.training and torch.is_grad_enabled() and not self._probe:
            self._watch_gradients(module)
        self._params |= {p.data_ptr() for p in module.parameters()}

    def _convolution(self, conv: torch.nn.Conv2d, args: tuple) -> None:
        """The memory format of what reaches each convolution (at any depth): its input and its weights."""
        x, f = next((a for a in args if isinstance(a, torch.Tensor)), None), self.facts
        if x is None or x.dim() != 4:
            return
        f["convs"] += 1
        f["convs_input_nhwc"] += nhwc(x)
        f["convs_weights_nhwc"] += nhwc(conv.weight)
        if f["first_conv_input_nhwc"] is None:
            f["first_conv_input_nhwc"] = nhwc(x)

    def _watch_gradients(self, module: torch.nn.Module) -> None:
        """Read one parameter's gradient as backward leaves it, to tell at the optimiser step whether it was
        unscaled (a GradScaler's scaler.step) or not."""
        param = next((p for p in module.parameters() if p.requires_grad), None)
        if param is None:
            return
        self._probe[:] = [param, None]

        def accumulated(p: torch.Tensor) -> None:
            self._probe[1] = float(p.grad.detach().abs().max())

        self._stack.callback(param.register_post_accumulate_grad_hook(accumulated).remove)

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
        if not self._ours() or torch._C._current_graph_task_id() != -1:
            return
        self._depth -= 1
        f = self.facts
        if (self._depth == 0 and module.training and f["output_grad_max"] is None
                and isinstance(output, torch.Tensor) and output.requires_grad):
            output.register_hook(self._output_grad)

    def _output_grad(self, grad: torch.Tensor) -> None:
        """Backward reaching the model's output: whether it runs inside autocast, and the gradient's size (a
        cross-entropy's is at most 1 an element; a GradScaler multiplies it by its scale, 65536 at first)."""
        self.facts.update(backward_autocast=torch.is_autocast_enabled(self.device_type),
                          output_grad_max=float(grad.detach().abs().max()))

    def _optimizer_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        if not self._ours():
            return
        first = self.facts["optimizer"] is None
        optimizer_step(self.facts, optimizer, self.device_type)
        param, at_backward = self._probe or (None, None)
        if first and param is not None and at_backward and param.grad is not None:
            now = float(param.grad.detach().abs().max())
            self.facts["unscaled_by"] = at_backward / now if now else math.inf


def optimizer_step(facts: dict[str, Any], optimizer: torch.optim.Optimizer, device_type: str) -> None:
    """Record an optimiser step about to run: its learning rate (each step's, in facts["lrs"]); for the first, the
    optimiser, its settings and whether it runs inside autocast."""
    group = optimizer.param_groups[0]
    facts["lrs"].append(float(group["lr"]))
    if facts["optimizer"] is None:
        facts.update(optimizer=type(optimizer).__name__, fused=bool(group.get("fused")), lr=float(group["lr"]),
                     weight_decay=float(group.get("weight_decay", 0.0)),
                     scheduled="initial_lr" in group,  # an LRScheduler sets initial_lr on its groups
                     step_autocast=torch.is_autocast_enabled(device_type))


class StepRates:
    """Around a step after the first: records each optimiser step it takes (optimizer_step) into the first step's
    facts, in the thread that entered."""

    def __init__(self, facts: dict[str, Any], device_type: str) -> None:
        self.facts, self.device_type = facts, device_type
        self._thread = threading.get_ident()
        self._handle: Any = None

    def __enter__(self) -> StepRates:
        self._handle = register_optimizer_step_pre_hook(self._step)
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.remove()

    def _step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        if not torch.compiler.is_compiling() and threading.get_ident() == self._thread:
            optimizer_step(self.facts, optimizer, self.device_type)
