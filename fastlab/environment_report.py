"""What this machine is, and which techniques can apply on it (python -m fastlab env)."""

from __future__ import annotations

import torch

from .config import active_profile
from .data import cifar10_on_disk, data_dir
from .measure import bf16_is_trap, bf16_supported, environment, has_tensor_cores, resolve_device


def techniques_here(device: torch.device | None = None) -> list[tuple[str, bool, str]]:
    """(technique, applies here?, why) for each technique the workbook teaches."""
    dev = device or resolve_device()
    cuda = dev.type == "cuda"
    ampere = cuda and torch.cuda.get_device_capability(dev)[0] >= 8
    on = f"on {dev.type}"
    return [
        ("DataLoader workers", True, "parallel decoding and augmentation on CPU cores"),
        ("pin_memory + non_blocking", cuda, "speeds host-to-GPU copies" if cuda else f"no host-to-GPU copy {on}"),
        ("device-resident loader", True, "batches made on the device as tensor ops"),
        ("fp16 autocast + GradScaler", True, "tensor cores" if has_tensor_cores(dev) else f"runs {on}; gains not assured"),
        ("bf16 autocast", bf16_supported(dev), "native" if bf16_supported(dev) else
         "runs emulated: no native bf16 on this CPU (a known trap)" if bf16_is_trap(dev) else
         "not native on this device"),
        ("TF32", ampere, "Ampere or newer GPU" if ampere else "needs an Ampere-or-newer NVIDIA GPU"),
        ("cudnn.benchmark", cuda, "cuDNN present" if cuda else f"cuDNN is not used {on}"),
        ("channels_last", True, "tensor cores prefer NHWC" if cuda else "CPU convolutions have NHWC kernels too"),
        ("torch.compile", True, "inductor; reduce-overhead adds CUDA graphs" if cuda else "inductor, C++ backend (no CUDA graphs)"),
        ("fused / foreach optimisers", True, "fewer kernel launches per step"),
    ]


def environment_report() -> str:
    dev = resolve_device()
    env = environment(dev, active_profile())
    lines = ["fastlab environment", ""]
    lines += [f"  {k:<20} {v}" for k, v in env.items()]
    cifar = data_dir()
    lines += ["", f"  {'CIFAR-10':<20} {'on disk at ' + str(cifar) if cifar10_on_disk(cifar) else 'not on disk (' + str(cifar) + '); the SYNTHETIC set is used offline'}",
              "", "techniques on this machine:"]
    for name, applies, why in techniques_here(dev):
        lines.append(f"  [{'x' if applies else ' '}] {name:<28} {why}")
    return "\n".join(lines)
