"""Measuring: synchronised clocks, memory, spread and noise, and the environment fingerprint."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import statistics
import time
from dataclasses import dataclass

import torch


def resolve_device(name: str = "auto") -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"TrainConfig.device={name!r} is not allowed here: CUDA is not available; use 'cpu' or 'auto'")
    if name == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
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
    """Peak memory of a run: the CUDA caching allocator's peak (reset per run), else process RSS."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.kind = "cuda_max_allocated" if self.cuda else "process_rss"
        self._process = None
        if not self.cuda:
            import psutil

            self._process = psutil.Process()
        self.peak_mb = 0.0
        self.reset()

    def reset(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        self.peak_mb = self.current_mb()

    def current_mb(self) -> float:
        """Memory in use now, in MiB (allocated tensors on CUDA; resident set on CPU). Never syncs."""
        if self.cuda:
            return torch.cuda.memory_allocated(self.device) / 2**20
        return self._process.memory_info().rss / 2**20

    def sample(self) -> float:
        mb = self.current_mb()
        self.peak_mb = max(self.peak_mb, mb)
        return mb

    def peak(self) -> float:
        if self.cuda:
            return torch.cuda.max_memory_allocated(self.device) / 2**20
        return max(self.peak_mb, self.current_mb())


@dataclass(frozen=True)
class Spread:
    """A median with its min and max over repeated measurements."""

    median: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        if not values:
            return cls(float("nan"), float("nan"), float("nan"), 0)
        return cls(statistics.median(values), min(values), max(values), len(values))

    def relative_spread(self) -> float:
        """(max - min) / median: 0.1 means the windows disagreed by 10% of the median."""
        return (self.high - self.low) / self.median if self.median else float("nan")


def is_noise(a: Spread, b: Spread) -> bool:
    """Two measurements differ by noise when either median lies inside the other's [min, max]."""
    return (b.low <= a.median <= b.high) or (a.low <= b.median <= a.high)


def verdict(base: Spread, other: Spread, unit: str = "images/s") -> str:
    """One sentence comparing two throughputs, calling a difference inside the spread noise."""
    ratio = other.median / base.median if base.median else float("nan")
    head = (f"{other.median:,.0f} vs {base.median:,.0f} {unit} (median; ranges {other.low:,.0f}-{other.high:,.0f} "
            f"and {base.low:,.0f}-{base.high:,.0f})")
    if is_noise(base, other):
        return f"{ratio:.2f}x: noise, the difference is inside the spread; {head}"
    word = "faster" if ratio > 1 else "slower"
    return f"{ratio:.2f}x ({word}); {head}"


def environment(device: torch.device | None = None, profile: str = "custom") -> dict:
    """What a result was measured on: versions, device, CPU count, profile, date."""
    device = device or resolve_device()
    env = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(),
        "torch_threads": torch.get_num_threads(),
        "device_type": device.type,
        "device_name": device_name(device),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "profile": profile,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    try:
        import torchvision

        env["torchvision"] = torchvision.__version__
    except ImportError:
        env["torchvision"] = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env["gpu_memory_gb"] = round(props.total_memory / 2**30, 1)
        env["compute_capability"] = f"{props.major}.{props.minor}"
    return env


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "mps":
        return "Apple MPS"
    return f"CPU ({os.cpu_count()} cores, {platform.machine()})"


def bf16_supported(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu"


def has_tensor_cores(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 7


class GpuUtilSampler:
    """GPU utilisation sampled through NVML in a background thread; inert when NVML is absent."""

    def __init__(self, device: torch.device, interval_s: float = 0.05) -> None:
        self.samples: list[tuple[float, float]] = []
        self.interval_s = interval_s
        self._handle = None
        self._thread = None
        self._stop = None
        if device.type != "cuda":
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
            self._nvml = pynvml
        except Exception:  # NVML missing or no driver: utilisation is simply not sampled
            self._handle = None

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
                    util = self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu
                    self.samples.append((time.perf_counter() - t0, float(util)))
                    self._stop.wait(self.interval_s)

            self._thread = threading.Thread(target=loop, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
