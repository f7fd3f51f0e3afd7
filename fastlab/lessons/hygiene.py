"""Notebook 05: evaluation without autograd, `total_loss += loss` vs `.item()`, `.item()` as a sync, detach()."""

from __future__ import annotations

import contextlib
import gc
import warnings
import weakref
from dataclasses import dataclass

import torch
from torch import nn

from .. import claims, isolation
from ..claims import Judgement
from ..comparisons import comparison
from ..config import TrainConfig, positive_int, preferred_amp
from ..harness import TrainingRun
from ..isolation import exclusive_run
from ..measure import MiB, Spread, record_saved, resolve_device, storage_bytes
from ..models import build_model
from ..profiles import profile_of
from ..results import RunResult
from ..train import run, sweep
from ..verdicts import turns

EVAL_MODES = ("autograd", "no_grad", "inference_mode")
LOG_EVERY = (1, 10)
KEEP_CHOICES = ("loss", "detach", "item")


def eval_config(base: TrainConfig) -> TrainConfig:
    """base with training cut to one step: the evaluation after it is what this comparison measures."""
    return base.replace(steps=1, warmup_steps=0, windows=1)


@comparison("05_no_grad_detach_item:eval_mode")
def eval_modes(base: TrainConfig, progress: bool = True) -> list[RunResult]:
    """Each eval_mode, repeated in turns so a slow spell hits every mode alike; the repeat is in extras["repeat"]."""
    cfg = eval_config(base)
    results = []
    for i, k in turns(len(EVAL_MODES), profile_of(base).eval_repeats):
        r = run(cfg.replace(eval_mode=EVAL_MODES[k]), label=f"eval_mode={EVAL_MODES[k]}", progress=progress)
        r.extras["repeat"] = i
        results.append(r)
        if r.status == "interrupted":
            break
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


def summarize_eval(results: list[RunResult]) -> list[EvalSummary]:
    """Per eval_mode (in order of first appearance), the spread over its repeats."""
    by_mode = {r.config["eval_mode"]: [] for r in results}
    for r in results:
        if r.eval_seconds:
            by_mode[r.config["eval_mode"]].append(r)
    return [EvalSummary(mode, Spread.of([r.dataset["eval_images"] / r.eval_seconds for r in rs]),
                        Spread.of([eval_growth_mb(r) for r in rs])) for mode, rs in by_mode.items()]


@comparison("05_no_grad_detach_item:log_loss", arms=2)
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
    """Memory growth over the run of each log_loss mode; a difference within the step-to-step jitter is noise."""
    by_mode = {r.config["log_loss"]: r for r in results}
    traced = {mode: r for mode, r in by_mode.items() if len(r.memory_trace_mb) > 1}
    lines = [f"log_loss={mode}: memory ({r.memory_kind.replace('_', ' ')}) changed {memory_growth_mb(r):+,.2f} MiB "
             f"over {len(r.memory_trace_mb)} steps; loss tensors kept: {r.kept_loss_tensors or 0}"
             if mode in traced else f"log_loss={mode}: no memory trace to compare ({r.summary()})"
             for mode, r in by_mode.items()]
    if {"item", "tensor"} <= traced.keys():
        item, tensor = by_mode["item"], by_mode["tensor"]
        diff = memory_growth_mb(tensor) - memory_growth_mb(item)
        band = max(step_jitter_mb(item), step_jitter_mb(tensor))
        word = "noise: inside the step-to-step jitter" if abs(diff) <= band else "more than the step-to-step jitter"
        lines.append(f"difference in growth: {diff:+,.2f} MiB ({word} of {band:,.2f} MiB)")
    return "\n".join(lines)


def sync_free_config(base: TrainConfig) -> TrainConfig:
    """base with nothing else syncing every step, so .item()'s own sync is what is measured: the device loader (no
    pageable copy), bf16 or fp32 (no GradScaler reading found_inf), and on CUDA the fused optimiser step."""
    dev = resolve_device(base.device)
    cfg = base.replace(loader="device", num_workers=0, pin_memory=False, non_blocking=False, persistent_workers=False,
                       prefetch_factor=None, amp="bf16" if preferred_amp(dev) == "bf16" else "off")
    if dev.type == "cuda":
        cfg = cfg.replace(opt_impl="fused")
    return cfg


@comparison("05_no_grad_detach_item:log_every", arms=len(LOG_EVERY))
def log_every(base: TrainConfig, progress: bool = True) -> list[RunResult]:
    """The loss read (.item(), a sync on a GPU) every step against every 10th, where nothing else syncs."""
    return sweep("log_every", list(LOG_EVERY), sync_free_config(base), progress=progress)


def item_sync_finding(logging: list[RunResult]) -> Judgement:
    """Does reading the loss every 10th step instead of every step pay? A no-op where nothing runs asynchronously."""
    every, rarely = logging[0], logging[-1]
    measured = claims.verdict_speedup(every, rarely)
    if every.env.get("device_type") != "cuda":
        why = (f"no-op here (on {every.env.get('device_type', 'this device')} every operation has finished when it "
               f"returns: .item() has nothing to wait for")
        if not measured.verdict.startswith(("does not hold here (no difference", claims.COULD_NOT_TELL)):
            why += ("; the difference measured between the two runs cannot come from a sync: they ran one after the "
                    "other on a machine whose speed varies, so repeat them to see that variation")
        return Judgement(why + ")", f"log_every=10 against log_every=1: {measured.evidence}")
    return measured


def find_syncs(base: TrainConfig, steps: int = 3) -> list[str] | str:
    """The distinct sync warnings of a few steps under torch.cuda.set_sync_debug_mode("warn"); no CUDA: why none.
    The mode is per process and runs train in a fresh one, so the steps train in a fresh process that sets the mode
    itself (sync_warnings, by fastlab.isolation.call); set here, it would see nothing of a child's training."""
    dev = resolve_device(base.device)
    if dev.type != "cuda":
        return f"torch.cuda.set_sync_debug_mode is a CUDA feature: on {dev.type} nothing runs asynchronously"
    cfg = base.replace(steps=steps, warmup_steps=1, windows=1)
    with exclusive_run("sync debug"):  # alone, as every run is
        return isolation.call(sync_warnings, cfg)


def sync_warnings(config: TrainConfig) -> list[str] | str:
    """In the calling process: config's run trained here, in this thread, under set_sync_debug_mode("warn"); the
    distinct warnings that name a synchronising operation, or why the run did not finish."""
    before = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            result = TrainingRun(config, "sync debug", None, None, False, None, None).execute()
        finally:
            torch.cuda.set_sync_debug_mode(before)
    if not result.ok:
        return f"the sync-debug run ended {result.status} ({result.error}): its warnings would be partial"
    texts = (str(w.message).strip().splitlines()[0] for w in caught)
    return list(dict.fromkeys(t for t in texts if "synchroniz" in t.lower()))


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
    A detached alias: the tensor itself would make a cycle with its grad_fn that the collector cannot see through."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor.detach()


def _count_nodes(kept: list) -> int:
    seen: set[int] = set()
    stack = [t.grad_fn for t in kept if isinstance(t, torch.Tensor)]
    while stack:
        node = stack.pop()
        if node is not None and id(node) not in seen:
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
        positive_int(f"kept_graph_memory: {name}", value)
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
    alive = [(ptr, nbytes) for ref, ptr, nbytes in saved if ref() is not None and ptr not in params]
    return GraphMemory(keep, backward, steps, len(alive), sum(dict(alive).values()) / 2**20, _count_nodes(kept))


def graph_memory_table(steps: int = 8, batch_size: int = 32) -> list[GraphMemory]:
    """kept_graph_memory for every keep choice, without and with backward()."""
    return [kept_graph_memory(keep, steps, backward, batch_size) for backward in (False, True) for keep in KEEP_CHOICES]


def forward_saved_mb(mode: str, batch_size: int = 32, model: str = "tiny", seed: int = 0) -> float:
    """MiB of activations autograd saves in one evaluation forward under `mode`, from tensor sizes (no parameters)."""
    torch.manual_seed(seed)
    net = build_model(model).eval()
    params = {p.untyped_storage().data_ptr() for p in net.parameters()}
    saved: list[torch.Tensor] = []
    ctx = {"autograd": contextlib.nullcontext, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}[mode]
    with ctx(), record_saved(saved):
        net(torch.randn(batch_size, 3, 32, 32))
    return storage_bytes(t for t in saved if t.untyped_storage().data_ptr() not in params) / MiB


def judge_eval(evals: list[RunResult], batch_size: int | None = None, model: str | None = None) -> Judgement:
    """C9: evaluation under no_grad against autograd, in time (measured) and memory (allocator on CUDA; computed
    from tensor sizes elsewhere, where the process's resident memory cannot show it)."""
    rows = {s.mode: s for s in summarize_eval(evals)}
    if "autograd" not in rows or "no_grad" not in rows:
        raise ValueError("judge_eval needs evaluations with eval_mode 'autograd' and 'no_grad'")
    base, ng = rows["autograd"], rows["no_grad"]
    findings = {"counted in time": claims.verdict_faster(base.speed, ng.speed, unit="eval images/s",
                                                         what="repeats")}
    if evals[0].memory_kind == "cuda_max_allocated":
        findings["counted in memory"] = claims.verdict_less(base.growth_mb, ng.growth_mb, what="memory rise")
    else:
        cfg = evals[0].config
        b, m = batch_size or int(cfg.get("batch_size", 32)), model or cfg.get("model", "tiny")
        findings["counted in memory"] = claims.verdict_less(forward_saved_mb("autograd", b, m),
                                                            forward_saved_mb("no_grad", b, m),
                                                            what="activations kept (computed from tensor sizes)")
        combined = claims.verdict_conditions(findings)
        where = evals[0].env.get("device_type", "cpu")
        return combined._replace(verdict=f"{combined.verdict} (the memory half is true by construction on {where}: "
                                         f"under no_grad autograd saves no activations, so their count from tensor "
                                         f"sizes is zero by definition; a GPU's allocator measures it)")
    return claims.verdict_conditions(findings)


def _row(rows: list[GraphMemory], keep: str, backward: bool) -> GraphMemory:
    return next(g for g in rows if g.keep == keep and g.backward == backward)


def judge_detach(rows: list[GraphMemory]) -> Judgement:
    """C10: keeping loss.detach() instead of loss, with and without a backward pass in the loop."""
    findings = {}
    for backward, where in ((False, "no backward() runs (evaluation with autograd on)"),
                            (True, "backward() runs")):
        loss, det = _row(rows, "loss", backward), _row(rows, "detach", backward)
        ev = (f"after {loss.steps} steps keeping loss: {loss.saved_mb:.2f} MiB of activations, {loss.graph_nodes} "
              f"graph nodes; keeping loss.detach(): {det.saved_mb:.2f} MiB, {det.graph_nodes} nodes")
        verdict = (f"does not hold here (nothing to free: backward() already freed the activations; detach() cuts "
                   f"only {loss.graph_nodes} small graph nodes)" if loss.saved_mb <= 0 else
                   claims.verdict_less(loss.saved_mb, det.saved_mb, what="activations kept").verdict)
        findings[where] = Judgement(verdict, ev)
    return claims.verdict_conditions(findings)


def judge_logging(leak: list[RunResult], rows: list[GraphMemory], sync: Judgement | None = None) -> Judgement:
    """C11: does keeping the loss tensor leak the graph's memory? In the training loop (backward runs: the runs'
    memory trace and the counted table), and where no backward runs; the .item() sync finding as evidence."""
    with_bw, without = _row(rows, "loss", True), _row(rows, "loss", False)
    by_mode = {r.config["log_loss"]: r for r in leak}
    run_text = describe_log_loss(leak).replace("\n", "; ") if {"item", "tensor"} <= by_mode.keys() else ""
    findings = {
        "no backward() runs (validation with autograd on)":
            Judgement("holds" if without.saved_mb > 0 else "does not hold here",
                    f"{without.saved_mb:.2f} MiB of activations kept after {without.steps} steps"),
        "in a training loop":
            Judgement("holds" if with_bw.saved_mb > 0 else
                    f"does not hold here (backward() frees the activations; only {with_bw.graph_nodes} graph nodes "
                    f"stay)", f"{with_bw.saved_mb:.2f} MiB kept; training runs: {run_text}"),
    }
    combined = claims.verdict_conditions(findings)
    extra = f"; .item() as a sync: {sync.verdict}" if sync is not None else ""
    return Judgement(combined.verdict, combined.evidence + extra)
