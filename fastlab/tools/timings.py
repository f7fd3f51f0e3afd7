"""How long each notebook took: notebooks/timings.json (written by tests/notebook_timings.py, which also prints
the instructor's guide's table from it), read back by each notebook's first cell (begin_notebook, notebook_time)."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

from .. import budget, calibration, exercise  # noqa: F401  (exercise declares each notebook's exercise a part of its budget)
from ..config import active_profile, config_for, time_sizing

TIMINGS_VERSION = 1
TIMINGS_NAME = "timings.json"
REPO_NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
PACKAGED_NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"  # where a wheel carries them


def timings_path() -> Path:
    """FASTLAB_TIMINGS, else the checkout's or the wheel's notebooks/timings.json, else ./timings.json."""
    env = os.environ.get("FASTLAB_TIMINGS", "").strip()
    if env:
        return Path(env)
    for folder in (REPO_NOTEBOOKS, PACKAGED_NOTEBOOKS):
        if (folder / TIMINGS_NAME).exists():
            return folder / TIMINGS_NAME
    return Path.cwd() / TIMINGS_NAME


def load_timings(path: str | os.PathLike | None = None) -> dict[str, dict[str, dict[str, Any]]]:
    """notebook -> profile -> {"seconds", "date", "machine", "status"}; {} when nothing was measured."""
    path = Path(path) if path is not None else timings_path()
    try:
        doc = json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):  # not JSON, not text, unreadable: a notebook's first cell still runs
        _say_ignored(path, "the whole file (not JSON text)")
        return {}
    if not isinstance(doc, dict) or doc.get("schema_version") != TIMINGS_VERSION:
        return {}
    notebooks = doc.get("notebooks", {})
    if not isinstance(notebooks, dict):
        _say_ignored(path, "'notebooks' (not an object)")
        return {}
    kept: dict[str, dict[str, dict[str, Any]]] = {}
    wrong = []
    for name, profiles in notebooks.items():
        for profile, entry in (profiles.items() if isinstance(profiles, dict) else [("*", None)]):
            if _entry_ok(entry):
                kept.setdefault(name, {})[profile] = entry
            else:
                wrong.append(f"{name}/{profile}")
    if wrong:
        _say_ignored(path, f"{len(wrong)} entr{'y' if len(wrong) == 1 else 'ies'} of the wrong kind ({', '.join(wrong)})")
    return kept


_ENTRY_KINDS = {"seconds": (int, float), "status": str, "machine": str, "date": str}  # what the readers here use
_OPTIONAL_NUMBERS = ("load", "first_result", "core_path", "step_seconds", "budget", "estimate")
_SAID: set[tuple[str, str]] = set()  # (path, what): each said once per kernel, not at every read


def _entry_ok(entry: Any) -> bool:
    """Whether one notebook/profile entry has what notebook_time and begin_notebook read, of the right kinds."""
    if not isinstance(entry, dict):
        return False
    if not all(isinstance(entry.get(k), kind) and not isinstance(entry.get(k), bool) for k, kind in _ENTRY_KINDS.items()):
        return False
    return all(entry.get(k) is None or (isinstance(entry[k], (int, float)) and not isinstance(entry[k], bool))
               for k in _OPTIONAL_NUMBERS)


def _say_ignored(path: Path, what: str) -> None:
    """One line naming the timings file and what of it was ignored (a damaged file never breaks a first cell)."""
    if (str(path), what) not in _SAID:
        _SAID.add((str(path), what))
        print(f"fastlab: {path}: ignored {what}; the notebooks' times read from it say 'not measured yet'")


def begin_notebook(notebook: str, profile: str | None = None) -> str:
    """A notebook's first line: start its time budget (fastlab.budget; none on smoke) and say the budget, the time
    estimated for this machine now (the time measured elsewhere, scaled by this machine's calibrated step against
    that machine's), and the time measured elsewhere."""
    profile = profile or active_profile()
    seconds, estimate, recorded_without_step = estimate_here(notebook, profile)
    budget.start(notebook, profile, seconds)
    if recorded_without_step:
        estimate_note = "not estimated here: the time measured elsewhere was recorded without that machine's step time"
        return budget.describe_estimate(seconds, None, f"{estimate_note}; {notebook_time(notebook, profile)}")
    return budget.describe_estimate(seconds, estimate, notebook_time(notebook, profile))


def estimate_here(notebook: str, profile: str) -> tuple[float | None, float | None, bool]:
    """(the notebook's budget on `profile`, None for fixed steps; the time estimated for this machine now, None where
    it cannot be; whether the time measured elsewhere lacks that machine's step time)."""
    seconds = (time_sizing(profile) or {}).get("notebook_seconds")
    entry = load_timings().get(notebook.removesuffix(".ipynb"), {}).get(profile) or {}
    if seconds is None or not entry:
        return seconds, None, False
    if not (_number(entry.get("seconds")) and _number(entry.get("step_seconds"))):
        return seconds, None, True
    here = calibration.calibrate(config_for(profile)).step_seconds
    return seconds, budget.scaled_estimate(entry["seconds"], entry["step_seconds"], here, seconds), False


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def notebook_time(notebook: str, profile: str | None = None) -> str:
    """How long `notebook` took on `profile` (default: the active one), or that it was not measured."""
    profile = profile or active_profile()
    entry = load_timings().get(notebook.removesuffix(".ipynb"), {}).get(profile)
    if not entry:
        return f"{notebook}: not measured yet on profile {profile}" + thorough_hint(notebook, profile)
    status = "" if entry.get("status") == "ok" else f" (that run ended: {entry.get('status')})"
    cores = re.search(r"(\d+) cores usable", entry["machine"])  # a load above the cores was other work
    busy = (f" while other work kept it busy (load average {entry['load']:g})"
            if entry.get("load") and entry["load"] > (int(cores.group(1)) if cores else 1) + 0.5 else "")
    return (f"{notebook} took {budget.duration(entry['seconds'])} top to bottom on profile {profile}{status}, measured "
            f"{entry['date'][:10]} on {entry['machine']}{busy}; your machine may differ" + thorough_hint(notebook, profile))


def thorough_hint(notebook: str, profile: str) -> str:
    """How to run the thorough version, with its measured time (timings key '<profile>-thorough')."""
    name = notebook.removesuffix(".ipynb")
    if time_sizing(profile) is None or name == "dashboard":  # no time-sized comparison there
        return ""
    entry = load_timings().get(name, {}).get(f"{profile}-thorough")
    took = f"it took {budget.duration(entry['seconds'])} on {entry['machine']}" if entry else "not measured yet"
    return f". The thorough version (more seeds, longer runs): set FASTLAB_THOROUGH=1 before starting ({took})"
