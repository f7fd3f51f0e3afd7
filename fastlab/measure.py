"""Measuring: synchronised clocks, memory, spread and noise, and the environment fingerprint."""

from __future__ import annotations

import contextlib
import datetime as _dt
import math
import os
import platform
import statistics
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import cpu_kind


def mps_available() -> bool:
    """Whether this machine has an Apple GPU torch can use (PyTorch's `mps` device)."""
    return torch.backends.mps.is_available()


def resolve_device(name: str = "auto") -> torch.device:
    """"auto": CUDA if available, else an Apple GPU (mps), else the CPU; a named device must exist here."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"TrainConfig.device={name!r} is not allowed here: CUDA is not available; use 'cpu' or 'auto'")
    if name == "mps" and not mps_available():
        raise ValueError("TrainConfig.device='mps' is not allowed here: MPS is not available; use 'cpu' or 'auto'")
    return torch.device(name)


def synchronize(device: torch.device) -> None:
    """Wait for queued device work, so that a clock read afterwards includes it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def now(device: torch.device) -> float:
    """A clock read that is honest on asynchronous devices: synchronise first."""
    synchronize(device)
    return time.perf_counter()


class MemoryMeter:
    """Peak memory of a run: the CUDA caching allocator's peak (reset per run); on an Apple GPU the largest
    sample of torch.mps.current_allocated_memory() (mps keeps no peak counter); else process RSS."""

    def __init__(self, device: torch.device) -> None:
        import psutil

        self.device, self.cuda, self.mps = device, device.type == "cuda", device.type == "mps"
        # The kind says what the number is: plots and tables print it beside the figure.
        self.kind = ("cuda_max_allocated" if self.cuda else
                     "mps_allocated_peak_of_samples" if self.mps else "process_rss")
        self._process = psutil.Process()
        self.driver_peak_mb = 0.0  # mps only: Metal driver's allocation (the allocator's cache included)
        self.reset()

    def reset(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        self.peak_mb = self.current_mb()
        self.driver_peak_mb = self.driver_mb()

    def current_mb(self) -> float:
        """Memory in use now, in MiB (allocated tensors on CUDA and mps; resident set on CPU). Never syncs."""
        if self.cuda:
            return torch.cuda.memory_allocated(self.device) / 2**20
        if self.mps:
            return torch.mps.current_allocated_memory() / 2**20
        return self._process.memory_info().rss / 2**20

    def driver_mb(self) -> float:
        """mps: all memory the Metal driver holds for this process, in MiB (0 elsewhere)."""
        return torch.mps.driver_allocated_memory() / 2**20 if self.mps else 0.0

    def sample(self) -> float:
        mb = self.current_mb()
        self.peak_mb = max(self.peak_mb, mb)
        if self.mps:
            self.driver_peak_mb = max(self.driver_peak_mb, self.driver_mb())
        return mb

    def peak(self) -> float:
        if self.cuda:
            return torch.cuda.max_memory_allocated(self.device) / 2**20
        return max(self.peak_mb, self.current_mb())


MiB = 2**20


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind `tensors` (a view of another counts once)."""
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())


def record_saved(store: list[torch.Tensor]) -> torch.autograd.graph.saved_tensors_hooks:
    """saved_tensors_hooks that record every tensor autograd saves for backward into `store` (the memory one
    step's activations hold: notebooks 05 and 12)."""
    return torch.autograd.graph.saved_tensors_hooks(lambda t: store.append(t) or t, lambda t: t)


@dataclass(frozen=True)
class Spread:
    """A median with its min and max over repeated measurements (the spread shown), the interval of the median
    that the noise rule uses, and, for a measurement repeated in separate runs, each run's own Spread."""

    median: float
    low: float
    high: float
    n: int
    ci_low: float | None = field(default=None, compare=False)
    ci_high: float | None = field(default=None, compare=False)
    repeats: tuple[Spread, ...] = field(default=(), compare=False)

    @classmethod
    def of(cls, values: list[float], repeats: list[list[float]] | None = None) -> Spread:
        if not values:
            return cls(float("nan"), float("nan"), float("nan"), 0)
        lo, hi = median_interval(values)
        runs = tuple(cls.of(list(r)) for r in repeats or [] if r)
        return cls(statistics.median(values), min(values), max(values), len(values), lo, hi, runs)

    @property
    def interval(self) -> tuple[float, float]:
        """The interval of the median (order statistics, about 95%); [min, max] for a Spread built by hand."""
        return (self.low, self.high) if self.ci_low is None else (self.ci_low, self.ci_high)

    def relative_spread(self) -> float:
        """(max - min) / median: 0.1 means the windows disagreed by 10% of the median."""
        return (self.high - self.low) / self.median if self.median else float("nan")


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """A distribution-free interval of the median (the binomial sign test): the k-th smallest and largest values.
    It narrows as windows are added, where [min, max] widens; up to 8 values it is [min, max]."""
    xs, n = sorted(values), len(values)
    k, below = 0, 0.0  # below = P(Binomial(n, 1/2) <= k - 1)
    while k < n // 2:
        nxt = below + math.comb(n, k) / 2**n
        if 2 * nxt > 1 - confidence:
            break
        below, k = nxt, k + 1
    k = max(k, 1)
    return xs[k - 1], xs[n - k]


def environment(device: torch.device | None = None, profile: str = "custom") -> dict:
    """What a result was measured on: versions, device, CPU count, profile, date."""
    import torchvision

    device = device or resolve_device()
    env = {
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "usable_cpus": usable_cpu_count(),
        "cpu": cpu_model(),
        "cpu_arch": platform.machine(),
        "cpu_isa": cpu_isa(),  # the vector ISA torch's CPU kernels dispatch to (AVX2, AVX512, ...)
        "cpu_native_bf16": cpu_native_bf16(),
        "torch_threads": torch.get_num_threads(),
        "device_type": device.type,
        "device_name": device_name(device),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "profile": profile,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env["gpu_memory_gb"] = round(props.total_memory / 2**30, 1)
        env["compute_capability"] = f"{props.major}.{props.minor}"
    return env


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "mps":
        return f"Apple GPU (mps, {_mac_chip()})"
    return f"CPU ({cpu_model()}, {os.cpu_count()} cores, {cpu_isa()})"  # which CPU: their speeds differ widely


def _mac_chip() -> str:
    """The Mac's chip ("Apple M2 Pro"), or the machine architecture where it cannot be read."""
    import subprocess

    try:
        out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                             timeout=2).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out = ""
    return out or platform.machine()


# /proc/cpuinfo flags of native bf16 (x86: AVX-512 BF16, AMX; Arm: FEAT_BF16). Without one, bf16 autocast on a CPU
# converts to fp32 and back around every op, and can run far slower than fp32.
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")


def _cpuinfo_field(text: str | None, *names: str) -> str:
    """The first value of the first of `names` in /proc/cpuinfo's text (None: this machine's; "" if none)."""
    if text is None:
        try:
            text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:  # no /proc/cpuinfo (macOS, Windows)
            text = ""
    for name in names:
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == name and value.strip():
                return value.strip()
    return ""


def cpu_flags(text: str | None = None) -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo ("flags" on x86, "Features" on Arm); empty where unreadable. This
    machine's are those of FASTLAB_CPU_KIND where it is set (fastlab.cpu_kind)."""
    if text is None and (kind := cpu_kind.kind_flags()) is not None:
        return kind
    return set(_cpuinfo_field(text, "flags", "Features").split())


def cpu_model(text: str | None = None) -> str:
    """The CPU's model name ("AMD EPYC 7B13", "Apple M2 Pro"), or the architecture where it cannot be read."""
    name = _cpuinfo_field(text, "model name", "Model", "Hardware", "cpu model")
    if not name and platform.system() == "Darwin":
        name = _mac_chip()
    return name or platform.processor() or platform.machine()


def cpu_isa() -> str:
    """The instruction set torch's CPU kernels use here ("AVX2", "AVX512", "DEFAULT", ...), or "unknown"."""
    try:
        return torch.backends.cpu.get_cpu_capability()
    except RuntimeError:
        return "unknown"


def cpu_native_bf16(flags: set[str] | None = None) -> bool:
    """Whether this CPU has bf16 instructions: from /proc/cpuinfo's flags where it lists them, else oneDNN's own
    check, else False."""
    flags = cpu_flags() if flags is None else flags
    if flags:
        return any(f in flags for f in NATIVE_BF16_FLAGS)
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (RuntimeError, AttributeError):
        return False


def bf16_supported(device: torch.device) -> bool:
    """Native bf16 only: compute capability 8.0+ on CUDA (is_bf16_supported() also counts emulation), the CPU's own
    instructions on a CPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device) >= (8, 0)
    return device.type == "cpu" and cpu_native_bf16()


def bf16_is_trap(device: torch.device) -> bool:
    """bf16 autocast on a CPU without native bf16: the known trap, worth one short run rather than full arms."""
    return device.type == "cpu" and not bf16_supported(device)


_ASSUMED_CORES: int | None = None  # set by assumed_cores: another machine's count, for an estimate of its time


@contextlib.contextmanager
def assumed_cores(count: int) -> Iterator[None]:
    """While the block runs, usable_cpu_count() is `count`: what is sized by the cores (01's worker sweep, 10's
    loader) is sized as on a machine with that many (tests/gpu_estimate.py: the reference machine's)."""
    global _ASSUMED_CORES
    saved, _ASSUMED_CORES = _ASSUMED_CORES, count
    try:
        yield
    finally:
        _ASSUMED_CORES = saved


def usable_cpu_count() -> int:
    """Cores this process may run on: a container's or a job's share, not the host's total (os.cpu_count)."""
    if _ASSUMED_CORES is not None:
        return _ASSUMED_CORES
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def has_tensor_cores(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 7


def nvml_device_key(index: int, visible: str | None, uuid: str | None = None) -> tuple[str, int | str]:
    """("index", n) or ("uuid", "GPU-..."/"MIG-..."): how NVML, which ignores CUDA_VISIBLE_DEVICES, finds CUDA
    device `index`. Without CUDA_VISIBLE_DEVICES, `uuid` (cuda_uuid) decides: NVML may number devices otherwise."""
    if not visible or not visible.strip():
        return ("uuid", uuid) if uuid else ("index", index)
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if index >= len(entries):
        raise ValueError(f"CUDA device {index} is not among CUDA_VISIBLE_DEVICES={visible!r}")
    return ("index", int(entries[index])) if entries[index].isdigit() else ("uuid", entries[index])


def cuda_uuid(index: int) -> str | None:
    """NVML's name ("GPU-<uuid>") of CUDA device `index` as torch numbers it, or None where torch cannot say."""
    try:
        raw = str(torch.cuda.get_device_properties(index).uuid)
    except Exception:  # an older torch, a ROCm build without it, or no device: fall back to the index
        return None
    if not raw:
        return None
    return raw if raw.startswith(("GPU-", "MIG-")) else f"GPU-{raw}"


def _nvml_handle(pynvml, index: int):
    """NVML's handle of CUDA device `index`: by torch's UUID where it has one (falling back to the index when
    NVML does not know it, as for a MIG slice), else as CUDA_VISIBLE_DEVICES maps it."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    how, key = nvml_device_key(index, visible, None if visible and visible.strip() else cuda_uuid(index))
    if how == "uuid":
        try:
            return pynvml.nvmlDeviceGetHandleByUUID(key)
        except Exception:
            if visible and visible.strip():
                raise  # the visible list named this UUID: no index to fall back on
            return pynvml.nvmlDeviceGetHandleByIndex(index)
    return pynvml.nvmlDeviceGetHandleByIndex(key)


class GpuUtilSampler:
    """GPU utilisation of torch's device, sampled through NVML in a background thread; where NVML or the GPU
    cannot report it (MIG slices), nothing is sampled and `unavailable` says why."""

    def __init__(self, device: torch.device, interval_s: float = 0.05) -> None:
        self.samples: list[tuple[float, float]] = []
        self.interval_s, self.unavailable = interval_s, None
        self._handle = self._thread = None
        if device.type != "cuda":
            self.unavailable = f"utilisation is sampled on CUDA GPUs only; this run is on {device.type}"
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            index = device.index if device.index is not None else torch.cuda.current_device()
            handle = _nvml_handle(pynvml, index)
            pynvml.nvmlDeviceGetUtilizationRates(handle)  # the probe: raises where it is not supported
            self._handle, self._nvml = handle, pynvml
        except Exception as e:  # NVML missing, no driver, or a MIG slice: say so instead of dying in a thread
            self.unavailable = f"utilisation not available: {type(e).__name__}: {e}"

    @property
    def available(self) -> bool:
        return self._handle is not None

    def __enter__(self) -> GpuUtilSampler:
        if self.available:
            import threading

            self._stop = threading.Event()
            t0 = time.perf_counter()

            def loop() -> None:
                while not self._stop.is_set():
                    try:
                        util = self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu
                    except Exception as e:  # stop sampling, keep what arrived, and say why
                        self.unavailable = f"utilisation sampling stopped: {type(e).__name__}: {e}"
                        return
                    self.samples.append((time.perf_counter() - t0, float(util)))
                    self._stop.wait(self.interval_s)

            self._thread = threading.Thread(target=loop, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()


# cuBLAS and cuDNN report a failed allocation in their own words; each is an out-of-memory all the same.
OOM_MARKERS = ("out of memory", "can't allocate memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED")


def is_out_of_memory(error: BaseException) -> bool:
    return isinstance(error, torch.cuda.OutOfMemoryError) or (
        isinstance(error, RuntimeError) and any(m in str(error) for m in OOM_MARKERS))
