"""Time each notebook top to bottom under each CPU profile and record it in notebooks/timings.json.

    python tests/notebook_timings.py                                   # every notebook, smoke then cpu
    python tests/notebook_timings.py --profiles smoke 01_data_loading  # some notebooks, one profile

Each notebook runs in a fresh kernel (as a reader's would) with FASTLAB_PROFILE set, its claim verdicts kept in a
temporary folder (never the reader's store), and nothing written back into the notebook. The wall seconds, the
date, the machine, the machine's load average and how the run ended go into the timings file (fastlab.tools.timings),
which the notebooks' first cells and docs/workshop.md print from. A timeout or an error is recorded as such.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
import time
from pathlib import Path

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
    sys.path.insert(0, str(ROOT))
    from fastlab.tools.timings import estimate_here, record_timing

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
    from fastlab.tools.timings import timings_table, with_timings_table

    guide = ROOT / "docs" / "workshop.md"
    guide.write_text(with_timings_table(guide.read_text(), timings_table(path=timings_file)))


if __name__ == "__main__":
    raise SystemExit(main())
