"""Keep committed notebooks clean: `python tests/notebook_tools.py notebooks/*.ipynb`.

Executes each notebook under the smoke profile and saves it with no outputs, no execution counts and
no widget state. The outputs of cells marked `# NBVAL_CHECK_OUTPUT` are deterministic (a validation
error, a plan printed from the config; never a timing) and are what nbval compares the next run
against: they are kept apart, in notebooks/checked_outputs.json, keyed by notebook and by a hash of
the cell's source, and notebooks/conftest.py hands them to nbval. So a changed checked cell has no
expected output until this script is run again, and the tests say so.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from fresh_process import run_pytest

CHECK_MARK = "# NBVAL_CHECK_OUTPUT"
EXPECTED_FILE = Path(__file__).resolve().parents[1] / "notebooks" / "checked_outputs.json"


def run_under_nbval(name: str, env: dict[str, str], site: Path | None = None,
                    timeout: float = 1700) -> subprocess.CompletedProcess:
    """notebooks/`name` run whole under nbval in a fresh process with `env` (and `site`'s sitecustomize, for it, the
    notebook's kernel and the runs it starts): a notebook in a setting the suite's own process cannot take (another
    profile, spawn, a spent budget)."""
    return run_pytest(["--nbval-lax", "--nbval-current-env", str(EXPECTED_FILE.parent / name)], env, site, timeout)


def is_checked(cell: dict) -> bool:
    return cell["cell_type"] == "code" and CHECK_MARK in "".join(cell["source"])


def cell_key(cell: dict) -> str:
    """A checked cell's key: a hash of its source, so an edited cell must have its output recorded again."""
    return hashlib.sha1("".join(cell["source"]).encode()).hexdigest()[:16]


def load_expected() -> dict[str, dict[str, list]]:
    return json.loads(EXPECTED_FILE.read_text()) if EXPECTED_FILE.exists() else {}


def record_checked_outputs(name: str, nb) -> None:
    """Store the outputs of the notebook's checked cells (execution counts cleared) in EXPECTED_FILE."""
    expected = load_expected()
    entry = {}
    for cell in nb["cells"]:
        if is_checked(cell):
            outputs = [dict(o) for o in cell.get("outputs", [])]
            for out in outputs:
                if "execution_count" in out:
                    out["execution_count"] = None
            entry[cell_key(cell)] = outputs
    if entry:
        expected[name] = entry
    else:
        expected.pop(name, None)
    EXPECTED_FILE.write_text(json.dumps(dict(sorted(expected.items())), indent=1, sort_keys=True) + "\n")


def clean(nb) -> None:
    """Strip every output, execution count and the widget state, in place."""
    nb["metadata"].pop("widgets", None)
    for cell in nb["cells"]:
        cell["metadata"].pop("execution", None)
        if cell["cell_type"] == "code":
            cell["execution_count"] = None
            cell["outputs"] = []


def execute_and_clean(path: Path) -> None:
    import nbformat
    from nbclient import NotebookClient

    os.environ["FASTLAB_PROFILE"] = "smoke"
    os.environ["FASTLAB_RESULTS_DIR"] = tempfile.mkdtemp(prefix="fastlab-results-")  # not the reader's verdicts
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    record_checked_outputs(path.name, nb)
    clean(nb)
    nbformat.write(nb, path)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print("executing and cleaning", arg)
        execute_and_clean(Path(arg))
