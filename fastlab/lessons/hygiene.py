"""Notebook 05: evaluation without autograd, `total_loss += loss` vs `.item()`, `.item()` as a sync, detach().

The training-loop comparisons use TrainConfig.eval_mode, log_loss and log_every. The detach demo is
self-contained: it counts the tensors autograd saves for backward (through saved_tensors_hooks) and how
many of them are still alive after a loop that keeps `loss`, `loss.detach()` or `loss.item()`. Those
counts come from tensor shapes, not from a clock or the process's memory, so they are exact.
"""

from __future__ import annotations

import gc
import weakref
from dataclasses import dataclass

import torch
from torch import nn

from ..comparisons import comparison
from ..config import TrainConfig
from ..measure import Spread, is_noise, verdict
from ..models import build_model
from ..plots import data_note  # the same "SYNTHETIC data on <device>" note as every fastlab plot
from ..results import RunResult
from ..train import run, sweep

EVAL_MODES = ("autograd", "no_grad", "inference_mode")
# Repeats of each evaluation mode: one evaluation is one number, so the spread comes from repeating it.
EVAL_REPEATS = {"smoke": 2, "cpu": 3, "gpu": 3}
LOG_EVERY = (1, 10)
KEEP_CHOICES = ("loss", "detach", "item")


def eval_config(base: TrainConfig) -> TrainConfig:
    """base with training cut to one step: the evaluation after it is what this comparison measures."""
    return base.replace(steps=1, warmup_steps=0, windows=1)


@comparison("05_no_grad_detach_item:eval_mode")
def eval_modes(base: TrainConfig, progress: bool = True) -> list[RunResult]:
    """Each eval_mode, repeated (interleaved, so a slow spell of the machine hits every mode alike)."""
    cfg = eval_config(base)
    results = []
    for i in range(EVAL_REPEATS.get(base.profile, 3)):
        for mode in EVAL_MODES:
            r = run(cfg.replace(eval_mode=mode), label=f"eval_mode={mode}", progress=progress)
            r.extras["repeat"] = i
            results.append(r)
            if r.status == "interrupted":
                return results
    return results


def eval_growth_mb(result: RunResult) -> float:
    """How far memory rose during evaluation above where training left it: eval peak - last training sample."""
    if result.eval_peak_memory_mb is None or not result.memory_trace_mb:
        return float("nan")
    return result.eval_peak_memory_mb - result.memory_trace_mb[-1]


@dataclass(frozen=True)
class EvalSummary:
    mode: str
    speed: Spread  # held-out images per second of evaluation (eval_images / eval_seconds), over repeats
    growth_mb: Spread  # eval_growth_mb over repeats
    peak_mb: Spread  # eval_peak_memory_mb over repeats


def summarize_eval(results: list[RunResult]) -> list[EvalSummary]:
    """Per eval_mode (in order of first appearance), the spread over its repeats."""
    modes = list(dict.fromkeys(r.config["eval_mode"] for r in results))
    out = []
    for mode in modes:
        rs = [r for r in results if r.config["eval_mode"] == mode and r.eval_seconds]
        out.append(EvalSummary(mode, Spread.of([r.dataset["eval_images"] / r.eval_seconds for r in rs]),
                               Spread.of([eval_growth_mb(r) for r in rs]),
                               Spread.of([r.eval_peak_memory_mb for r in rs])))
    return out


def describe_eval(results: list[RunResult]) -> str:
    """Evaluation speed and memory per mode, each against autograd (the pitfall), noise called as noise."""
    rows = summarize_eval(results)
    base = next((s for s in rows if s.mode == "autograd"), rows[0] if rows else None)
    lines = []
    for s in rows:
        line = (f"{s.mode}: {s.speed.median:,.0f} eval images/s (min {s.speed.low:,.0f}, max {s.speed.high:,.0f}, "
                f"{s.speed.n} repeats); memory rose {s.growth_mb.median:,.1f} MiB during evaluation "
                f"(min {s.growth_mb.low:,.1f}, max {s.growth_mb.high:,.1f})")
        if base is not None and s is not base:
            mem = "noise" if is_noise(base.growth_mb, s.growth_mb) else \
                f"{s.growth_mb.median - base.growth_mb.median:+,.1f} MiB"
            line += f"\n    against autograd: speed {verdict(base.speed, s.speed, 'eval images/s')}; memory rise {mem}"
        lines.append(line)
    return "\n".join(lines)


def plot_eval(results: list[RunResult]):
    """Evaluation speed (median, min-max over repeats) and memory rise during evaluation, per eval_mode."""
    from ..plots import ShownFigure as Figure

    rows = summarize_eval(results)
    fig = Figure(figsize=(10, 3.6))
    ax_s, ax_m = fig.subplots(1, 2)
    x = range(len(rows))
    for ax, key, ylabel in ((ax_s, "speed", "held-out images/s (median, min-max)"),
                            (ax_m, "growth_mb", "MiB above end of training (median, min-max)")):
        spreads = [getattr(s, key) for s in rows]
        ax.bar(x, [s.median for s in spreads], yerr=[[s.median - s.low for s in spreads],
                                                    [s.high - s.median for s in spreads]], capsize=4,
               color=["tab:red" if s.mode == "autograd" else "tab:blue" for s in rows])
        ax.set_xticks(list(x))
        ax.set_xticklabels([s.mode for s in rows])
        ax.set_ylabel(ylabel, fontsize=8)
    ax_s.set_title("evaluation speed")
    ax_m.set_title("memory rise during evaluation")
    fig.suptitle(f"evaluation with and without autograd - {data_note(results)}", fontsize=10)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ total_loss += loss vs loss.item()


@comparison("05_no_grad_detach_item:log_loss")
def log_loss(base: TrainConfig, progress: bool = True) -> list[RunResult]:
    """log_loss="item" (the loss as a Python float) against "tensor" (every step's loss tensor kept)."""
    return sweep("log_loss", ["item", "tensor"], base, progress=progress)


def memory_growth_mb(result: RunResult) -> float:
    """Memory after the last step minus memory after the first step (MiB)."""
    trace = result.memory_trace_mb
    return trace[-1] - trace[0] if len(trace) > 1 else float("nan")


def step_jitter_mb(result: RunResult) -> float:
    """The largest step-to-step change of memory: how much the trace moves without any trend."""
    trace = result.memory_trace_mb
    return max((abs(b - a) for a, b in zip(trace, trace[1:])), default=0.0)


def describe_log_loss(results: list[RunResult]) -> str:
    """Memory growth over the run of each log_loss mode; a difference within the item run's jitter is noise."""
    by_mode = {r.config["log_loss"]: r for r in results}
    lines = []
    for mode, r in by_mode.items():
        kept = r.extras.get("kept_loss_tensors", 0)
        lines.append(f"log_loss={mode}: memory ({r.memory_kind.replace('_', ' ')}) changed "
                     f"{memory_growth_mb(r):+,.2f} MiB over {len(r.memory_trace_mb)} steps; loss tensors kept: {kept}")
    if {"item", "tensor"} <= by_mode.keys():
        item, tensor = by_mode["item"], by_mode["tensor"]
        diff = memory_growth_mb(tensor) - memory_growth_mb(item)
        band = max(step_jitter_mb(item), step_jitter_mb(tensor))
        word = "noise: inside the step-to-step jitter" if abs(diff) <= band else "more than the step-to-step jitter"
        lines.append(f"difference in growth: {diff:+,.2f} MiB ({word} of {band:,.2f} MiB)")
    return "\n".join(lines)


# ------------------------------------------------------------------ .item() every step vs every 10


@comparison("05_no_grad_detach_item:log_every")
def log_every(base: TrainConfig, progress: bool = True) -> list[RunResult]:
    """Reading the loss (.item(), a host-device sync on a GPU) every step against every 10th step."""
    return sweep("log_every", list(LOG_EVERY), base, progress=progress)


# ------------------------------------------------------------------ detach(): what a kept loss keeps alive


@dataclass(frozen=True)
class GraphMemory:
    keep: str  # what the loop kept each step: "loss", "detach" (loss.detach()) or "item" (loss.item())
    backward: bool  # whether each step called loss.backward()
    steps: int
    saved_tensors: int  # activations autograd saved for backward that are still alive after the loop
    saved_mb: float  # their size (unique storages, parameters excluded: those live anyway)
    graph_nodes: int  # autograd graph nodes still reachable from what was kept


class _Saved:
    """What the graph holds for each saved tensor; a weak reference to it tells whether the graph still lives.

    It keeps a detached alias: keeping the tensor itself would tie it to its own grad_fn in a cycle
    that Python's garbage collector cannot see through.
    """

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor.detach()


def _count_nodes(kept: list) -> int:
    seen: set[int] = set()
    stack = [t.grad_fn for t in kept if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        stack.extend(fn for fn, _ in node.next_functions)
    return len(seen)


def kept_graph_memory(keep: str, steps: int = 8, backward: bool = False, batch_size: int = 32,
                      model: str = "tiny", seed: int = 0) -> GraphMemory:
    """Run `steps` forward passes (with backward() if asked), keeping each step's loss as `keep` says,
    then count what autograd still holds. Inputs are random tensors (no dataset needed)."""
    if keep not in KEEP_CHOICES:
        raise ValueError(f"kept_graph_memory: keep={keep!r} is not allowed: choose one of "
                         f"{', '.join(map(repr, KEEP_CHOICES))}")
    for name, value in (("steps", steps), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"kept_graph_memory: {name}={value!r} is not allowed: an integer >= 1")
    torch.manual_seed(seed)
    net = build_model(model)
    params = {p.data_ptr() for p in net.parameters()}
    x = torch.randn(batch_size, 3, 32, 32)
    y = torch.randint(0, 10, (batch_size,))
    saved: list[tuple[weakref.ref, int, int]] = []  # (ref to the holder, storage pointer, storage bytes)

    def pack(t: torch.Tensor) -> _Saved:
        holder = _Saved(t)
        storage = t.untyped_storage()
        saved.append((weakref.ref(holder), storage.data_ptr(), storage.nbytes()))
        return holder

    kept: list = []
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda h: h.tensor):
        for _ in range(steps):
            loss = nn.functional.cross_entropy(net(x), y)
            if backward:
                loss.backward()
                net.zero_grad(set_to_none=True)
            kept.append({"loss": loss, "detach": loss.detach(), "item": loss.item()}[keep])
    del loss  # the loop variable would otherwise keep the last step's graph alive
    gc.collect()
    alive = {ptr: nbytes for ref, ptr, nbytes in saved if ref() is not None and ptr not in params}
    count = sum(1 for ref, ptr, _ in saved if ref() is not None and ptr not in params)
    return GraphMemory(keep, backward, steps, count, sum(alive.values()) / 2**20, _count_nodes(kept))


def graph_memory_table(steps: int = 8, batch_size: int = 32) -> list[GraphMemory]:
    """kept_graph_memory for every keep choice, without and with backward()."""
    return [kept_graph_memory(keep, steps, backward, batch_size) for backward in (False, True) for keep in KEEP_CHOICES]


def describe_graph_memory(rows: list[GraphMemory]) -> str:
    lines = []
    for g in rows:
        loop = "forward + backward" if g.backward else "forward only (like evaluation without no_grad)"
        lines.append(f"{loop:<48} keep {g.keep:<6}: {g.saved_tensors:4d} saved activations alive "
                     f"({g.saved_mb:7.2f} MiB), {g.graph_nodes:4d} graph nodes reachable after {g.steps} steps")
    return "\n".join(lines)


def growth_with_steps(steps_list: tuple[int, ...] = (1, 2, 4, 8), keep: str = "loss",
                      batch_size: int = 32) -> list[GraphMemory]:
    """kept_graph_memory without backward for a growing number of steps: the leak grows with every step."""
    return [kept_graph_memory(keep, s, False, batch_size) for s in steps_list]


def plot_graph_growth(rows_by_keep: dict[str, list[GraphMemory]]):
    """Saved-activation MiB alive against steps, one line per keep choice (random inputs, not a dataset)."""
    from ..plots import ShownFigure as Figure

    fig = Figure(figsize=(6, 3.6))
    ax = fig.subplots()
    for keep, rows in rows_by_keep.items():
        ax.plot([g.steps for g in rows], [g.saved_mb for g in rows], marker="o", label=f"keep {keep}")
    ax.set_xlabel("forward passes (no backward)")
    ax.set_ylabel("MiB of saved activations alive")
    ax.set_title("what a kept loss keeps alive (tiny net, random inputs; counted, not timed)", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig

