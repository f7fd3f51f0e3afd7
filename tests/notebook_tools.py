"""Keep committed notebooks clean: `python tests/notebook_tools.py notebooks/*.ipynb`.

Executes each notebook under the smoke profile, then strips every output, execution count and
widget state, except in cells marked `# NBVAL_CHECK_OUTPUT`: their output is deterministic and is
what nbval compares the next run against (nbval compares only cells that carry an execution count,
so those cells keep the count 1).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

CHECK_MARK = "# NBVAL_CHECK_OUTPUT"


def is_checked(cell: dict) -> bool:
    return cell["cell_type"] == "code" and CHECK_MARK in "".join(cell["source"])


def clean(nb) -> None:
    """Strip outputs (but those of checked cells), execution counts, and widget state, in place."""
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type != "code":
            continue
        checked = is_checked(cell)
        cell.execution_count = 1 if checked else None
        if not checked:
            cell.outputs = []
        for out in cell.outputs:
            if "execution_count" in out:
                out["execution_count"] = 1


def execute_and_clean(path: Path) -> None:
    import nbformat
    from nbclient import NotebookClient

    os.environ["FASTLAB_PROFILE"] = "smoke"
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    clean(nb)
    nbformat.write(nb, path)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print("executing and cleaning", arg)
        execute_and_clean(Path(arg))
