"""What this machine is, and which techniques can apply on it (python -m fastlab env)."""

from __future__ import annotations

import torch

from .config import TrainConfig, active_profile, no_op_reasons
from .data import cifar10_on_disk, data_dir
from .measure import bf16_is_trap, bf16_supported, environment, has_tensor_cores, resolve_device


def techniques_here(device: torch.device | None = None) -> list[tuple[str, bool, str]]:
    """(technique, applies here?, why) for each technique taught; whether a knob acts is config.no_op_reasons'."""
    dev = device or resolve_device()
    cuda = dev.type == "cuda"

    def row(name: str, does: str, **knobs: object) -> tuple[str, bool, str]:
        reasons = no_op_reasons(TrainConfig(device=dev.type, **knobs), dev)
        why = "; ".join(reasons[k] for k in knobs if k in reasons)
        return name, not why, why or does

    return [
        ("DataLoader workers", True, "parallel decoding and augmentation on CPU cores"),
        row("pin_memory + non_blocking", "speeds host-to-GPU copies", pin_memory=True, non_blocking=True),
        ("device-resident loader", True, "batches made on the device as tensor ops"),
        ("fp16 autocast + GradScaler", True, "tensor cores" if has_tensor_cores(dev) else
         f"runs on {dev.type}; gains not assured"),
        ("bf16 autocast", bf16_supported(dev), "native" if bf16_supported(dev) else
         "runs emulated: no native bf16 on this CPU (a known trap)" if bf16_is_trap(dev) else
         "not native on this device"),
        row("TF32", "Ampere or newer GPU", tf32=False),  # on by default: turning it off shows whether it acts
        row("cudnn.benchmark", "cuDNN present", cudnn_benchmark=True),
        ("channels_last", True, "tensor cores prefer NHWC" if cuda else "CPU convolutions have NHWC kernels too"),
        ("torch.compile", True, "inductor; reduce-overhead adds CUDA graphs" if cuda else
         "inductor, C++ backend (no CUDA graphs)"),
        ("fused / foreach optimisers", True, "fewer kernel launches per step"),
    ]


def environment_report() -> str:
    dev = resolve_device()
    env = environment(dev, active_profile())
    lines = ["fastlab environment", ""]
    lines += [f"  {k:<20} {v}" for k, v in env.items()]
    cifar = data_dir()
    where = f"on disk at {cifar}" if cifar10_on_disk(cifar) else f"not on disk ({cifar}); the SYNTHETIC set is used offline"
    lines += ["", f"  {'CIFAR-10':<20} {where}", "", "techniques on this machine:"]
    for name, applies, why in techniques_here(dev):
        lines.append(f"  [{'x' if applies else ' '}] {name:<28} {why}")
    return "\n".join(lines)
