"""TrainConfig: every knob of a training run in one frozen, validated dataclass.

Defaults live here and only here: profiles, the CLI flags and the widget panels
are all built from these fields.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from . import budget, measure
from .measure import bf16_is_trap, bf16_supported, cpu_flags, cpu_isa, cpu_model, mps_available, resolve_device
from .profiles import CUSTOM, PROFILES, profile_of
from .profiles import profile as _profile

# Allowed values of the fields that take one of a fixed set of strings.
CHOICES: dict[str, tuple[str, ...]] = {
    "loader": ("dataloader", "device"),
    "amp": ("off", "fp16", "bf16"),
    "compile": ("off", "default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune"),
    "matmul_precision": ("highest", "high", "medium"),
    "optimizer": ("sgd", "adam", "adamw"),
    "opt_impl": ("default", "for-loop", "foreach", "fused"),
    "scheduler": ("none", "cosine", "onecycle"),
    "eval_mode": ("no_grad", "inference_mode", "autograd"),
    "log_loss": ("item", "tensor"),
    "model": ("tiny", "compact", "resnet18"),
    "dataset": ("auto", "cifar10", "synthetic"),
}

# Compile modes that capture CUDA graphs on a GPU; elsewhere torch.compile runs without them.
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")

# Integer fields and their smallest allowed value.
MINIMUMS: dict[str, int] = dict(num_workers=0, batch_size=1, grad_accum_steps=1, steps=1, warmup_steps=0, windows=1,
                                log_every=1, train_images=1, eval_images=1, seed=0)


@dataclass(frozen=True)
class TrainConfig:
    # --- data path ---
    loader: str = "dataloader"  # "dataloader": torch DataLoader + per-image transforms; "device": whole set on the device, batch-wise augmentation
    num_workers: int = 0  # DataLoader worker processes; 0 loads in the training process
    pin_memory: bool = False  # page-locked host batches: faster, async host-to-GPU copies (CUDA only)
    non_blocking: bool = False  # .to(device, non_blocking=True): the host goes on while the copy queues (needs pin_memory)
    persistent_workers: bool = False  # keep workers alive between epochs (needs num_workers > 0)
    prefetch_factor: int | None = None  # batches each worker loads ahead; None = torch's default (needs num_workers > 0)
    # --- precision ---
    amp: str = "off"  # autocast dtype: "fp16" (with GradScaler) or "bf16"
    tf32: bool = True  # cuDNN convolutions may use TF32 on Ampere+ GPUs (torch's default); False: strict fp32
    matmul_precision: str = "highest"  # set_float32_matmul_precision: "high"/"medium" allow TF32 (CPU: cpu_matmul_no_op)
    # --- kernels ---
    cudnn_benchmark: bool = False  # let cuDNN time its algorithms per input shape and keep the fastest
    channels_last: bool = False  # NHWC memory format for model and inputs (tensor cores prefer it)
    compile: str = "off"  # torch.compile mode; "reduce-overhead" and "max-autotune" add CUDA graphs on a GPU
    # --- shape ---
    batch_size: int = 128  # images per micro-batch
    grad_accum_steps: int = 1  # micro-batches per optimiser step; images per step = batch_size * grad_accum_steps
    # --- optimiser ---
    optimizer: str = "adam"
    opt_impl: str = "default"  # "default" lets torch pick; "for-loop" / "foreach" / "fused" force one
    lr: float = 1e-3  # peak learning rate
    weight_decay: float = 5e-4  # L2 (adam, sgd) or decoupled (adamw) weight decay
    momentum: float = 0.9  # SGD momentum (ignored by adam/adamw)
    scheduler: str = "none"  # learning-rate schedule over warmup_steps + steps
    # --- hygiene ---
    eval_mode: str = "no_grad"  # how held-out evaluation disables autograd ("autograd" = the pitfall)
    log_loss: str = "item"  # "item": log loss.item(); "tensor": total_loss += loss, keeping every graph (the leak)
    log_every: int = 1  # steps between loss reads; each .item() is a host-device sync
    set_to_none: bool = True  # zero_grad(set_to_none=True) frees grads instead of writing zeros
    # --- run ---
    model: str = "compact"
    dataset: str = "auto"  # "auto": CIFAR-10 if on disk (or downloadable), else synthetic
    steps: int = 60  # timed optimiser steps (after warm-up)
    warmup_steps: int = 5  # untimed steps first: compile, cuDNN autotune, allocator warm-up
    windows: int = 5  # timed steps are split into this many windows; throughput = median over them
    train_images: int = 50_000  # training-set size (synthetic size, or a cap on CIFAR-10)
    eval_images: int = 2_000  # held-out images for the accuracy figure
    seed: int = 0
    max_seconds: float = 0.0  # time budget of the timed steps (0 = none); a run over it ends "time_limited"
    device: str = "auto"  # "auto", "cpu", "cuda", "cuda:N" or "mps"
    profile: str = "custom"  # which preset this came from (recorded with every result)
    notes: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        _validate(self)

    def replace(self, **changes: Any) -> TrainConfig:
        """A copy with some fields changed; unknown names are rejected, values are validated."""
        _check_names(changes)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("notes")
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        _check_names(data)
        return cls(**data)

    def diff(self, other: TrainConfig) -> dict[str, Any]:
        """Fields whose value in `other` differs from this config."""
        a, b = self.to_dict(), other.to_dict()
        return {k: b[k] for k in a if a[k] != b[k] and k != "profile"}


def field_names() -> set[str]:
    return {f.name for f in dataclasses.fields(TrainConfig) if f.name != "notes"}


def _check_names(names: Any) -> None:
    unknown = sorted(set(names) - field_names())
    if unknown:
        raise ValueError(f"unknown TrainConfig field(s) {unknown}; fields are: {', '.join(sorted(field_names()))}")


def positive_int(what: str, value: Any, minimum: int = 1, why: str = "") -> int:
    """value, or a ValueError naming `what` was given it and what is allowed."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{what}={value!r} is not allowed: an integer >= {minimum}{why}")
    return value


MIN_WORKER_LIMIT = 128  # the floor of max_workers: 6x the cores of a 16-core machine (notebook 01's sweep) is 96


def max_workers() -> int:
    """The most DataLoader workers a config may ask for here: 8 per usable core, at least MIN_WORKER_LIMIT. Each
    worker is a process with its own copy of the dataset and of torch; past a few per core they only wait for each
    other, and thousands exhaust the machine's processes and memory (`[Errno 11] Resource temporarily unavailable`
    after a minute). 8x stays above notebook 01's sweep (up to 6x the cores); the floor lets a run recorded on a
    bigger machine (its config in a results file) be rebuilt on a small one."""
    return max(MIN_WORKER_LIMIT, 8 * measure.usable_cpu_count())


def _fail(name: str, value: Any, allowed: str) -> None:
    raise ValueError(f"TrainConfig.{name}={value!r} is not allowed: {allowed}")


def _validate(c: TrainConfig) -> None:
    for name, allowed in CHOICES.items():
        value = getattr(c, name)
        if value not in allowed:
            _fail(name, value, "choose one of " + ", ".join(repr(a) for a in allowed))
    for name, low in MINIMUMS.items():
        positive_int(f"TrainConfig.{name}", getattr(c, name), low)
    for f in dataclasses.fields(c):
        value = getattr(c, f.name)
        if f.type == "bool" and not isinstance(value, bool):
            _fail(f.name, value, "True or False")
        if f.type == "float" and (isinstance(value, bool) or not isinstance(value, (int, float))):
            _fail(f.name, value, "a number >= 0")
        if f.type == "float" and not math.isfinite(value):  # inf trains into NaN; nan compares False to every limit
            _fail(f.name, value, "a finite number >= 0")
        if f.type == "float" and value < 0:
            _fail(f.name, value, "a number >= 0")
    if c.lr == 0:
        _fail("lr", c.lr, "a number > 0")
    if c.prefetch_factor is not None:
        if isinstance(c.prefetch_factor, bool) or not isinstance(c.prefetch_factor, int) or c.prefetch_factor < 1:
            _fail("prefetch_factor", c.prefetch_factor, "None or an integer >= 1")
        if c.num_workers == 0:
            _fail("prefetch_factor", c.prefetch_factor, "None when num_workers=0 (only worker processes prefetch)")
    if c.num_workers > max_workers():
        _fail("num_workers", c.num_workers, f"at most {max_workers()} here (8 per usable core, at least "
                                            f"{MIN_WORKER_LIMIT}): each worker is a process with its own copy of "
                                            "the dataset")
    if c.persistent_workers and c.num_workers == 0:
        _fail("persistent_workers", True, "False when num_workers=0 (there are no workers to keep)")
    if c.loader == "device" and c.num_workers:
        _fail("num_workers", c.num_workers, "0 with loader='device' (the device loader uses no worker processes)")
    if c.steps < c.windows:
        _fail("windows", c.windows, f"at most steps={c.steps} (each window needs at least one step)")
    dev = c.device
    if not (dev in ("auto", "cpu", "cuda", "mps") or (dev.startswith("cuda:") and dev[5:].isdigit())):
        _fail("device", dev, "'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'")
    if c.profile not in (*PROFILES, CUSTOM.name):
        _fail("profile", c.profile, "one of " + ", ".join(repr(p) for p in (*PROFILES, CUSTOM.name)))
    if c.compile in CUDA_GRAPH_MODES and (c.grad_accum_steps > 1 or not c.set_to_none) and _on_cuda(dev):
        kept = f"grad_accum_steps={c.grad_accum_steps}" if c.grad_accum_steps > 1 else "set_to_none=False"
        _fail("compile", c.compile, f"a mode without CUDA graphs ('default' or 'max-autotune-no-cudagraphs') with "
                                    f"{kept} on a CUDA GPU: each replay writes over the gradients the last one kept")


def _on_cuda(device: str) -> bool:
    """Whether a run of `device` trains on a CUDA GPU ("auto" does where one is available)."""
    return torch.cuda.is_available() if device == "auto" else device.startswith("cuda")


# The profiles (smoke, cpu, gpu, mps, gpu-dry) are plain data in fastlab.profiles: PROFILES maps each name to its
# Profile, whose `settings` are overrides on the TrainConfig defaults above.


def active_profile() -> str:
    """FASTLAB_PROFILE if set, else "gpu" when CUDA is available, "mps" on an Apple GPU, else "cpu"."""
    name = os.environ.get("FASTLAB_PROFILE", "").strip()
    if name:
        if name not in PROFILES:
            raise ValueError(f"FASTLAB_PROFILE={name!r} is not allowed: choose one of {', '.join(PROFILES)}")
        return name
    if torch.cuda.is_available():
        return "gpu"
    return "mps" if mps_available() else "cpu"


def config_for(profile: str | None = None, **changes: Any) -> TrainConfig:
    """The preset for `profile` (default: the active one) with `changes` applied."""
    name = profile or active_profile()
    if name not in PROFILES:  # "custom" names a hand-built config, not a preset
        raise ValueError(f"profile={name!r} is not allowed: choose one of {', '.join(PROFILES)}")
    preset = PROFILES[name]
    data = dict(preset.settings, profile=name)
    if not preset.downloads:
        data["dataset"] = "synthetic"  # a profile that never touches the network (smoke)
    elif os.environ.get("FASTLAB_DATA"):
        data["dataset"] = os.environ["FASTLAB_DATA"]
    return TrainConfig(**data).replace(**changes)


def tta_settings(config: TrainConfig) -> dict[str, Any]:
    """The time-to-accuracy settings of config's profile (fastlab.profiles: Profile.time_to_accuracy)."""
    return profile_of(config).time_to_accuracy


def target_accuracy(config: TrainConfig, synthetic: bool) -> float:
    """The profile's time-to-accuracy target for the synthetic set or for real CIFAR-10."""
    return tta_settings(config)["synthetic" if synthetic else "cifar10"]



# FASTLAB_THOROUGH=1: runs and comparisons get this many times the seconds, and accuracy over seeds THOROUGH_SEEDS.
THOROUGH_SCALE = 4.0
THOROUGH_SEEDS = (0, 1, 2, 3, 4)
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def thorough() -> bool:
    """Whether FASTLAB_THOROUGH asks for the thorough version (more seeds, longer runs) instead of the fast one."""
    value = os.environ.get("FASTLAB_THOROUGH", "").strip().lower()
    if value not in _TRUE + _FALSE:
        raise ValueError(f"FASTLAB_THOROUGH={value!r} is not allowed: choose one of '1' (thorough) or '0' (fast, the "
                         f"default)")
    return value in _TRUE


def time_sizing(profile: str) -> dict[str, float] | None:
    """The profile's time sizing (Profile.time_sizing), scaled by THOROUGH_SCALE under FASTLAB_THOROUGH=1 (less its
    fast-only bounds); None for fixed steps."""
    sizing = _profile(profile).time_sizing
    if sizing is None or not thorough():
        return sizing
    scaled = {k: sizing[k] * THOROUGH_SCALE for k in ("run_seconds", "comparison_seconds", "notebook_seconds")}
    fast_only = ("sweep_seconds", "max_autotune_in_fast")  # the thorough version runs the whole sweep, every mode
    return {**{k: v for k, v in sizing.items() if k not in fast_only}, **scaled,
            "max_steps": int(sizing["max_steps"] * THOROUGH_SCALE)}


def comparison_repeats(config: TrainConfig) -> int:
    """FASTLAB_REPEATS if set (a positive integer), else the profile's (Profile.comparison_repeats: two or more
    let the noise rule tell an effect from the machine drifting between runs); fewer where the
    notebook's budget cut them for the comparison running now (fastlab.budget)."""
    raw = os.environ.get("FASTLAB_REPEATS", "").strip()
    if raw:
        if not raw.isdigit() or int(raw) < 1:
            raise ValueError(f"FASTLAB_REPEATS={raw!r} is not allowed: a positive whole number of repeats")
        repeats = int(raw)
    else:
        repeats = profile_of(config).comparison_repeats
    cap = budget.repeats_cap()
    return repeats if cap is None else min(repeats, cap)


# ------------------------------------------------------------------ what a knob means on this device

def _changed(config: TrainConfig, name: str) -> bool:
    return getattr(config, name) != getattr(TrainConfig, name)  # the class holds each field's default


def fused_optimizer_devices() -> tuple[str, ...]:
    """Device types with fused optimiser kernels in this torch (cuda, cpu and mps in recent versions)."""
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

        return tuple(_get_fused_kernels_supported_devices())
    except (ImportError, AttributeError):  # a private helper: fall back to what torch 2.4+ supports
        return ("cuda", "cpu", "mps")


# torch's CPU checks (aten/src/ATen/native/mkldnn/Matmul.cpp, Utils.h) for running fp32 matmuls in lower precision:
# "high" asks oneDNN for TF32, used only on x86 CPUs with AMX-FP16; "medium" asks for bf16, allowed where oneDNN has
# bf16 support (x86: AVX-512 BW/VL/DQ or AVX-NE-CONVERT; Arm: bf16).
_CPU_TF32_FLAGS = ("amx_fp16",)
_CPU_BF16_FLAG_SETS = ({"avx512bw", "avx512vl", "avx512dq"}, {"avx_ne_convert"}, {"bf16"})


def cpu_matmul_no_op(precision: str, flags: set[str] | None = None) -> str | None:
    """Why matmul_precision=`precision` does nothing on this CPU (flags: its feature flags, default this machine's),
    or None where it may act. On a CPU, torch.set_float32_matmul_precision sets oneDNN's fp32 matmul precision:
    "high" means TF32, which torch uses only with AMX-FP16; "medium" means bf16 where oneDNN supports bf16 (it may
    still run such matmuls in fp32 where it has no kernel for it), and nothing elsewhere (unread flags: may act)."""
    if precision == "highest":
        return None
    flags = cpu_flags() if flags is None else flags
    if precision == "high" and not any(f in flags for f in _CPU_TF32_FLAGS):
        return ("on a CPU, 'high' asks oneDNN for TF32 matmuls, which torch uses only on CPUs with AMX-FP16; this "
                f"CPU ({cpu_model()}) has none, so fp32 matmuls run as with 'highest'")
    if precision == "medium" and flags and not any(need <= flags for need in _CPU_BF16_FLAG_SETS):
        return ("on a CPU, 'medium' lets oneDNN run fp32 matmuls in bf16 only where it supports bf16 (AVX-512 or "
                f"AVX-NE-CONVERT on x86, bf16 on Arm); this CPU ({cpu_model()}) has neither, so fp32 matmuls run as "
                "with 'highest'")
    return None


def no_op_reasons(config: TrainConfig, device: torch.device | str,
                  capability: tuple[int, int] | None = None) -> dict[str, str]:
    """Knob -> why it does nothing on `device`. `capability`: the CUDA compute capability (queried when None)."""
    device = torch.device(device)
    kind = device.type
    out: dict[str, str] = {}
    if config.loader == "device":
        for knob in ("pin_memory", "non_blocking"):
            if _changed(config, knob):
                out[knob] = "the device loader keeps the data on the device: there is no copy to speed up"
    if kind == "cuda":
        if capability is None:
            capability = torch.cuda.get_device_capability(device)
        if _changed(config, "non_blocking") and not config.pin_memory and config.loader == "dataloader":
            out["non_blocking"] = "a copy from pageable (unpinned) memory is synchronous; set pin_memory=True"
        if _changed(config, "tf32") and capability < (8, 0):
            out["tf32"] = (f"TF32 needs an Ampere-or-newer GPU (compute capability 8.0+); this one is "
                           f"{capability[0]}.{capability[1]}, so convolutions run in full fp32 either way")
        if _changed(config, "matmul_precision") and capability < (8, 0):
            out["matmul_precision"] = (f"TF32 and bf16 matmul modes need an Ampere-or-newer GPU (compute capability "
                                       f"8.0+); this one is {capability[0]}.{capability[1]}, so matmuls stay fp32")
        return out
    if config.amp == "bf16" and kind != "cpu" and not bf16_supported(device):
        out["amp"] = f"bf16 autocast is not supported on {kind}; it runs in fp32"
    where = {"mps": "an Apple GPU (mps)", "cpu": "the CPU"}.get(kind, kind)
    if _changed(config, "pin_memory") and "pin_memory" not in out:
        out["pin_memory"] = (f"pinned host memory speeds copies to a CUDA GPU; this run is on {where}"
                             + (", which shares memory with the CPU" if kind == "mps" else ""))
    if _changed(config, "non_blocking") and kind == "cpu" and "non_blocking" not in out:
        out["non_blocking"] = "the batches are already on the CPU: there is no copy to overlap"
    if _changed(config, "cudnn_benchmark"):
        out["cudnn_benchmark"] = f"cuDNN runs only on NVIDIA GPUs; this run is on {where}"
    if _changed(config, "tf32"):
        out["tf32"] = f"TF32 is a mode of NVIDIA Ampere-or-newer GPUs; this run is on {where}"
    if kind == "cpu" and (why := cpu_matmul_no_op(config.matmul_precision)):
        out["matmul_precision"] = why
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
    if config.amp == "bf16" and bf16_is_trap(device):
        out["amp"] = (f"this CPU ({cpu_model()}, {cpu_isa()}) has no native bf16 instructions (no avx512_bf16 or "
                      f"amx_bf16): bf16 autocast converts to fp32 and back around every op, so it runs far slower "
                      f"than fp32 here; one short run shows by how much")
    elif config.amp == "fp16" and device.type == "cpu":
        out["amp"] = (f"fp16 autocast on a CPU ({cpu_model()}, {cpu_isa()}): torch's CPU convolutions have no fast "
                      f"fp16 path, so it runs far slower than fp32 (fp16 with GradScaler is a GPU recipe); one short "
                      f"run shows by how much here")
    return out


def preferred_amp(device: torch.device) -> str:
    """The autocast dtype a run on this device should use: bf16 where it is native, else fp16 (with GradScaler) on
    a GPU and "off" (fp32) on a CPU."""
    if bf16_supported(device):
        return "bf16"
    return "off" if device.type == "cpu" else "fp16"


def low_precision(device: torch.device | str = "auto") -> str:
    """The half precision to compare with fp32 here: preferred_amp, but bf16 (the known trap) where that is "off"."""
    amp = preferred_amp(resolve_device(device) if isinstance(device, str) else device)
    return "bf16" if amp == "off" else amp


def describe_amp(device: torch.device) -> str:
    """preferred_amp(device) and why, in words: what decided it on this hardware."""
    amp = preferred_amp(device)
    if device.type == "cpu":
        cpu = f"{cpu_model()}, {cpu_isa()}"
        if amp == "bf16":
            return f"bf16 (this CPU, {cpu}, has native bf16 instructions)"
        return (f"none, fp32 (this CPU, {cpu}, has no native bf16 instructions: bf16 autocast runs emulated there, "
                f"a known trap, shown in one short run)")
    if device.type == "cuda":
        cap = torch.cuda.get_device_capability(device)
        why = "native bf16" if amp == "bf16" else "bf16 only emulated below 8.0"
        return f"{amp}{' with GradScaler' if amp == 'fp16' else ''} (compute capability {cap[0]}.{cap[1]}: {why})"
    return f"{amp}{' with GradScaler' if amp == 'fp16' else ''} (no native bf16 on {device.type})"


def as_run_here(config: TrainConfig, device: torch.device | str) -> tuple[TrainConfig, dict[str, str], list[str]]:
    """(the config as it runs on `device`, its no-ops, notes): a knob that cannot act here and would fail runs at
    its stock value; emulated bf16 runs, with a note saying so."""
    device = torch.device(device)
    no_ops = no_op_reasons(config, device)
    changes = {knob: stock for knob, stock in (("opt_impl", "default"), ("amp", "off")) if knob in no_ops}
    notes = []
    emulated = config.amp == "bf16" and not bf16_supported(device)
    if emulated and device.type == "cuda":
        notes.append("bf16 is emulated on this GPU (compute capability below 8.0): fp16 with GradScaler is its "
                     "native half precision")
    elif emulated and device.type == "cpu":
        notes.append("this CPU has no native bf16 instructions: bf16 autocast ran emulated (converted to and from "
                     "fp32 around every op)")
    return (config.replace(**changes) if changes else config), no_ops, notes


_NOT_KNOBS = ("seed", "max_seconds", "profile")  # an arm may differ in these and be the same computation
# A trap's one demonstration run: a few timed steps (a median step time), within a time budget, few held-out images.
DEMONSTRATION_STEPS = 3
DEMONSTRATION_SECONDS = 10.0
DEMONSTRATION_EVAL_IMAGES = 16


@dataclass(frozen=True)
class ArmPlan:
    """What to do with one arm: "train" it, skip it as a "no-op" here, or run it once as a "trap" demonstration."""

    kind: str
    reason: str = ""


def plan_arm(baseline: TrainConfig, arm: TrainConfig, device: torch.device | str | None = None) -> ArmPlan:
    """How to run `arm` against `baseline` on `device` (default: the arm's). A knob is a no-op when it is one in
    either config."""
    dev = resolve_device(arm.device) if device is None else torch.device(device)
    changed = [k for k in baseline.diff(arm) if k not in _NOT_KNOBS]
    if not changed:
        return ArmPlan("train")  # the baseline itself (or a repeat of it with another seed)
    idle = {**no_op_reasons(baseline, dev), **no_op_reasons(arm, dev)}
    if all(k in idle for k in changed):
        return ArmPlan("no-op", "; ".join(f"{k}: {idle[k]}" for k in changed))
    traps = trap_reasons(arm, dev)
    hit = [k for k in changed if k in traps]
    if hit:
        return ArmPlan("trap", "; ".join(f"{k}: {traps[k]}" for k in hit))
    return ArmPlan("train")


def demonstration_config(arm: TrainConfig) -> TrainConfig:
    """A short run: one warm-up step, DEMONSTRATION_STEPS timed (or DEMONSTRATION_SECONDS), few held-out images. A
    trap's demonstration, and a cell's own run once its notebook's budget is spent (fastlab.budget.own_run_cut)."""
    budget = min(arm.max_seconds, DEMONSTRATION_SECONDS) if arm.max_seconds else DEMONSTRATION_SECONDS
    return arm.replace(warmup_steps=1, steps=DEMONSTRATION_STEPS, windows=1, max_seconds=budget,
                       eval_images=min(arm.eval_images, arm.batch_size, DEMONSTRATION_EVAL_IMAGES))


# ------------------------------------------------------------------ the command line's flags, built from the fields

def _parse_bool(text: str) -> bool:
    if text.lower() in _TRUE + _FALSE[1:]:
        return text.lower() in _TRUE
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _parse_optional_int(text: str) -> int | None:
    return None if text.lower() == "none" else int(text)


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One --flag per TrainConfig field; defaults stay None so only what was given overrides the profile."""
    for f in dataclasses.fields(TrainConfig):
        if f.name in ("notes", "profile"):
            continue
        kind: Any = {"bool": _parse_bool, "int": int, "float": float, "int | None": _parse_optional_int}.get(
            str(f.type), str)
        parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=kind, default=None,
                            choices=CHOICES.get(f.name), help=f"TrainConfig.{f.name} (default: the profile's)")
