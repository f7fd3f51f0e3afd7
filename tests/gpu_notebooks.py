"""The one prepared call for a lent GPU machine: `make gpu-notebooks` (or `PYTHONPATH=. python
tests/gpu_notebooks.py`). For a machine with Python 3.12 and torch but no Jupyter and no network.

Four parts, each with its own time cap, saving under --out ($OUT, else gpu-notebooks-results/) as it goes:
1. install the wheels `make gpu-wheels` downloaded (gpu-wheels/) into an ignored --target folder (.gpu-site/);
2. execute every notebook's fast version (FASTLAB_PROFILE=gpu) in parallel kernels, as `pytest --nbval-lax` would
   judge it (a cell's error fails it, a `raises-exception` cell must raise), each executed notebook saved after every
   cell and its time appended to notebooks.jsonl (nbval cannot save outputs: nbclient executes, the same client nbval
   uses; the `# NBVAL_CHECK_OUTPUT` comparisons stay with `make test`'s smoke run);
3. both bench ladders with 2 interleaved repeats (tests/gpu_check.py's run_ladders);
4. the reference runs of the registered comparisons (tests/reference_run.py's run_comparisons) in what is left.
Each notebook, and parts 3 and 4, run in a child process of their own, killed with its runs at its cap.
Without CUDA it prints one line and exits 0; `--rehearse PROFILE` runs the same parts on this machine's CPU.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from fastlab.files import write_json

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
NOTEBOOKS = ROOT / "notebooks"
# Caps in seconds (each part's, on an H200); the reference runs get what is left of TOTAL_S, 9 minutes.
TOTAL_S = 540.0
CAPS = {"install": 45.0, "notebooks": 200.0, "ladders": 275.0, "reference": 20.0}
NOTEBOOK_CAP_S = 180.0  # one notebook: issue 53's 3 minutes (its budget, Profile.time_sizing's notebook_seconds, and more)
# Both ladders, every rung, twice within the ladders' cap: each rung's timed steps and untimed warm-up steps held
# short (the H200 reference's rungs took 1-8 s of warm-up at 30 steps, its compiled rung 15 s), the first pass
# given LADDER_FIRST_PASS of the cap, the second what is left.
LADDER_RUNG_SECONDS = 1.5
LADDER_WARMUP_STEPS = 10
LADDER_FIRST_PASS = 0.55


def install_wheels(wheels: Path, target: Path, seconds: float) -> str:
    """Install every wheel in `wheels` into a clean `target` (no index, no dependency resolution: the folder holds
    the whole set); what it installed, in words."""
    deadline = time.monotonic() + seconds
    found = sorted(wheels.glob("*.whl"))
    if not found:
        raise FileNotFoundError(f"no wheels in {wheels}: run `make gpu-wheels` before lending the machine")
    shutil.rmtree(target, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-compile", "--target",
                    str(target), *map(str, found)], check=True, timeout=max(deadline - time.monotonic(), 1.0))
    return f"{len(found)} wheels from {wheels} into {target}"


def kernel_env(target: Path, profile: str, out: Path) -> dict[str, str]:
    """The environment each kernel starts with: the installed wheels and this checkout first on its path."""
    path = [str(target), str(ROOT), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p), "FASTLAB_PROFILE": profile,
            "FASTLAB_SOLUTION": "1", "MPLBACKEND": "Agg", "FASTLAB_RESULTS_DIR": str(out / "claims-store")}


def execute_one(notebook: Path, save_to: Path, cell_timeout: float) -> dict:
    """Execute `notebook` in a fresh kernel (run in a child process: its parent caps it), saving it after every
    cell; its outcome as one JSON-able dict."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    nb = nbformat.read(notebook, as_version=4)
    save_to.parent.mkdir(parents=True, exist_ok=True)
    done = []

    def saved(cell, cell_index, execute_reply) -> None:
        done.append(cell_index)
        nbformat.write(nb, save_to)

    client = NotebookClient(nb, timeout=cell_timeout, kernel_name="python3", on_cell_executed=saved,
                            resources={"metadata": {"path": str(notebook.parent)}})
    t0, status = time.perf_counter(), "ok"
    try:
        client.execute()
    except CellTimeoutError:
        status = "cell timeout"
    except CellExecutionError as e:
        status = f"error: {e.ename}: {e.evalue}"[:300]
    nbformat.write(nb, save_to)
    return {"notebook": notebook.stem, "seconds": round(time.perf_counter() - t0, 1), "status": status,
            "cells_run": len(done), "code_cells": sum(c.cell_type == "code" for c in nb.cells)}


def run_capped(notebook: Path, out: Path, env: dict[str, str], cap: float) -> dict:
    """One notebook in a child process of its own, killed (its kernel with it) at `cap` seconds."""
    save_to = out / "notebooks" / notebook.name
    cmd = [sys.executable, str(HERE), "--one", str(notebook), "--save", str(save_to), "--notebook-s", str(cap)]
    t0 = time.perf_counter()
    child = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
    try:
        text, _ = child.communicate(timeout=max(cap, 1.0))
        lines = [line for line in text.splitlines() if line.startswith("{")]
        return json.loads(lines[-1]) if lines else {"notebook": notebook.stem, "status": f"no outcome: {text[-300:]}"}
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)  # its own session: the child and its kernel
        child.communicate()
        return {"notebook": notebook.stem, "seconds": round(time.perf_counter() - t0, 1),
                "status": f"stopped at its cap of {cap:g} s"}


def run_notebooks(names: list[str], out: Path, env: dict[str, str], seconds: float, jobs: int,
                  each: float = NOTEBOOK_CAP_S) -> list[dict]:
    """Every notebook, `jobs` at once, none started after `seconds` and none running past it or its own cap `each`;
    each outcome appended to notebooks.jsonl as it ends."""
    deadline = time.monotonic() + seconds
    log = out / "notebooks.jsonl"

    def one(name: str) -> dict:
        left = deadline - time.monotonic()
        if left <= 1:
            outcome = {"notebook": name, "status": "not started: the notebooks' cap was spent"}
        else:
            outcome = run_capped(NOTEBOOKS / f"{name}.ipynb", out, env, min(each, left))
        with log.open("a") as f:
            f.write(json.dumps({**outcome, "profile": env["FASTLAB_PROFILE"]}) + "\n")
        print(f"  {outcome['notebook']}: {outcome.get('seconds', 0):.0f} s, {outcome['status']}", flush=True)
        return outcome

    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(one, names))


def notebook_order(profile: str) -> tuple[list[str], dict[str, float]]:
    """The notebooks, longest first by their estimated time on the reference GPU (tests/gpu_estimate.py), and those
    estimates ({} where the profile has fixed steps)."""
    # here: it imports torch, which this module defers until main decides
    from gpu_estimate import estimate_notebooks

    names = sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb"))
    estimates = {e.notebook: e.seconds for e in estimate_notebooks(profile)}
    names.sort(key=lambda n: -estimates.get(n, 0.0))
    return names, estimates


def makespan(seconds: list[float], jobs: int) -> float:
    """The wall time of `seconds` of work on `jobs` kernels, each notebook to the first free one, longest first."""
    ends = [0.0] * jobs
    for s in sorted(seconds, reverse=True):
        ends[ends.index(min(ends))] += s
    return max(ends)


def default_jobs(estimates: list[float], cap: float) -> int:
    """The fewest kernels at once whose estimated wall time fits `cap`, at most the cores less two (the notebooks'
    own runs and loaders need some); that most where nothing is estimated or nothing fits. The budgets cut each
    notebook's runs to fit its time, so kernels sharing the GPU take longer steps, not longer notebooks."""
    # here: it imports torch, which this module defers until main decides
    from fastlab.measure import usable_cpu_count

    most = max(1, usable_cpu_count() - 2)
    fits = [j for j in range(1, most + 1) if estimates and makespan(estimates, j) <= cap]
    return fits[0] if fits else most


def timed(part: str, times: dict[str, float], out: Path, fn):
    """Run one part, recording its seconds in parts.json."""
    t0 = time.perf_counter()
    print(f"fastlab gpu-notebooks: {part} (cap {CAPS[part]:g} s)", flush=True)
    try:
        return fn()
    finally:
        times[part] = round(time.perf_counter() - t0, 1)
        write_json(out / "parts.json", times)
        print(f"fastlab gpu-notebooks: {part} took {times[part]:.0f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT") or "gpu-notebooks-results")
    parser.add_argument("--wheels", default="gpu-wheels")
    parser.add_argument("--target", default=".gpu-site")
    parser.add_argument("--rehearse", metavar="PROFILE", help="run the parts on this machine's CPU, with PROFILE")
    parser.add_argument("--jobs", type=int, default=None, help="kernels at once (default: what fits the cap)")
    parser.add_argument("--only", default="", help="notebooks whose names contain this")
    for part, cap in list(CAPS.items())[:-1]:
        parser.add_argument(f"--{part}-s", type=float, default=cap, help=f"the {part} part's cap (s)")
    parser.add_argument("--notebook-s", type=float, default=NOTEBOOK_CAP_S, help="each notebook's cap (s)")
    parser.add_argument("--total-s", type=float, default=TOTAL_S, help="the whole run's time: the reference runs "
                        "get what the parts before them left of it")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child: one notebook
    parser.add_argument("--save", help=argparse.SUPPRESS)
    parser.add_argument("--part", choices=("ladders", "reference"), help=argparse.SUPPRESS)  # a child: one part
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(execute_one(Path(args.one), Path(args.save), cell_timeout=args.notebook_s)), flush=True)
        return 0
    if args.part:
        return run_part(args.part, Path(args.out), os.environ["FASTLAB_PROFILE"], args.total_s)
    import torch

    if not torch.cuda.is_available() and not args.rehearse:
        print("fastlab gpu-notebooks: no CUDA GPU on this machine; nothing to run (exit 0; --rehearse PROFILE runs "
              "the same parts on the CPU).")
        return 0
    return run_parts(args, profile=args.rehearse or "gpu")


def run_part(part: str, out: Path, profile: str, seconds: float) -> int:
    """In a child process of its own (its parent caps it): the ladders, or the reference runs within `seconds`."""
    import torch

    # here, in the --part child only: both import torch, reference_run also bench's matplotlib and every lesson
    from gpu_check import run_ladders  # this script's folder, tests/, is first on the import path
    from reference_run import run_comparisons

    if part == "ladders":
        print(run_ladders(out, seconds * LADDER_FIRST_PASS, LADDER_RUNG_SECONDS, profile, repeats=2,
                          warmup_steps=LADDER_WARMUP_STEPS), flush=True)
    else:  # no comparison starts after 70% of its time: one started then still fits, mostly
        device = "cuda" if torch.cuda.is_available() else "cpu"
        run_comparisons(out / "reference.json", seconds * 0.7, profile, kept_device=device)
    return 0


def capped_part(part: str, out: Path, profile: str, seconds: float) -> str:
    """Run `part` in a child process, its output passed through, killed (with its runs) at `seconds`."""
    cmd = [sys.executable, str(HERE), "--part", part, "--out", str(out), "--total-s", str(seconds)]
    child = subprocess.Popen(cmd, env={**os.environ, "FASTLAB_PROFILE": profile}, cwd=ROOT, start_new_session=True)
    try:
        return "ok" if child.wait(timeout=max(seconds, 1.0)) == 0 else f"failed (exit {child.returncode})"
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        return f"stopped at its cap of {seconds:.0f} s (what it saved is kept)"


def run_parts(args: argparse.Namespace, profile: str) -> int:
    """The four parts in turn, each within its cap; every part's time in parts.json."""
    CAPS.update({part: getattr(args, f"{part}_s") for part in list(CAPS)[:-1]})
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    times: dict[str, float] = {}
    target = Path(args.target).resolve()
    try:
        print(timed("install", times, out, lambda: install_wheels(Path(args.wheels), target, CAPS["install"])))
    except (OSError, subprocess.SubprocessError) as e:  # no wheels, pip failed or passed its cap: nothing can run
        why = f"pip passed the cap of {CAPS['install']:g} s" if isinstance(e, subprocess.TimeoutExpired) else str(e)
        print(f"fastlab gpu-notebooks: the install failed ({why[:300]}); nothing else was run (exit 1).")
        return 1
    names, estimates = notebook_order(profile)
    names = [n for n in names if args.only in n]
    jobs = args.jobs or default_jobs([estimates[n] for n in names if n in estimates], CAPS["notebooks"])
    print(f"fastlab gpu-notebooks: {len(names)} notebooks, {jobs} at once", flush=True)
    env = kernel_env(target, profile, out)
    outcomes = timed("notebooks", times, out, lambda: run_notebooks(names, out, env, CAPS["notebooks"], jobs,
                                                                        args.notebook_s))
    ladders = timed("ladders", times, out, lambda: capped_part("ladders", out, profile, CAPS["ladders"]))
    CAPS["reference"] = max(0.0, args.total_s - sum(times.values()))  # what is left of the whole run's time
    reference = (timed("reference", times, out, lambda: capped_part("reference", out, profile, CAPS["reference"]))
                 if CAPS["reference"] >= 1 else "not run: no time left")
    failed = [o["notebook"] for o in outcomes if o["status"] != "ok"]
    print(f"fastlab gpu-notebooks: {len(outcomes) - len(failed)} of {len(outcomes)} notebooks ok"
          + (f" (not ok: {', '.join(failed)})" if failed else "") + f"; ladders {ladders}; reference runs "
          f"{reference}; parts' seconds {times}; saved under {out}")
    return 1 if failed or ladders != "ok" else 0


if __name__ == "__main__":
    sys.exit(main())
