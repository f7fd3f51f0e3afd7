"""The techniques without a TrainConfig knob, as plain PyTorch functions that notebooks 02, 07, 08, 10, 11, 12 show.

Each pair is a plain function and the same with the technique's lines added, shown with fastlab.code.snippet_diff
after both ran: keep each pair identical but for the technique. Nothing here imports fastlab: a reader copies it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import ProfilerActivity
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ..models import blocks_and_head  # 12's cells read it here too (tc.blocks_and_head)


def tiny_batches(steps: int, batch_size: int = 16, seed: int = 0,
                 device: torch.device | str = "cpu") -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`steps` random CIFAR-shaped batches (images, labels) for the snippets, on `device`: the same every call."""
    g = torch.Generator().manual_seed(seed)
    made = [(torch.randn(batch_size, 3, 32, 32, generator=g), torch.randint(0, 10, (batch_size,), generator=g))
            for _ in range(steps)]
    return made if torch.device(device).type == "cpu" else [(x.to(device), y.to(device)) for x, y in made]


def tiny_dataset(images: int = 64, seed: int = 0) -> TensorDataset:
    """The same kind of data as a Dataset (for the DataLoader snippets)."""
    x, y = zip(*tiny_batches(1, images, seed))
    return TensorDataset(x[0], y[0])


# ------------------------------------------------------------------ 02: gradient clipping under GradScaler


def fp16_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, opt: torch.optim.Optimizer,
              scaler: torch.amp.GradScaler) -> float:
    """One fp16 autocast step with GradScaler, as 02's script takes it."""
    with torch.autocast(x.device.type, dtype=torch.float16):
        loss = F.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.step(opt)  # unscales, checks for inf/NaN (a host-device sync), then steps or skips
    scaler.update()
    return loss.item()


def fp16_step_clipped(model: nn.Module, x: torch.Tensor, y: torch.Tensor, opt: torch.optim.Optimizer,
                      scaler: torch.amp.GradScaler, max_norm: float = 1.0) -> float:
    """The same step with gradient clipping: the gradients are unscaled first, so max_norm is in their own units."""
    with torch.autocast(x.device.type, dtype=torch.float16):
        loss = F.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)  # the true gradients: clipping the scaled ones would cut them to max_norm / scale
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(opt)  # already unscaled: still checks for inf/NaN (a sync) and skips such a step
    scaler.update()
    return loss.item()


# ------------------------------------------------------------------ 08: the profiler


def train_steps(model: nn.Module, batches: list, opt: torch.optim.Optimizer) -> float:
    """A plain training loop: the baseline the profiler's lines are added to."""
    model.train()
    for x, y in batches:
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return loss.item()


def train_steps_profiled(model: nn.Module, batches: list, opt: torch.optim.Optimizer,
                         trace_dir: str | Path) -> torch.profiler.profile:
    """The same loop under torch.profiler: skip a step, warm up on one, record three, write a Chrome trace."""
    model.train()
    trace = Path(trace_dir) / "trace.json"  # open it in https://ui.perfetto.dev
    prof = torch.profiler.profile(
        activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else []),
        schedule=torch.profiler.schedule(wait=1, warmup=1, active=3, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(str(trace)))  # the recorded steps, as a Chrome trace
    prof.start()
    for x, y in batches:
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        prof.step()  # one step ended: the schedule moves on (wait, warm-up, record)
    prof.stop()
    return prof


def train_steps_watched(w, model: nn.Module, batches: list, opt: torch.optim.Optimizer) -> float:
    """The same loop under fastlab.watch (notebook 10): the two touches, and the loss handed over."""
    model.train()
    for x, y in w(batches):  # touch 1: the wait for each batch is timed
        with w.step(len(x)) as s:  # touch 2: the step is timed and its images counted
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss  # read once at the end: a NaN marks the run diverged
    return loss.item()


# ------------------------------------------------------------------ 12: activation checkpointing


def train_step(net: nn.Module, x: torch.Tensor, y: torch.Tensor, opt: torch.optim.Optimizer) -> float:
    """One plain step, block by block (blocks_and_head: the net's forward as blocks, then its head)."""
    blocks, head = blocks_and_head(net)
    h = x
    for block in blocks:
        h = block(h)
    loss = F.cross_entropy(head(h), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.item()


def train_step_checkpointed(net: nn.Module, x: torch.Tensor, y: torch.Tensor, opt: torch.optim.Optimizer) -> float:
    """The same step with every block checkpointed: only each block's input is kept for backward."""
    blocks, head = blocks_and_head(net)
    h = x
    for block in blocks:
        h = checkpoint(block, h, use_reentrant=False)  # recomputes block(h) in backward instead of saving it
    loss = F.cross_entropy(head(h), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.item()


def train_step_reentrant(net: nn.Module, x: torch.Tensor, y: torch.Tensor, opt: torch.optim.Optimizer) -> float:
    """The pitfall: the old reentrant variant, whose backward skips a block whose input needs no gradient."""
    blocks, head = blocks_and_head(net)
    h = x
    for block in blocks:
        h = checkpoint(block, h, use_reentrant=True)  # x needs no grad: this block's weights get no gradient
    loss = F.cross_entropy(head(h), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.item()


def params_without_grad(net: nn.Module) -> int:
    """How many of net's parameter tensors got no gradient in the last backward."""
    return sum(p.grad is None for p in net.parameters())


# ------------------------------------------------------------------ 07: torch.export and ONNX


def train_compiled(model: nn.Module, data: TensorDataset, batch_size: int, epochs: int = 2) -> float:
    """The pitfall: a compiled model fed a DataLoader whose last batch is smaller, so dynamo compiles again."""
    compiled = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = DataLoader(data, batch_size=batch_size, shuffle=True)  # len(data) % batch_size left: a ragged batch
    for _ in range(epochs):
        for x, y in loader:
            loss = F.cross_entropy(compiled(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return loss.item()


def train_compiled_drop_last(model: nn.Module, data: TensorDataset, batch_size: int, epochs: int = 2) -> float:
    """Fix one: drop the ragged batch, so every batch has one shape (its images are seen in other epochs)."""
    compiled = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = DataLoader(data, batch_size=batch_size, shuffle=True, drop_last=True)  # every batch full: one shape
    for _ in range(epochs):
        for x, y in loader:
            loss = F.cross_entropy(compiled(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return loss.item()


def train_compiled_dynamic(model: nn.Module, data: TensorDataset, batch_size: int, epochs: int = 2) -> float:
    """Fix two: mark the batch dimension dynamic, so the first compile serves every batch size."""
    compiled = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = DataLoader(data, batch_size=batch_size, shuffle=True)  # len(data) % batch_size left: a ragged batch
    for _ in range(epochs):
        for x, y in loader:
            torch._dynamo.mark_dynamic(x, 0)  # dimension 0 may vary: one graph for any batch size
            loss = F.cross_entropy(compiled(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return loss.item()


def save_model(model: nn.Module, example: torch.Tensor, folder: str | Path) -> Path:
    """The plain way to keep a model: its weights, which need Python and the model's class to load again."""
    model.eval()
    path = Path(folder) / "model.pt"
    torch.save(model.state_dict(), path)
    return path


def save_model_exported(model: nn.Module, example: torch.Tensor, folder: str | Path) -> Path:
    """The same model exported: a whole-graph program (.pt2) and, from it, ONNX for ONNX Runtime or an NPU."""
    model.eval()
    path = Path(folder) / "model.pt2"
    batch = torch.export.Dim("batch", min=1)  # the batch size may vary; the image size may not
    program = torch.export.export(model, (example,), dynamic_shapes=({0: batch},))
    torch.export.save(program, path)  # load with torch.export.load(path).module(): no model class needed
    torch.onnx.export(program, (example,), str(path.with_suffix(".onnx")), dynamo=True, external_data=False)
    return path


# ------------------------------------------------------------------ 11: DistributedDataParallel


def train_epoch(make_model: Callable[[], nn.Module], data: TensorDataset, batch_size: int,
                epochs: int = 1) -> float:
    """A plain single-process loop, on the GPU when there is one."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = make_model().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = DataLoader(data, batch_size=batch_size, shuffle=True)
    for _ in range(epochs):
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return loss.item()


def train_epoch_ddp(make_model: Callable[[], nn.Module], data: TensorDataset, batch_size: int,
                    epochs: int = 1) -> float:
    """The same loop in each of torchrun's processes (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT come from it)."""
    local_rank = int(os.environ["LOCAL_RANK"])  # this process's GPU on this machine
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)  # before the group starts: NCCL uses the current device
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    if dist.get_rank() == 0:
        print(f"{dist.get_world_size()} process(es), backend {dist.get_backend()}, rank 0 on {device}")
    torch.manual_seed(0)
    model = make_model().to(device)
    # all-reduces (averages) the gradients during backward; device_ids: the one GPU this process drives
    model = DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sampler = DistributedSampler(data, shuffle=True)  # each rank reads its own shard of the data
    loader = DataLoader(data, batch_size=batch_size, sampler=sampler)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)  # reshuffle per epoch: without it every epoch gets the same order
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    dist.destroy_process_group()
    return loss.item()


def free_port() -> int:
    """A TCP port nothing listens on now (for a one-process group's rendezvous)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_one_process_group(fn: Callable[..., float], *args: object) -> float:
    """fn(*args) with the variables torchrun would set for a world of one process, restored afterwards."""
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    with mock.patch.dict(os.environ, env):
        return fn(*args)


def train_steps_profiled_unstepped(model: nn.Module, batches: list, opt: torch.optim.Optimizer,
                                   trace_dir: str | Path) -> torch.profiler.profile:
    """The pitfall: the profiled loop without prof.step(), so the schedule never leaves its first `wait` step."""
    model.train()
    trace = Path(trace_dir) / "trace.json"  # open it in https://ui.perfetto.dev
    prof = torch.profiler.profile(
        activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else []),
        schedule=torch.profiler.schedule(wait=1, warmup=1, active=3, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(str(trace)))  # the recorded steps, as a Chrome trace
    prof.start()
    for x, y in batches:
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    prof.stop()
    return prof


def recorded_ops(prof: torch.profiler.profile) -> int:
    """How many distinct operators a finished profile recorded (0 when it recorded nothing)."""
    try:
        return len(prof.key_averages())
    except (AssertionError, RuntimeError):  # no recorded events at all
        return 0
