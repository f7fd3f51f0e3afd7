"""Which knobs do nothing on a device, and why: one pure function the training loop records as no-ops.

A knob counts when moved from its TrainConfig default (either way) and the device has nothing for it to act on.
CUDA capability is a parameter so the rules can be tested without a GPU.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from .config import CUDA_GRAPH_MODES, TrainConfig
from .measure import bf16_is_trap

_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(TrainConfig)
                             if f.default is not dataclasses.MISSING}


def _changed(config: TrainConfig, name: str) -> bool:
    return name in _DEFAULTS and getattr(config, name, _DEFAULTS[name]) != _DEFAULTS[name]


def fused_optimizer_devices() -> tuple[str, ...]:
    """Device types with fused optimiser kernels in this torch (cuda, cpu and mps in recent versions)."""
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

        return tuple(_get_fused_kernels_supported_devices())
    except (ImportError, AttributeError):  # a private helper: fall back to what torch 2.4+ supports
        return ("cuda", "cpu", "mps")


def no_op_reasons(config: TrainConfig, device: torch.device | str,
                  capability: tuple[int, int] | None = None) -> dict[str, str]:
    """Knob -> why it does nothing on `device`. `capability`: the CUDA compute capability (queried when None)."""
    device = torch.device(device)
    kind = device.type
    out: dict[str, str] = {}
    if kind == "cuda":
        if capability is None:
            capability = torch.cuda.get_device_capability(device)
        if _changed(config, "tf32") and capability < (8, 0):
            out["tf32"] = (f"TF32 needs an Ampere-or-newer GPU (compute capability 8.0+); this one is "
                           f"{capability[0]}.{capability[1]}, so convolutions run in full fp32 either way")
        if _changed(config, "matmul_precision") and capability < (8, 0):
            out["matmul_precision"] = (f"TF32 and bf16 matmul modes need an Ampere-or-newer GPU (compute capability "
                                       f"8.0+); this one is {capability[0]}.{capability[1]}, so matmuls stay fp32")
        return out
    where = {"mps": "an Apple GPU (mps)", "cpu": "the CPU"}.get(kind, kind)
    if _changed(config, "pin_memory"):
        out["pin_memory"] = (f"pinned host memory speeds copies to a CUDA GPU; this run is on {where}"
                             + (", which shares memory with the CPU" if kind == "mps" else ""))
    if _changed(config, "non_blocking") and kind == "cpu":
        out["non_blocking"] = "the batches are already on the CPU: there is no copy to overlap"
    if _changed(config, "cudnn_benchmark"):
        out["cudnn_benchmark"] = f"cuDNN runs only on NVIDIA GPUs; this run is on {where}"
    if _changed(config, "tf32"):
        out["tf32"] = f"TF32 is a mode of NVIDIA Ampere-or-newer GPUs; this run is on {where}"
    if config.opt_impl == "fused" and kind not in fused_optimizer_devices():
        out["opt_impl"] = f"this torch has no fused optimiser kernels for {where}; torch's default is used"
    if config.compile in CUDA_GRAPH_MODES:
        out["compile"] = (f"compile='{config.compile}' adds CUDA graphs, which need a CUDA GPU; on {where} it "
                          f"compiles without them")
    return out


def trap_reasons(config: TrainConfig, device: torch.device | str) -> dict[str, str]:
    """Knob -> why it is a known trap on `device` (far slower: one short run shows it), judged from the hardware."""
    device = torch.device(device)
    out: dict[str, str] = {}
    from .measure import cpu_isa, cpu_model

    if config.amp == "bf16" and bf16_is_trap(device):
        out["amp"] = (f"this CPU ({cpu_model()}, {cpu_isa()}) has no native bf16 instructions (no avx512_bf16 or "
                      f"amx_bf16): bf16 autocast converts to fp32 and back around every op, so it runs far slower "
                      f"than fp32 here; one short run shows by how much")
    elif config.amp == "fp16" and device.type == "cpu":
        out["amp"] = (f"fp16 autocast on a CPU ({cpu_model()}, {cpu_isa()}): torch's CPU convolutions have no fast "
                      f"fp16 path on the CPUs this workbook was measured on, so it runs far slower than fp32 (fp16 "
                      f"with GradScaler is a GPU recipe; a CPU's half precision is bf16); one short run shows by how "
                      f"much here")
    return out
