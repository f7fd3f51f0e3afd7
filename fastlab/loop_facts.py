"""What a watched loop's first step did: the facts an exercise's check reads to say whether a technique's line is
in the learner's loop (fastlab.exercise.TECHNIQUES), never its source text.

    with FirstStepFacts("cuda") as seen:   # fastlab.watch(facts=True) puts this around the first w.step
        ...one training step...
    seen.facts  # {"model": "ResNet", "autocast": "bfloat16", "input_layout": "channels_last", ...}

Recorded through torch's global module forward and optimiser step hooks during that one step only (no timed step
is hooked; a torch.compile'd model compiles again at the next step). saved_mb is the activations autograd saved for
backward, exact where a CPU's resident set hides them. A technique is read by its effect: autocast at any module
(not only the outermost), whether backward and the optimiser step ran inside it, whether the loss's gradient was
scaled (a GradScaler) and unscaled again before the step. From the first step's end to the loop's (LaterSteps),
each later step records what its optimiser steps used (the learning rate of each, to match a schedule against its
formula) and the module it calls first (its class, whether it is the first step's module, whether DDP synced it),
and hooks on the modules the first step called outermost place every evaluation forward (in a step, paused, or on
the clock between steps; with a graph or not) and tell whether each step's graph was released.
Checkpointing is read at every piece the step called (which ran again in backward, which kept its activations) and
by the gradients it should leave (a parameter of a module that ran, left without one).
"""

from __future__ import annotations

import contextlib
import math
import threading
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.multiprocessing.reductions import StorageWeakRef
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.overrides import TorchFunctionMode


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


def made_in(x: Any) -> str | None:
    """Where a batch's tensor was made, as its memory tells (exercise 01 reads it): "worker" (shared memory: a
    DataLoader worker process hands its batch over in it), "pinned" (page-locked: a DataLoader's pin_memory thread
    copied it), "device" (already off the CPU: where it was made cannot be read), "main" (ordinary memory: made in
    the loop's own process); None: not a tensor."""
    if not isinstance(x, torch.Tensor):
        return None
    if x.device.type != "cpu":
        return "device"
    if x.is_shared():
        return "worker"
    return "pinned" if x.is_pinned() else "main"



def ours(thread: int, also_in_backward: bool = False) -> bool:
    """Whether a hook's call is the loop's own: not inside a graph torch.compile is tracing (checked first: dynamo
    cannot trace get_ident), in the loop's `thread`, and (unless also_in_backward) not a forward that backward runs
    (checkpointing's recomputation)."""
    return (not torch.compiler.is_compiling() and threading.get_ident() == thread
            and (also_in_backward or torch._C._current_graph_task_id() == -1))

class BatchMaking(TorchFunctionMode):
    """Around the fetch of a loop's first batch (fastlab.loop_record.LoopRecord.fetching): the most tensors one
    torch.stack or torch.cat joined in this thread. A DataLoader's collate stacks a batch from one tensor per image;
    a batch indexed from tensors in memory joins none (exercise 09 reads it). A worker's collate is not seen here."""

    def __init__(self) -> None:
        super().__init__()
        self.stacked = 0

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func in (torch.stack, torch.cat) and args and isinstance(args[0], (list, tuple)):
            self.stacked = max(self.stacked, len(args[0]))
        return func(*args, **(kwargs or {}))

    def facts(self, first: torch.Tensor | None) -> dict[str, Any]:
        """What the fetch made, given the batch's first tensor: where it was made, its images, the most stacked."""
        return {"batch_from": made_in(first), "batch_stacked": self.stacked,
                "batch_images": int(first.shape[0]) if first is not None and first.dim() else None}


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
            "first_conv_input_nhwc": None, "input_from": None}
        self._thread = threading.get_ident()
        self._depth = 0
        self._stack = contextlib.ExitStack()  # the hooks, the saved-tensor hooks and the warning filter
        self._saved: dict[int, StorageWeakRef] = {}  # storage address -> the storage saved there (each counted once)
        self._saved_bytes = 0
        self._params: set[int] = set()  # the model's own storages: saved weights are not activations
        self._probe: list[Any] = []  # [a parameter, its gradient's largest magnitude when backward left it]
        # exercises 07 and 11: what served each step (outermost_facts, LaterSteps) and the process group's work
        self.facts.update(exported_batch=None, train_mode_ops=0, group=None, ddp_sync=None,
                          backward_collectives=None, later_models=[], later_same_model=0, later_unsynced=0)
        self.model_ref: weakref.ReferenceType | None = None  # the first step's outermost module
        self._collectives_at_backward: int | None = None
        # exercises 05, 10 and 12: the evaluations and each step's graph (LaterSteps carries them on), the pieces
        # the step called outermost in training (blocks, head) and which of them backward ran again, the parameters
        # of the modules that ran left without a gradient
        self.facts.update(eval_in_step=0, eval_paused=0, graphs_checked=0, graphs_held=0, pieces=[],
                          pieces_recomputed=[], pieces_saved=[], pieces_no_grad=[], params=None,
                          params_without_grad=None)
        self.outermost: dict[int, torch.nn.Module] = {}  # every module the step called outermost (LaterSteps)
        self.graph: weakref.ReferenceType | None = None  # dies with the step's training graph (mark_graph)
        self._pieces: list[torch.nn.Module] = []
        self._piece: int | None = None  # the piece running now: the activations saved now are its
        self._piece_leaf = False  # it has no submodules
        self._piece_bytes: list[int] = []
        self._recomputed: set[int] = set()  # the modules backward ran again
        self._ran: set[int] = set()  # the parameters of the modules a training forward ran
        self._evaluating = False  # the outermost forward running now trains nothing (evaluating)

    def __enter__(self) -> FirstStepFacts:
        self._stack.enter_context(warnings.catch_warnings())
        # torch warns that a compiled module's hooks fire twice: ours count it once
        warnings.filterwarnings("ignore", message=r"Using `torch.compile\(module\)` when there are global hooks")
        for handle in (register_module_forward_pre_hook(self._pre),
                       register_module_forward_hook(self._post, always_call=True),
                       register_optimizer_step_pre_hook(self._optimizer_step)):
            self._stack.enter_context(handle)
        self._stack.enter_context(torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t))
        self.facts["group"] = process_group()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()
        self.facts["saved_mb"] = self._saved_bytes / 2**20
        self._saved.clear()
        # a piece ran again when any module in it did (a wrapper whose forward checkpoints its inner block)
        self.facts.update(pieces_recomputed=[any(id(m) in self._recomputed for m in p.modules()) for p in self._pieces],
                          pieces_saved=[n > 0 for n in self._piece_bytes])
        self._pieces.clear()

    def _pre(self, module: torch.nn.Module, args: tuple) -> None:
        if torch.compiler.is_compiling():
            return
        if torch._C._current_graph_task_id() != -1:  # a forward that backward runs: checkpointing's recomputation,
            self.facts["recomputed"] += 1  # in any thread (a GPU's backward runs in autograd's own thread)
            self._recomputed.add(id(module))
            return
        if not ours(self._thread, also_in_backward=True):
            return
        self._depth += 1
        f = self.facts
        if module.training and f["autocast"] is None and torch.is_autocast_enabled(self.device_type):
            # at any module: autocast entered inside the model (a wrapped forward) counts too
            f["autocast"] = str(torch.get_autocast_dtype(self.device_type)).removeprefix("torch.")
        if module.training and isinstance(module, torch.nn.Conv2d):
            self._convolution(module, args)
        if module.training:
            self._ran |= {id(p) for p in module.parameters(recurse=False)}
        if self._depth > 1:  # a submodule: the outermost call says what the loop called
            return
        self._outermost(module)
        if f["model"] is None:
            f["model"] = type(module).__name__
            f["graph_module"] = isinstance(module, torch.fx.GraphModule)
            f["input_layout"] = layout(next((a for a in args if isinstance(a, torch.Tensor)), None))
            f["input_from"] = made_in(next((a for a in args if isinstance(a, torch.Tensor)), None))  # (made_in)
            f["weights_layout"] = layout(next((p for p in module.parameters() if p.dim() == 4), None))
            f.update(outermost_facts(module))
            self.model_ref = weakref.ref(module)  # later steps tell this module from a new one (LaterSteps)
        if module.training and torch.is_grad_enabled() and not self._probe:
            self._watch_gradients(module)
        self._params |= {p.data_ptr() for p in module.parameters()}

    def _outermost(self, module: torch.nn.Module) -> None:
        """A forward the loop called itself: an evaluation (it trains nothing: `evaluating`), or, in training mode, a
        piece of the training forward (the model, or a block or the head of a loop over blocks), whose saves are its
        own until it returns (a reentrant checkpoint runs its piece without grad, so it is both)."""
        f = self.facts
        self.outermost.setdefault(id(module), module)
        self._evaluating = evaluating(module)
        f["eval_forwards"] += self._evaluating
        f["eval_in_step"] += self._evaluating
        if module.training:
            self._piece, self._piece_leaf = len(self._pieces), next(module.children(), None) is None
            self._pieces.append(module)
            self._piece_bytes.append(0)
            f["pieces"].append(type(module).__name__)
            f["pieces_no_grad"].append(not torch.is_grad_enabled())

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
                if self._piece is not None and (self._depth > 1 or self._piece_leaf):  # (a piece of modules: theirs,
                    self._piece_bytes[self._piece] += storage.nbytes()  # not a checkpoint's inputs it saves itself)
        return t

    def _post(self, module: torch.nn.Module, args: tuple, output: Any) -> None:
        if not ours(self._thread):
            return
        self._depth -= 1
        f = self.facts
        if (self._depth == 0 and module.training and f["output_grad_max"] is None
                and isinstance(output, torch.Tensor) and output.requires_grad):
            output.register_hook(self._output_grad)
        if self._depth == 0:
            self._piece = None
            if self._evaluating:
                f["eval_with_grad"] += records_graph(output)  # by its output: detached after the forward counts
            elif self.graph is None:
                self.graph = mark_graph(output)

    def _output_grad(self, grad: torch.Tensor) -> None:
        """Backward reaching the model's output: whether it runs inside autocast, and the gradient's size (a
        cross-entropy's is at most 1 an element; a GradScaler multiplies it by its scale, 65536 at first)."""
        self.facts.update(backward_autocast=torch.is_autocast_enabled(self.device_type),
                          output_grad_max=float(grad.detach().abs().max()))
        self._collectives_at_backward = collectives()  # DDP all-reduces the gradients from here to the step

    def _optimizer_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        if not ours(self._thread, also_in_backward=True):
            return
        first = self.facts["optimizer"] is None
        if first:  # the parameters of the modules that ran: each should have a gradient (none lost to a checkpoint)
            ran = [p for g in optimizer.param_groups for p in g["params"] if id(p) in self._ran]
            self.facts.update(params=len(ran), params_without_grad=sum(p.grad is None for p in ran))
        optimizer_step(self.facts, optimizer, self.device_type)
        param, at_backward = self._probe or (None, None)
        if first and param is not None and at_backward and param.grad is not None:
            now = float(param.grad.detach().abs().max())
            self.facts["unscaled_by"] = at_backward / now if now else math.inf
        if first and self._collectives_at_backward is not None and (done := collectives()) is not None:
            self.facts["backward_collectives"] = done - self._collectives_at_backward


def optimizer_step(facts: dict[str, Any], optimizer: torch.optim.Optimizer, device_type: str) -> None:
    """Record an optimiser step about to run: its learning rate (each step's, in facts["lrs"]); for the first, the
    optimiser, its settings (fused: in every parameter group) and whether it runs inside autocast."""
    group = optimizer.param_groups[0]
    facts["lrs"].append(float(group["lr"]))
    if facts["optimizer"] is None:
        fused = all(g.get("fused") for g in optimizer.param_groups)  # each group steps fused or not by its own flag
        facts.update(optimizer=type(optimizer).__name__, fused=fused, lr=float(group["lr"]),
                     weight_decay=float(group.get("weight_decay", 0.0)),
                     scheduled="initial_lr" in group,  # an LRScheduler sets initial_lr on its groups
                     step_autocast=torch.is_autocast_enabled(device_type))


TRAIN_FLAG = {torch.ops.aten.batch_norm.default: 5, torch.ops.aten.dropout.default: 2,  # the argument that says
              torch.ops.aten._native_batch_norm_legit_functional.default: 5}  # the op runs in training mode


def outermost_facts(module: torch.nn.Module) -> dict[str, Any]:
    """What the module a step calls first fixes about the technique around it. An exported program (torch.export's
    GraphModule, exercise 07): its first input's batch dimension ("dynamic", or the one size it accepts; None where
    its graph carries no shapes, so not an exported program) and its ops that run in training mode (batch norms and
    dropouts exported before model.eval()). A DistributedDataParallel (exercise 11): whether this forward readies
    backward's gradient all-reduce (grad enabled, not under model.no_sync())."""
    if isinstance(module, torch.fx.GraphModule):
        first = next(iter(module.graph.find_nodes(op="placeholder")), None)
        val = first.meta.get("val") if first is not None else None
        batch = val.shape[0] if isinstance(val, torch.Tensor) and val.dim() else None
        train = sum(bool(n.args[i]) for n in module.graph.nodes
                    if (i := TRAIN_FLAG.get(n.target)) is not None and len(n.args) > i)
        return {"exported_batch": batch if batch is None or isinstance(batch, int) else "dynamic",
                "train_mode_ops": train}
    if hasattr(module, "require_backward_grad_sync"):
        return {"ddp_sync": bool(module.require_backward_grad_sync) and torch.is_grad_enabled()}
    return {}


def process_group() -> str | None:
    """The default process group, in words ("gloo, 1 process"); None where none was started."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    n = dist.get_world_size()
    return f"{dist.get_backend()}, {n} process{'es' if n != 1 else ''}"


def collectives() -> int | None:
    """The collectives the default process group has run so far (its sequence number: one more for each all-reduce
    or broadcast, a gloo or NCCL group alike); None without a group, or where its backend keeps no count."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    try:
        return int(dist.distributed_c10d._get_default_group()._get_sequence_number_for_group())
    except (AttributeError, RuntimeError):
        return None


def evaluating(module: torch.nn.Module) -> bool:
    """Whether a forward trains nothing: its module in eval mode, or run without grad (no_grad, inference_mode)."""
    return not module.training or not torch.is_grad_enabled()


def records_graph(output: Any) -> bool:
    """Whether a forward's output (a tensor, or a tuple, list or dict of them) heads a graph for backward."""
    items = output.values() if isinstance(output, dict) else output if isinstance(output, (tuple, list)) else (output,)
    return any(isinstance(t, torch.Tensor) and t.requires_grad for t in items)


class _GraphMark:
    """Hung on a training output's autograd node as a backward pre-hook that does nothing: it lives as long as the
    node does, so a weak reference to it tells whether that step's graph is still held."""

    def __call__(self, *grads: Any) -> None:
        return None


def mark_graph(output: Any) -> weakref.ReferenceType | None:
    """A weak reference that dies with the graph `output` heads (None: it heads none). A graph alive two steps after
    its own is held by something of the loop's: a running total or a list that keeps `loss` keeps every step's."""
    node = output.grad_fn if isinstance(output, torch.Tensor) else None
    if node is None:
        return None
    mark = _GraphMark()
    try:
        node.register_prehook(mark)
    except (AttributeError, RuntimeError):  # a node that takes no hooks: its step's graph is not looked at
        return None
    return weakref.ref(mark)


class LaterSteps:
    """From the end of the first step to the end of the loop, what the later steps did, into the first step's facts.
    Around each step (step): its optimiser steps (optimizer_step: each one's learning rate, to match a schedule
    against its formula), and, where the first step's outermost module was seen (`first`), the module the step calls
    first: its class, whether it is that same module (an exported program built once, not per request) and whether a
    DistributedDataParallel ran it with its gradient sync off (model.no_sync()); that global hook removes itself at
    its first call, before the module runs. Throughout (exercises 05 and 10): hooks on the modules the first step
    called outermost (the model, or a loop's blocks), not global ones, so a compiled model elsewhere is not touched
    and each forward costs two calls. Each evaluation forward (`evaluating`, or any forward outside a step) is counted
    where it ran, inside a step, inside a `with w.paused()` block (off the clock) or between the steps on the clock,
    and whether it recorded a graph; each step's training graph is marked (mark_graph) and looked at two steps
    later: released, or still held."""

    def __init__(self, first_step: FirstStepFacts) -> None:
        self.facts, self.device_type, self.first = first_step.facts, first_step.device_type, first_step.model_ref
        self.paused = False  # inside a `with w.paused()` block (fastlab.loop_record.LoopRecord.pausing)
        self._in_step, self._step, self._depth, self._evaluating = False, 0, 0, False
        self._thread = threading.get_ident()
        self._graphs: dict[int, weakref.ReferenceType] = {} if first_step.graph is None else {0: first_step.graph}
        self._called: Any = None
        self._handles: list[Any] = []
        for m in first_step.outermost.values():
            with contextlib.suppress(RuntimeError):  # a module that takes no hooks (a scripted one) is not seen
                self._handles += [m.register_forward_pre_hook(self._pre),
                                  m.register_forward_hook(self._post, always_call=True)]

    @contextlib.contextmanager
    def step(self, k: int) -> Iterator[None]:
        """Around the step after `k` steps; at its end, the graph of the step two before: released or held."""
        self._in_step, self._step = True, k
        with contextlib.ExitStack() as hooks:
            hooks.enter_context(register_optimizer_step_pre_hook(self._optimizer_step))
            if self.first is not None:
                self._called = hooks.enter_context(register_module_forward_pre_hook(self._first_module))
            try:
                yield
            finally:
                self._in_step = False
                if (mark := self._graphs.pop(k - 2, None)) is not None:
                    self.facts["graphs_checked"] += 1
                    self.facts["graphs_held"] += mark() is not None

    def close(self) -> None:
        """The hooks off (the watch's result)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _optimizer_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        if ours(self._thread, also_in_backward=True):
            optimizer_step(self.facts, optimizer, self.device_type)

    def _first_module(self, module: torch.nn.Module, args: tuple) -> None:
        if not ours(self._thread):
            return
        self._called.remove()
        f = self.facts
        f["later_models"].append(type(module).__name__)
        f["later_same_model"] += module is self.first()
        f["later_unsynced"] += getattr(module, "require_backward_grad_sync", True) is False

    def _pre(self, module: torch.nn.Module, args: tuple) -> None:
        if ours(self._thread):
            self._depth += 1
            if self._depth == 1:
                self._evaluating = evaluating(module) or not self._in_step

    def _post(self, module: torch.nn.Module, args: tuple, output: Any) -> None:
        if not ours(self._thread):
            return
        self._depth = max(0, self._depth - 1)
        if self._depth:
            return
        f = self.facts
        if self._evaluating:
            f["eval_forwards"] += 1
            f["eval_with_grad"] += records_graph(output)
            f["eval_paused"] += self.paused
            f["eval_in_step"] += self._in_step and not self.paused
        elif self._step not in self._graphs and (mark := mark_graph(output)) is not None:
            self._graphs[self._step] = mark
