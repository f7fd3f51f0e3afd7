"""Time each notebook top to bottom under each CPU profile and record it in notebooks/timings.json.

    python tests/notebook_timings.py                                   # every notebook, smoke then cpu
    python tests/notebook_timings.py --profiles smoke 01_data_loading  # some notebooks, one profile

Each notebook runs in a fresh kernel (as a reader's would) with FASTLAB_PROFILE set, its claim verdicts kept in a
temporary folder (never the reader's store), and nothing written back into the notebook. The wall seconds, the
date, the machine, the machine's load average and how the run ended go into the timings file (record_timing), which
the notebooks' first cells (fastlab.tools.timings) and docs/workshop.md (timings_table) print from. A timeout or an
error is recorded as such.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import tempfile
import time
from pathlib import Path

from fastlab import budget
from fastlab.files import write_json
from fastlab.tools.timings import TIMINGS_VERSION, estimate_here, load_timings

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"


def machine() -> str:
    from fastlab.measure import cpu_isa, cpu_model, usable_cpu_count

    return f"CPU ({cpu_model()}, {cpu_isa()}, {usable_cpu_count()} cores usable), no GPU"


FIRST_RESULT_TAG = "first-result"  # the cell whose end is a notebook's first result (the dashboard's baseline)


def _stamp(text: str) -> float:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def first_result_seconds(nb) -> float | None:
    """Seconds from the first cell's start to the end of the cell tagged FIRST_RESULT_TAG (nbclient's own
    execution timestamps), or None when no cell is tagged or it did not run."""
    ran = [c for c in nb.cells if c.cell_type == "code" and "iopub.execute_input" in c.metadata.get("execution", {})]
    tagged = [c for c in ran if FIRST_RESULT_TAG in c.metadata.get("tags", [])]
    if not ran or not tagged or "shell.execute_reply" not in tagged[0].metadata["execution"]:
        return None
    return _stamp(tagged[0].metadata["execution"]["shell.execute_reply"]) - _stamp(
        ran[0].metadata["execution"]["iopub.execute_input"])


def core_path_seconds(nb) -> float | None:
    """Seconds from the first cell's start to the end of the last code cell before the markdown cell headed
    "## Going further" (a workshop slot's core path), or None without that heading or when a core cell did not run."""
    heading = next((i for i, c in enumerate(nb.cells) if c.cell_type == "markdown"
                    and "".join(c.source).lstrip().startswith(GOING_FURTHER)), None)
    core = [c for c in nb.cells[:heading] if c.cell_type == "code"] if heading is not None else []
    timed = [c.metadata.get("execution", {}) for c in core]
    if not core or not all("iopub.execute_input" in t and "shell.execute_reply" in t for t in timed):
        return None
    return _stamp(timed[-1]["shell.execute_reply"]) - _stamp(timed[0]["iopub.execute_input"])


GOING_FURTHER = "## Going further"  # the heading that ends a notebook's core path (tests/test_notebooks.py)


def time_notebook(path: Path, profile: str, timeout: float, keep: Path | None = None
                  ) -> tuple[float, str, float, float | None, float | None]:
    """(wall seconds, "ok" / "timeout" / "error: ...", mean 1-minute load average over the run, seconds to the
    first result where a cell is tagged for it, seconds to the end of the core path where there is one)."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    os.environ["FASTLAB_PROFILE"] = profile
    os.environ["FASTLAB_RESULTS_DIR"] = tempfile.mkdtemp(prefix="fastlab-timing-results-")
    os.environ["FASTLAB_SOLUTION"] = "1"  # each exercise measures its solution, as it would a learner's edit
    os.environ.setdefault("MPLBACKEND", "Agg")
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    status = "ok"
    try:
        client.execute()
    except CellTimeoutError:
        status = "timeout"
    except CellExecutionError as e:
        status = f"error: {e.ename}"
    seconds = time.perf_counter() - t0
    if keep is not None:  # the executed copy, with each cell's timestamps: where the time went
        keep.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, keep / f"{path.stem}.{profile}.ipynb")
    return seconds, status, (load0 + os.getloadavg()[0]) / 2, first_result_seconds(nb), core_path_seconds(nb)


def record_timing(path: str | os.PathLike, notebook: str, profile: str, seconds: float, status: str,
                  machine: str, date: str | None = None, load: float | None = None,
                  first_result: float | None = None, core_path: float | None = None,
                  step_seconds: float | None = None, budget_seconds: float | None = None,
                  estimate: float | None = None) -> None:
    """Set one notebook's time on one profile, atomically, keeping the other entries. load: the 1-minute load
    average while it ran; first_result: seconds to its tagged first result; core_path: seconds to "## Going further";
    step_seconds: the calibrated step of the profile's config on that machine (scales the time to another);
    budget_seconds and estimate: the notebook's budget there and the time its first line estimated before it ran."""
    path = Path(path)
    notebooks = load_timings(path)
    entry = {"seconds": round(float(seconds), 1), "status": status, "machine": machine,
             "date": date or datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    optional = {"load": load, "first_result": first_result, "core_path": core_path, "budget": budget_seconds,
                "estimate": estimate}
    entry.update({k: round(float(v), 1) for k, v in optional.items() if v is not None})
    if step_seconds is not None:
        entry["step_seconds"] = float(f"{step_seconds:.4g}")
    notebooks.setdefault(notebook.removesuffix(".ipynb"), {})[profile] = entry
    doc = {"schema_version": TIMINGS_VERSION, "notebooks": dict(sorted(notebooks.items()))}
    write_json(path, doc, sort_keys=True)


def timings_table(profiles: tuple[str, ...] = ("smoke", "cpu"), path: str | os.PathLike | None = None) -> str:
    """A markdown table of each notebook's time per profile, with the machines and dates behind them."""
    data = load_timings(path)
    if not data:
        return "No notebook has been timed yet: run `python tests/notebook_timings.py`."
    rows = ["| notebook | " + " | ".join(f"{p} profile" for p in profiles) + " |",
            "| --- | " + " | ".join("---" for _ in profiles) + " |"]
    entries = [e for by_profile in data.values() for p, e in by_profile.items() if p in profiles and e]
    for name, by_profile in sorted(data.items()):
        cells = []
        for e in map(by_profile.get, profiles):
            if not e:
                cells.append("not measured yet")
                continue
            planned = [f"budget {budget.duration(e['budget'])}"] if e.get("budget") else []
            planned += [f"estimated {budget.duration(e['estimate'])}"] if e.get("estimate") else []
            first = f" ({', '.join(planned)} before it ran)" if planned else ""
            first += f"; first result after {budget.duration(e['first_result'])}" if e.get("first_result") else ""
            first += f"; core path {budget.duration(e['core_path'])}" if e.get("core_path") else ""
            cells.append(budget.duration(e["seconds"]) + ("" if e.get("status") == "ok" else f" ({e.get('status')})") + first)
        rows.append(f"| `{name}` | " + " | ".join(cells) + " |")
    totals = [sum(by_profile[p]["seconds"] if by_profile.get(p) else math.nan for by_profile in data.values())
              for p in profiles]
    rows.append("| the whole workbook | " + " | ".join(
        "not all measured" if math.isnan(t) else budget.duration(t) for t in totals) + " |")
    machines = sorted({(e["machine"], e["date"][:10]) for e in entries})
    loads = [e["load"] for e in entries if e.get("load") is not None]
    rows += ["", "Measured on: " + "; ".join(f"{m} ({d})" for m, d in machines) + "."]
    if loads:
        rows.append(f"The machine's 1-minute load average during these runs: {min(loads):g} to {max(loads):g} "
                    "(other work on it slows a notebook down).")
    return "\n".join(rows)


TABLE_START = "<!-- timings table:"
TABLE_END = "<!-- end of timings table -->"


def with_timings_table(text: str, table: str) -> str:
    """`text` (docs/workshop.md) with the block between the table markers replaced by `table`."""
    start, end = text.find(TABLE_START), text.find(TABLE_END)
    if start < 0 or end < start:
        raise ValueError(f"no timings table block ({TABLE_START!r} ... {TABLE_END!r}) in the text")
    head_end = text.index("\n", start) + 1
    return text[:head_end] + "\n" + table + "\n" + text[end:]



def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="*", help="names (with or without .ipynb); default: all")
    parser.add_argument("--profiles", default="smoke,cpu", help="comma-separated CPU profiles (default smoke,cpu)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds a cell may run (default 1800)")
    parser.add_argument("--out", default=str(NOTEBOOKS / "timings.json"))
    parser.add_argument("--keep", default=None, help="a folder to write each executed notebook into (never the "
                                                     "repository's notebooks/): per-cell timestamps")
    parser.add_argument("--thorough", action="store_true",
                        help="time the thorough versions (FASTLAB_THOROUGH=1), recorded as '<profile>-thorough'")
    args = parser.parse_args(argv)
    if args.thorough:
        os.environ["FASTLAB_THOROUGH"] = "1"
    names = [n.removesuffix(".ipynb") for n in args.notebooks] or sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb"))
    profiles = [p.strip() for p in args.profiles.split(",") if p.strip()]
    for profile in profiles:
        if profile not in ("smoke", "cpu"):
            parser.error(f"--profiles: {profile!r} is not a CPU profile (smoke, cpu)")
    where = machine()
    for profile in profiles:
        for name in names:
            os.environ["FASTLAB_PROFILE"] = profile
            planned, estimate, _ = estimate_here(name, profile)  # the notebook's first line's, before it runs
            seconds, status, load, first, core = time_notebook(NOTEBOOKS / f"{name}.ipynb", profile, args.timeout,
                                                               Path(args.keep) if args.keep else None)
            key = f"{profile}-thorough" if args.thorough else profile
            record_timing(args.out, name, key, seconds, status, where, load=load, first_result=first, core_path=core,
                          step_seconds=step_seconds(profile), budget_seconds=planned, estimate=estimate)
            shown = f", first result after {first:.0f} s" if first is not None else ""
            shown += f", core path {core:.0f} s" if core is not None else ""
            print(f"{name} [{key}]: {seconds:.0f} s{shown}, {status}, load average {load:.1f}", flush=True)
    write_workshop_table(Path(args.out))
    return 0


def step_seconds(profile: str) -> float | None:
    """This machine's calibrated step of the profile's config (None: fixed steps), which scales a notebook's time
    to another machine (fastlab.tools.timings.begin_notebook)."""
    from fastlab.calibration import calibrate
    from fastlab.config import config_for, time_sizing

    return calibrate(config_for(profile)).step_seconds if time_sizing(profile) else None


def write_workshop_table(timings_file: Path) -> None:
    """The instructor's guide prints the table from the same file (tests/test_claims.py checks they agree)."""
    guide = ROOT / "docs" / "workshop.md"
    guide.write_text(with_timings_table(guide.read_text(), timings_table(path=timings_file)))


if __name__ == "__main__":
    raise SystemExit(main())
