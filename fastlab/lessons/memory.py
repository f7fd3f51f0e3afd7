"""Notebook 12: one training step's memory taken apart into parameters, gradients, optimiser state, activations and
autocast's weight copies, computed from tensor sizes (the CUDA allocator measured beside); checkpointing's cost."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from .. import claims
from ..claims import Judgement
from ..config import positive_int
from ..measure import MiB, Spread, now, record_saved, resolve_device, storage_bytes, synchronize
from ..models import blocks_and_head, build_model

AMP_DTYPES = {"off": None, "fp16": torch.float16, "bf16": torch.bfloat16}
OPTIMIZERS = ("sgd", "adam", "adamw")
COMPONENTS = ("parameters", "gradients", "optimiser state", "activations", "weight copies")


def _check(name: str, value: object, allowed: tuple) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not allowed: choose one of {', '.join(map(repr, allowed))}")


class Segmented(nn.Module):
    """A net whose forward checkpoints its blocks (use_reentrant=False) in `segments` pieces: the blocks of
    models.blocks_and_head, the same for a workbook net and a torchvision ResNet. Each piece's input is
    recorded in `kept`."""

    def __init__(self, net: nn.Module, segments: int = 2) -> None:
        super().__init__()
        positive_int("segments", segments)
        self.net, self.segments = net, segments
        self.kept: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.kept = []
        *pieces, head = _pieces(self.net, self.segments)
        for piece in pieces:
            self.kept.append(x)
            x = checkpoint(piece, x, use_reentrant=False)
        return head(x)


def _pieces(net: nn.Module, segments: int) -> list[nn.Module]:
    """net's blocks (models.blocks_and_head) in `segments` consecutive pieces, at most, then its head."""
    blocks, head = blocks_and_head(net)
    size = -(-len(blocks) // segments)
    return [nn.Sequential(*blocks[i:i + size]) for i in range(0, len(blocks), size)] + [head]


@dataclass
class MemoryBreakdown:
    """One training step's memory, component by component (MiB)."""

    label: str
    batch_size: int
    device: str
    source: str  # "computed from tensor sizes" or "computed from tensor sizes; CUDA allocator measured beside"
    parameters_mb: float
    gradients_mb: float
    optimizer_mb: float
    activations_mb: float  # saved for backward (and, with checkpointing, the segment inputs kept)
    weight_copies_mb: float  # autocast's low-precision weight copies saved for backward
    grads_held_between_steps_mb: float  # gradients still allocated after zero_grad
    recompute_mb: float = 0.0  # checkpointing: the largest segment's activations, rebuilt one segment at a time
    dtypes: dict[str, str] = field(default_factory=dict)
    cuda: dict[str, float] = field(default_factory=dict)  # allocator: "after_forward", "peak_step", "between_steps"

    def component_mb(self) -> dict[str, float]:
        values = (self.parameters_mb, self.gradients_mb, self.optimizer_mb, self.activations_mb, self.weight_copies_mb)
        return dict(zip(COMPONENTS, values))

    def total_mb(self) -> float:
        """The sum of the parts (+ recompute); not a peak, as backward frees activations while making gradients."""
        return sum(self.component_mb().values()) + self.recompute_mb

    def summary(self) -> str:
        parts = [f"{k} {v:,.2f}" + (f" ({self.dtypes[k]})" if self.dtypes.get(k) else "")
                 for k, v in self.component_mb().items()]
        text = f"{self.label}: " + ", ".join(parts) + f" MiB; sum {self.total_mb():,.2f} MiB"
        if self.recompute_mb:
            text += f" (including {self.recompute_mb:,.2f} MiB recomputed per segment in backward)"
        if self.cuda:
            text += "; CUDA allocator: " + ", ".join(f"{k.replace('_', ' ')} {v:,.1f} MiB"
                                                     for k, v in self.cuda.items())
        return text + f" [{self.source}]"


def _autocast(device_type: str, dtype: torch.dtype | None):
    return torch.autocast(device_type, dtype=dtype or torch.float32, enabled=dtype is not None)


def measure_breakdown(model: str = "tiny", batch_size: int = 32, *, amp: str = "off", optimizer: str = "adam",
                      checkpointing: bool = False, segments: int = 2, set_to_none: bool = True,
                      device: str = "cpu", seed: int = 0, label: str = "") -> MemoryBreakdown:
    """Take one training step apart into MemoryBreakdown's components, after a first step made the optimiser state."""
    _check("amp", amp, tuple(AMP_DTYPES))
    _check("optimizer", optimizer, OPTIMIZERS)
    positive_int("batch_size", batch_size)
    dev = resolve_device(device)
    dtype = AMP_DTYPES[amp]
    torch.manual_seed(seed)
    base = build_model(model).to(dev)
    net = Segmented(base, segments) if checkpointing else base
    params = list(base.parameters())
    param_ptrs = {p.untyped_storage().data_ptr() for p in params}
    shapes = {tuple(p.shape) for p in params}
    opt = {"sgd": lambda: torch.optim.SGD(params, lr=1e-3, momentum=0.9), "adam": lambda: torch.optim.Adam(params),
           "adamw": lambda: torch.optim.AdamW(params)}[optimizer]()
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch_size, 3, 32, 32, generator=gen).to(dev)
    y = torch.randint(0, 10, (batch_size,), generator=gen).to(dev)
    saved: list[torch.Tensor] = []
    cuda: dict[str, float] = {}

    def step(record: bool) -> None:
        opt.zero_grad(set_to_none=set_to_none)
        with record_saved(saved) if record else nullcontext(), _autocast(dev.type, dtype):
            loss = nn.functional.cross_entropy(net(x), y)
        if record and dev.type == "cuda":
            synchronize(dev)
            cuda["after_forward"] = torch.cuda.memory_allocated(dev) / MiB
        loss.backward()
        opt.step()

    step(record=False)  # creates the optimiser state
    if dev.type == "cuda":
        synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    step(record=True)
    grads_mb = storage_bytes(p.grad for p in params if p.grad is not None) / MiB
    kept_inputs = list(net.kept) if checkpointing else []
    opt.zero_grad(set_to_none=set_to_none)
    if dev.type == "cuda":
        synchronize(dev)
        cuda["peak_step"] = torch.cuda.max_memory_allocated(dev) / MiB
        cuda["between_steps"] = torch.cuda.memory_allocated(dev) / MiB
    held = storage_bytes(p.grad for p in params if p.grad is not None) / MiB
    copies = [t for t in saved if t.untyped_storage().data_ptr() not in param_ptrs and t.dtype != torch.float32
              and tuple(t.shape) in shapes and t.dim() > 1]
    copy_ptrs = {t.untyped_storage().data_ptr() for t in copies}
    acts = [t for t in saved if t.untyped_storage().data_ptr() not in param_ptrs | copy_ptrs]
    acts_mb = storage_bytes(acts + kept_inputs) / MiB
    recompute = _largest_segment_mb(base, x, dtype, segments) if checkpointing else 0.0
    state = [t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor) and t.dim() > 0]
    dtypes = dict(zip(COMPONENTS, map(_dtype_name, (params, params, state, acts, copies))))
    return MemoryBreakdown(
        label=label or f"{model}, batch {batch_size}, {'fp32' if amp == 'off' else amp + ' autocast'}, {optimizer}"
                       + (", checkpointed" if checkpointing else ""),
        batch_size=batch_size, device=str(dev),
        source="computed from tensor sizes" + ("; CUDA allocator measured beside" if cuda else ""),
        parameters_mb=storage_bytes(params) / MiB, gradients_mb=grads_mb, optimizer_mb=storage_bytes(state) / MiB,
        activations_mb=acts_mb, weight_copies_mb=storage_bytes(copies) / MiB, grads_held_between_steps_mb=held,
        recompute_mb=recompute, dtypes=dtypes, cuda=cuda)


def _dtype_name(tensors) -> str:
    return "/".join(sorted({str(t.dtype).removeprefix("torch.") for t in tensors}))


def _largest_segment_mb(net: nn.Module, x: torch.Tensor, dtype: torch.dtype | None, segments: int) -> float:
    """Activations one checkpointed segment saves when it is recomputed in backward (the largest segment)."""
    pieces = _pieces(net, segments)[:-1]
    largest = 0
    for piece in pieces:
        saved: list[torch.Tensor] = []
        ptrs = {p.untyped_storage().data_ptr() for p in piece.parameters()}
        with record_saved(saved), _autocast(x.device.type, dtype):
            out = piece(x.detach().requires_grad_())
        largest = max(largest, storage_bytes(t for t in saved if t.untyped_storage().data_ptr() not in ptrs))
        x = out.detach()
    return largest / MiB


def describe_breakdowns(rows: list[MemoryBreakdown]) -> str:
    return "\n".join(r.summary() for r in rows)


def time_steps(model: str = "tiny", batch_size: int = 32, *, checkpointing: bool = False, segments: int = 2,
               repeats: int = 8, warmup: int = 2, device: str = "cpu", seed: int = 0) -> Spread:
    """Milliseconds per training step (forward, backward, Adam step), each step timed alone, synchronised."""
    positive_int("repeats", repeats)
    dev = resolve_device(device)
    torch.manual_seed(seed)
    base = build_model(model).to(dev)
    net = Segmented(base, segments) if checkpointing else base
    opt = torch.optim.Adam(base.parameters())
    x = torch.randn(batch_size, 3, 32, 32).to(dev)
    y = torch.randint(0, 10, (batch_size,)).to(dev)
    times = []
    for i in range(warmup + repeats):
        t0 = now(dev)
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
        if i >= warmup:
            times.append(1000 * (now(dev) - t0))
    return Spread.of(times)


def judge_amp_memory(pairs: dict[str, tuple[MemoryBreakdown, MemoryBreakdown]]) -> Judgement:
    """C4 ("about 50% less memory") per condition: (fp32 breakdown, autocast breakdown) -> holds only when ..."""
    findings = {}
    for condition, (fp32, low) in pairs.items():
        findings[condition] = claims.verdict_less(fp32.total_mb(), low.total_mb(), 0.5,
                                                  what="summed training memory")
    combined = claims.verdict_conditions(findings)
    fp32, low = next(iter(pairs.values()))
    stays = (f"stays fp32: parameters {fp32.parameters_mb:,.1f} MiB, gradients {fp32.gradients_mb:,.1f} MiB, "
             f"optimiser state {fp32.optimizer_mb:,.1f} MiB; activations {fp32.activations_mb:,.1f} -> "
             f"{low.activations_mb:,.1f} MiB; autocast adds weight copies of {low.weight_copies_mb:,.2f} MiB")
    return Judgement(combined.verdict, combined.evidence + "; " + stays + "; the sum of the parts, not a peak: "
                   "gradients and most activations never coexist")


def amp_pairs(model: str, batch_sizes: tuple[int, ...], amp: str, optimizer: str = "adam",
              device: str = "cpu") -> dict[str, tuple[MemoryBreakdown, MemoryBreakdown]]:
    """fp32 and `amp` breakdowns at each batch size, keyed "at batch N"."""
    return {f"at batch {b}": (measure_breakdown(model, b, amp="off", optimizer=optimizer, device=device),
                              measure_breakdown(model, b, amp=amp, optimizer=optimizer, device=device))
            for b in batch_sizes}

