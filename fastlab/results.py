"""RunResult: what one training run measured; JSON files of results, written atomically."""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import budget
from .files import write_json
from .measure import Spread
from .version import __version__

SCHEMA_VERSION = 1
REFERENCE_DIR = Path(__file__).parent / "reference"


MOVED_FROM_EXTRAS = ("repeats", "repeat_windows", "window_seconds", "tta_curve", "stopped_by", "kept_loss_tensors",
                     "rung", "dropped", "trap", "comparison", "tta")


@dataclass
class TtaRecord:
    """A run's time to accuracy (fastlab.outcomes.time_to_accuracy), read from its checkpoints (RunResult.tta_curve):
    the first that reached the target, or why none did."""

    target: float
    reached: bool = False
    seconds: float | None = None  # training seconds up to the checkpoint that reached the target
    steps: int | None = None
    best_accuracy: float | None = None  # None: stopped before its first evaluation
    why_not: str | None = None  # why it did not reach the target ("step budget spent", "diverged" ...)
    seeds_not_run: str = ""  # on a rung's first seed: why the seeds after it were not run

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TtaRecord:
        """From a results file; keys that are no longer fields (the curve, images) are left out."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class RunResult:
    config: dict[str, Any]
    label: str = "run"
    status: str = "ok"  # "ok", "failed", "interrupted", "time_limited", "diverged" or "no_op" (not trained)
    error: str | None = None
    diverged_step: int | None = None  # first step whose loss (or grad scale, or parameters) was non-finite
    last_finite_loss: float | None = None  # the last finite training loss read before it diverged
    steps_done: int = 0  # optimiser steps finished, warm-up included
    images_per_step: int = 0
    window_throughput: list[float] = field(default_factory=list)  # images/s of each timed window
    warmup_seconds: float = 0.0  # wall time of the untimed warm-up steps (compile, autotune)
    timed_seconds: float = 0.0
    step_seconds: list[float] = field(default_factory=list)  # host wall time of each step, data wait included
    data_wait_seconds: list[float] = field(default_factory=list)  # host time blocked on next(batches), per step
    # each sampled warm-up step's host-to-device copy, up to a sync (on CUDA it may hold queued kernels too)
    copy_seconds: list[float] = field(default_factory=list)
    losses: list[tuple[int, float]] = field(default_factory=list)  # (step, training loss)
    eval_accuracy: float | None = None
    eval_seconds: float | None = None
    eval_peak_memory_mb: float | None = None
    peak_memory_mb: float = 0.0  # training peak (CUDA max allocated, or process RSS on CPU)
    memory_kind: str = ""
    memory_trace_mb: list[float] = field(default_factory=list)  # memory in use after each step
    no_ops: dict[str, str] = field(default_factory=dict)  # knob -> why it did nothing here
    comparison: str = ""  # the registered comparison it belongs to (fastlab.comparisons): its reference results
    rung: str = ""  # the ladder rung this run measured (fastlab.bench.ladder); "" off the ladder
    dropped: str = ""  # why the ladder did not build on this rung ("" where it did)
    trap: str = ""  # why this config is a known trap here (config.plan_arm): it ran as one short run
    budget_cut: str = ""  # what the notebook's spent budget did (fastlab.budget): budget.NOT_STARTED, or budget.CUT ...
    env: dict[str, Any] = field(default_factory=dict)
    dataset: dict[str, Any] = field(default_factory=dict)
    gpu_util: list[tuple[float, float]] = field(default_factory=list)  # (seconds, NVML utilisation %)
    grad_scale: list[float] = field(default_factory=list)  # GradScaler scale after each step (fp16 only)
    # sampled warm-up steps, bracketed by syncs: the optimiser step, its whole step, its forward and backward
    optimizer_step_seconds: list[float] = field(default_factory=list)
    sampled_step_seconds: list[float] = field(default_factory=list)
    forward_seconds: list[float] = field(default_factory=list)
    backward_seconds: list[float] = field(default_factory=list)
    # repeats: runs merged into this arm (merge_repeats), 1 for a run alone, 0 for one fastlab.run did not make
    repeats: int = 0
    repeat_windows: list[list[float]] = field(default_factory=list)
    window_seconds: list[float] = field(default_factory=list)  # wall seconds of each timed window
    # time to accuracy: [training seconds (warm-up included), steps, held-out accuracy] at each checkpoint
    tta_curve: list[list[float]] = field(default_factory=list)
    tta: TtaRecord | None = None  # what the curve says of the target (time_to_accuracy's runs only)
    stopped_by: str = ""  # a time_limited run's limit: "max_seconds" (the harness's budget) or "max_training_seconds"
    kept_loss_tensors: int | None = None  # log_loss="tensor": how many loss tensors (and their graphs) were kept
    extras: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        """The summary line, not every list the run recorded."""
        return f"<RunResult {self.summary()}>"

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def not_started(self) -> bool:
        """A run the notebook's spent budget did not let start."""
        return self.budget_cut == budget.NOT_STARTED

    @property
    def throughput(self) -> Spread:
        """Images/s over the timed windows of every repeat; a run alone is its own one repeat, so the noise rule
        knows it was not interleaved (verdicts.single_pair)."""
        alone = [self.window_throughput] if self.repeats == 1 else None
        return Spread.of(self.window_throughput, self.repeat_windows or alone)

    @property
    def synthetic(self) -> bool:
        return bool(self.dataset.get("synthetic"))

    @property
    def data_name(self) -> str:
        """What a plot or table says of the data: SYNTHETIC in capitals, so no one reads it as CIFAR-10."""
        return "SYNTHETIC data" if self.synthetic else f"real {self.dataset.get('name', '?')}"

    def data_wait_fraction(self) -> float:
        """Share of timed step time spent waiting for data: sum(data wait) / sum(step time)."""
        warm = int(self.config.get("warmup_steps", 0))
        total = sum(self.step_seconds[warm:])
        return sum(self.data_wait_seconds[warm:]) / total if total else float("nan")

    def copy_fraction(self) -> float:
        """Share of step time spent in the host-to-device copy; nan on a CPU run or without copy times."""
        n = len(self.sampled_step_seconds)
        if self.copy_seconds and len(self.copy_seconds) == n:  # the sampled warm-up steps (steps 1..n) only
            total, copies = sum(self.step_seconds[1:n + 1]), self.copy_seconds
        else:  # every step's copy (results saved by earlier versions)
            warm = int(self.config.get("warmup_steps", 0))
            total, copies = sum(self.step_seconds[warm:]), self.copy_seconds[warm:]
        if not (total and copies) or self.env.get("device_type", "cpu") == "cpu":
            return float("nan")
        return sum(copies) / total

    def optimizer_share(self) -> float:
        """Share of a (sampled, synchronised) step spent in optimizer.step(); nan when not sampled."""
        total = sum(self.sampled_step_seconds)
        return sum(self.optimizer_step_seconds) / total if total else float("nan")

    def _stopped(self) -> str:
        """Why the run stopped short: its status and error, in the words summary() uses."""
        if self.status == "no_op":
            return f"NOT TRAINED: {self.error or 'every change is a no-op here'}"
        return f"{self.status.upper().replace('_', ' ')}: {self.error or 'stopped early'}"

    def warmup_words(self) -> str:
        """'warm-up 1.23 s for 5 steps' (the untimed warm-up's wall time), or why this run has no warm-up figure: it
        never trained (a no-op, or a run the notebook's budget did not start) or stopped before its warm-up ended. A
        figure is printed only for what ran."""
        if self.status == "no_op" or self.not_started:
            return f"warm-up did not run ({self._stopped()})"
        warm = self.config.get("warmup_steps")
        if warm is not None and self.steps_done < int(warm):
            return f"warm-up did not finish ({self.steps_done} of its {warm} steps ran; {self._stopped()})"
        if warm == 0:
            return "no warm-up steps"
        return f"warm-up {self.warmup_seconds:.2f} s" + (f" for {warm} steps" if warm else "")

    def timed_steps(self) -> int | None:
        """Steps inside the timed windows (images timed / images per step), None where that cannot be read."""
        if not self.images_per_step or len(self.window_seconds) != len(self.window_throughput):
            return None
        return round(sum(t * s for t, s in zip(self.window_throughput, self.window_seconds)) / self.images_per_step)

    def timed_words(self) -> str:
        """'timed 4.56 s for 60 steps' (the timed windows' wall time), or why there is no timed figure: no timed
        window finished (not trained, stopped, failed)."""
        if not self.window_throughput:
            return f"no timed window ({self._stopped()})"
        steps = self.timed_steps()
        n = len(self.window_throughput)
        over = f"{steps} steps" if steps is not None else f"{n} window{'s' if n > 1 else ''}"
        return f"timed {self.timed_seconds:.2f} s for {over}"

    def summary(self) -> str:
        data = "synthetic data" if self.synthetic else self.dataset.get("name", "?")
        if self.status == "failed":
            after = f"after {self.steps_done} steps"  # said once: the error may say it already
            return f"{self.label}: FAILED ({self.error})" + (f" {after}" if self.steps_done and after not in
                                                             str(self.error) else "")
        if self.status == "no_op":
            return f"{self.label}: NOT TRAINED: {self.error}"
        short = f", a short run: {self.budget_cut}" if self.budget_cut.startswith(budget.CUT) else ""
        if not self.window_throughput:
            return (f"{self.label}: {self.status.upper().replace('_', ' ')}, no timed window finished "
                    f"({self.error or 'stopped early'}; {step_time(self)}), {data}{short}")
        t, wait, copy = self.throughput, self.data_wait_fraction(), self.copy_fraction()  # NaN: not measured
        split = f"data wait {'not measured' if wait != wait else f'{wait:.0%}'}"
        split += "" if copy != copy else f", copy to device {copy:.0%}"
        parts = [f"{self.label}: {t.median:,.0f} images/s (min {t.low:,.0f}, max {t.high:,.0f}, {t.n} windows)",
                 f"peak memory {self.peak_memory_mb:,.0f} MiB", split]
        if self.eval_accuracy is not None:
            parts.append(f"held-out accuracy {self.eval_accuracy:.1%}")
        parts.append(data)
        if self.status == "interrupted":
            parts.append(f"INTERRUPTED after {self.steps_done} steps")
        if self.status == "time_limited":
            parts.append(f"TIME LIMITED: {self.error}")
        if self.status == "diverged":
            parts.insert(1, f"DIVERGED: {self.error} (speed not credited)")
        return ", ".join(parts) + short

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunResult:
        names = {f.name for f in dataclasses.fields(cls)}
        kept = {k: v for k, v in data.items() if k in names}
        extras = dict(kept.get("extras") or {})
        for key, name in [*((k, k) for k in MOVED_FROM_EXTRAS), ("budget", "budget_cut")]:
            if key in extras and name not in data:  # files written before these were fields kept them in extras
                kept[name] = extras.pop(key)
        if isinstance(kept.get("tta"), dict):
            curve = kept["tta"].get("curve")  # files written before tta was a field held the curve twice
            if curve and not kept.get("tta_curve"):
                kept["tta_curve"] = curve
            kept["tta"] = TtaRecord.from_dict(kept["tta"])
        return cls(**{**kept, "extras": extras})


def timed_steps(r: RunResult) -> list[float]:
    """The seconds of a run's steps past its warm-up."""
    return r.step_seconds[int(r.config.get("warmup_steps", 0)):]


def median_step_seconds(runs: RunResult | Sequence[RunResult]) -> float:
    """The one step-time figure of a run (or of runs pooled): the median of each run's timed steps, or of every step
    it finished (warm-up included) when no timed step finished (a trap's short run); nan when no step finished. Host
    wall time, data wait included, as RunResult.step_seconds records it."""
    steps = [s for r in ([runs] if isinstance(runs, RunResult) else runs) for s in (timed_steps(r) or r.step_seconds)]
    return statistics.median(steps) if steps else float("nan")


def step_time(r: RunResult) -> str:
    """median_step_seconds in words, and over which steps: what every summary, report and plot says of a run's step."""
    timed = len(timed_steps(r))
    if not r.step_seconds:
        return "no step finished"
    over = (f"{timed} timed step{'s' if timed != 1 else ''}" if timed else
            f"{len(r.step_seconds)} warm-up step{'s' if len(r.step_seconds) != 1 else ''}, no timed step finished")
    return f"median step {median_step_seconds(r):.2f} s ({over})"


def merge_repeats(repeats: list[RunResult]) -> RunResult:
    """One arm's runs as one result: every run's windows (pooled and per run), the top peak, the first bad status.
    A repeat the notebook's budget did not let start (fastlab.budget) is left out where another ran: the merged
    result says how many were cut (extras["budget_cut_repeats"]) instead of wearing its status."""
    ran = [r for r in repeats if not r.not_started]
    if ran and len(ran) < len(repeats):
        kept = merge_repeats(ran)
        kept.extras["budget_cut_repeats"] = len(repeats) - len(ran)
        return kept
    first = repeats[0]
    if len(repeats) == 1:
        return first
    merged = dataclasses.replace(first, extras=dict(first.extras))
    merged.window_throughput = [w for r in repeats for w in r.window_throughput]
    merged.repeat_windows = [list(r.window_throughput) for r in repeats]
    merged.window_seconds = [s for r in repeats for s in r.window_seconds]
    merged.repeats = len(repeats)
    merged.timed_seconds = sum(r.timed_seconds for r in repeats)
    merged.peak_memory_mb = max(r.peak_memory_mb for r in repeats)
    bad = next((r for r in repeats if r.status != "ok"), None)
    if bad is not None:
        merged.status, merged.error = bad.status, bad.error
    return merged


def save_results(path: str | os.PathLike, results: list[RunResult], meta: dict[str, Any] | None = None) -> Path:
    """Write results as JSON atomically (write_json)."""
    return write_json(Path(path), {"schema_version": SCHEMA_VERSION, "fastlab": __version__, "meta": meta or {},
                                   "results": [r.to_dict() for r in results]})


def load_document(path: str | os.PathLike) -> dict[str, Any]:
    """A results file's document, checked field by field: a file that is not one (binary, not JSON, another schema
    version, a field of the wrong kind) is a ValueError naming its path and what is wrong, never a KeyError later."""
    path = Path(path)
    try:
        doc = json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"no results file at {path}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not a fastlab results file (binary, not JSON text). Give the path of a "
                         "results.json written by fastlab") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not a fastlab results file (invalid JSON: {e})") from None
    version = doc.get("schema_version") if isinstance(doc, dict) else None
    if version != SCHEMA_VERSION:
        raise ValueError(f"{path} was written with results schema version {version!r}; this fastlab reads version "
                         f"{SCHEMA_VERSION}. Re-run the measurement with this version to regenerate it.")
    wrong = _wrong_in_document(doc)
    if wrong:
        raise ValueError(f"{path} is not a fastlab results file ({wrong}). Re-run the measurement to regenerate it")
    return doc


def _wrong_in_document(doc: dict[str, Any]) -> str:
    """What is wrong in a results document of the right version ('' when nothing): the first field whose value is
    not of its RunResult field's kind, named by where it is (results[2].status)."""
    if "results" not in doc:
        return "no 'results' list"
    if not isinstance(doc["results"], list):
        return f"'results' is {type(doc['results']).__name__}, not a list"
    if not isinstance(doc.get("meta", {}), dict):
        return f"'meta' is {type(doc['meta']).__name__}, not an object"
    kinds = {f.name: str(f.type) for f in dataclasses.fields(RunResult)}
    for i, r in enumerate(doc["results"]):
        if not isinstance(r, dict):
            return f"results[{i}] is {type(r).__name__}, not an object"
        for name, value in r.items():
            if name in kinds and not _of_kind(value, kinds[name]):
                return f"results[{i}].{name} is {value!r:.40}, not {kinds[name]}"
    return ""


def _of_kind(value: Any, kind: str) -> bool:
    """Whether a JSON value fits a RunResult field's annotation (as written: 'float | None', 'list[float]'...)."""
    if value is None:
        return "None" in kind
    base = kind.split(" | ")[0]
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if base in ("int", "float"):
        return number and (base == "float" or isinstance(value, int))
    if base == "list[float]":
        return isinstance(value, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
    expected = {"str": str, "bool": bool}.get(base) or (list if base.startswith("list") else dict)
    return isinstance(value, expected)


def load_results(path: str | os.PathLike) -> list[RunResult]:
    return [RunResult.from_dict(r) for r in load_document(path)["results"]]


def load_reference() -> dict[str, list[RunResult]]:
    """Bundled results measured on real GPUs, by device name; empty when none is bundled yet."""
    out: dict[str, list[RunResult]] = {}
    for path in sorted(REFERENCE_DIR.glob("*.json")):
        results = load_results(path)
        if results:
            out[results[0].env.get("device_name", path.stem)] = results
    return out


def reference_for(comparison: str) -> dict[str, list[RunResult]]:
    """Bundled reference results of one comparison (RunResult.comparison), by device name."""
    matching = {device: [r for r in results if r.comparison == comparison]
                for device, results in load_reference().items()}
    return {device: results for device, results in matching.items() if results}


def reference_summary(*comparisons: str) -> str:
    """The bundled reference results of these comparisons, a line each; one notice for all that have none."""
    lines, missing = [], []
    for comparison in comparisons:
        found = reference_for(comparison)
        missing += [] if found else [f"'{comparison}'"]
        for device, results in found.items():
            lines.append(f"Reference, measured on {device} ({results[0].env.get('date', '?')}):")
            lines += [f"  {r.summary()}" for r in results]
    if missing:
        lines.append(f"No reference results from fastlab's harness on a real GPU are bundled yet for "
                     f"{', '.join(missing)}.")
    return "\n".join(lines)
