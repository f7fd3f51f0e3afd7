"""Runs sized by time (fastlab.profiles: Profile.time_sizing): a few steps of the baseline, timed once per machine
(cached under its fingerprint), turn a profile's seconds into steps; every arm of a comparison gets the same steps."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
import platform
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from . import budget, measure, train
from .config import TrainConfig, positive_int, time_sizing
from .files import keep_aside, write_json
from .measure import resolve_device

CALIBRATION_WARMUP = 2  # untimed steps first: allocator warm-up, first-call overheads
CALIBRATION_STEPS = 4  # timed steps, each a window of its own
# The fields of a config that set the cost of a step: a calibration is kept per machine and per these.
WORKLOAD_FIELDS = ("model", "batch_size", "grad_accum_steps", "loader", "num_workers", "amp", "channels_last",
                   "compile", "device")
# A cached step time is measured again once older than this, or once the machine is much more or less busy than when
# it was measured (its 1-minute load average per usable CPU moved by more than MAX_LOAD_CHANGE): a step timed while
# other work ran would otherwise size every later run on this machine.
MAX_AGE = _dt.timedelta(days=7)
MAX_LOAD_CHANGE = 0.5

Measure = Callable[[TrainConfig], list[float]]


@dataclass(frozen=True)
class Calibration:
    """What one calibration measured: the median wall time of a step of `workload` on the machine `fingerprint`."""

    step_seconds: float
    workload: dict[str, Any]
    fingerprint: dict[str, Any]
    steps_measured: int
    measured_at: str
    source: str = "measured"  # or "cache": read back from an earlier calibration here
    load_per_cpu: float | None = None  # the 1-minute load average per usable CPU while measured (None: not known)


def fingerprint(device: torch.device) -> dict[str, Any]:
    """The machine a step time belongs to: a calibration measured on another is not reused."""
    return {"cpu_model": measure.cpu_model(), "cpu_isa": measure.cpu_isa(), "cpu_native_bf16": measure.cpu_native_bf16(),
            "usable_cpus": measure.usable_cpu_count(), "torch_threads": torch.get_num_threads(),
            "host": platform.node(), "os_kernel": platform.release(), "torch": torch.__version__,
            "device": measure.device_name(device)}


def cache_path() -> Path:
    """FASTLAB_CALIBRATION_CACHE if set, else ~/.cache/fastlab/calibration.json."""
    given = os.environ.get("FASTLAB_CALIBRATION_CACHE", "").strip()
    return Path(given) if given else Path.home() / ".cache" / "fastlab" / "calibration.json"


def _write_cache(path: Path, entries: dict[str, Any]) -> None:
    """Atomically: two kernels calibrating at once never leave half a file."""
    try:
        write_json(path, entries)
    except OSError:  # a read-only home: the calibration still holds for this kernel
        pass


def _read_cache(path: Path) -> dict[str, Any]:
    """The cache's entries ({} when there is none yet); a file that is not a JSON object is kept aside, never
    overwritten."""
    try:
        entries = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):  # unreadable, not JSON, not text
        entries = None
    if isinstance(entries, dict):
        return entries
    try:
        keep_aside(path, "is not a calibration cache this version reads", "measures anew")
    except OSError:  # a read-only folder: the new calibration is not written over it either (_write_cache)
        pass
    return {}


def load_per_cpu() -> float | None:
    """The machine's 1-minute load average per usable CPU now (None where the OS does not say)."""
    try:
        return os.getloadavg()[0] / max(1, measure.usable_cpu_count())
    except (AttributeError, OSError):  # Windows has no load average
        return None


def unreadable(entry: Any) -> str | None:
    """Why a cached calibration `entry` cannot be used at all (None: it can): its step time not a positive number."""
    seconds = entry.get("step_seconds") if isinstance(entry, dict) else None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds < math.inf:
        return f"its step time ({seconds!r}) is not a positive number of seconds"
    return None


def stale(entry: dict[str, Any], now: _dt.datetime, load: float | None) -> str | None:
    """Why a readable cached calibration `entry` must be measured again at `now` with the load per CPU `load` (None:
    reuse it): older than MAX_AGE, its time unknown, or the load moved by more than MAX_LOAD_CHANGE since."""
    try:
        age = now - _dt.datetime.fromisoformat(entry["measured_at"])
    except (KeyError, TypeError, ValueError):
        return "its time of measurement is unknown"
    if age > MAX_AGE:
        return f"measured {age.days} days ago (more than {MAX_AGE.days})"
    then = entry.get("load_per_cpu")
    if load is not None and then is not None and abs(load - then) > MAX_LOAD_CHANGE:
        return f"measured at a load of {then:.1f} per CPU, {load:.1f} now"
    return None


_KERNEL_CACHE: dict[str, Calibration] = {}  # this kernel's calibrations (the disk cache may be unwritable)


def measure_step_seconds(config: TrainConfig) -> list[float]:
    """Wall times of CALIBRATION_STEPS steps of `config`, each a synchronised window (CUDA launches are async)."""
    short = config.replace(steps=CALIBRATION_STEPS, warmup_steps=CALIBRATION_WARMUP, windows=CALIBRATION_STEPS,
                           max_seconds=0.0, eval_images=min(config.eval_images, config.batch_size))
    result = train.run(short, label="calibration", progress=False)
    return result.window_seconds


def calibrate(config: TrainConfig, measure: Measure | None = None) -> Calibration:
    """The step time of `config` on this machine: from this kernel's or the disk cache (unless stale: too old, or
    measured at another load), else measured now."""
    machine = fingerprint(resolve_device(config.device))
    work = {name: getattr(config, name) for name in WORKLOAD_FIELDS}
    key = hashlib.sha256(json.dumps({"machine": machine, "workload": work}, sort_keys=True).encode()).hexdigest()[:16]
    if key in _KERNEL_CACHE:
        return _KERNEL_CACHE[key]
    path = cache_path()
    entries = _read_cache(path)
    now, load = _dt.datetime.now(_dt.timezone.utc), load_per_cpu()
    why = "not calibrated here yet"
    if key in entries and (bad := unreadable(entries[key])) is not None:  # said: the file was written wrong
        print(f"fastlab: {path}: the calibration of {work} is ignored: {bad}; measuring it again")
    elif key in entries:
        why = stale(entries[key], now, load)
    if why is None:
        try:
            _KERNEL_CACHE[key] = Calibration(**{**entries[key], "source": "cache"})
            return _KERNEL_CACHE[key]
        except TypeError:  # written by another version: measured again
            why = "written by another version"
    seconds = (measure or measure_step_seconds)(config)
    if not seconds:
        raise RuntimeError(f"the calibration of {work} finished no timed step")
    cal = Calibration(step_seconds=statistics.median(seconds), workload=work, fingerprint=machine,
                      steps_measured=len(seconds), measured_at=now.isoformat(timespec="seconds"),
                      load_per_cpu=None if load is None else round(load, 2))
    _KERNEL_CACHE[key] = cal
    entries[key] = asdict(cal)
    _write_cache(path, entries)
    return cal


def seconds_per_run(profile: str, arms: int) -> float | None:
    """Timed seconds for each of `arms` runs (the run time, or the comparison's share if less); None: not sized."""
    sizing = time_sizing(profile)
    if sizing is None:
        return None
    positive_int("arms", arms, why=" (the runs in the comparison)")
    return min(sizing["run_seconds"], sizing["comparison_seconds"] / arms)


def steps_for(cal: Calibration, seconds: float, profile: str, windows: int = 1) -> int:
    """Timed steps that take about `seconds` at the calibrated step time, within the profile's min and max."""
    sizing = time_sizing(profile) or {"min_steps": 1, "max_steps": 10**9}
    steps = int(seconds / cal.step_seconds) if cal.step_seconds > 0 else sizing["max_steps"]
    return max(windows, sizing["min_steps"], min(sizing["max_steps"], steps))


def sized(base: TrainConfig, arms: int, measure: Measure | None = None) -> tuple[TrainConfig, dict[str, Any] | None]:
    """`base` with the steps that fit its profile's time for one of `arms` runs, and how (None: fixed steps)."""
    seconds = seconds_per_run(base.profile, arms)
    if seconds is None or budget.refusal("calibration") is not None:  # fixed steps, or the notebook's time is up
        return base, None
    fewest = time_sizing(base.profile)["min_steps"]  # before calibrating: the shortest run it can size
    train.check_gpu_profile_here(base.replace(steps=max(base.windows, fewest)), resolve_device(base.device))
    cal = calibrate(base, measure)
    steps = steps_for(cal, seconds, base.profile, base.windows)
    record = {**asdict(cal), "seconds_per_run": seconds, "arms": arms, "steps": steps,
              "profile_steps": base.steps}
    return base.replace(steps=steps), record


def describe_sizing(config: TrainConfig) -> str:
    """How the runs of `config`'s profile are sized, in words (for a notebook's first cell)."""
    sizing = time_sizing(config.profile)
    if sizing is None:
        return f"{config.steps} timed steps a run (fixed under the {config.profile} profile)"
    return (f"timed steps sized by time: about {sizing['run_seconds']:g} s a run and {sizing['comparison_seconds']:g} s "
            f"a comparison on this machine ({sizing['min_steps']}-{sizing['max_steps']} steps, from a calibration "
            f"cached in {cache_path()}; each result records it in extras['calibration'])")
