"""Each notebook's install cell, written into the repository's notebooks (a maintainers' tool: readers get the cell
with the notebooks). The cell imports fastlab, else installs it from the source a teacher sets once (SOURCE_ENV, or
SOURCE_FILE beside the notebook: a wheel's path or URL, or a clone's folder) on Colab, or prints the line that does.

    python tests/install_cell.py notebooks/
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

from fastlab.files import write_atomic

# After changing these, run `python tests/install_cell.py notebooks/`.
SOURCE_ENV = "FASTLAB_INSTALL_SOURCE"
SOURCE_FILE = "fastlab-install-source.txt"

CELL_ID = "fastlab-install"  # the install cell's id in every notebook (nbformat 4.5 cell ids)
CELL_MARK = "# fastlab install check"  # how the cell is found again
# out of the learner's path: JupyterLab collapses its input, Colab shows it as a form
CELL_TITLE = "# @title Install check: imports fastlab, or says how to install it"
CELL_METADATA = {"cellView": "form", "jupyter": {"source_hidden": True}}


def install_cell_source() -> str:
    """Every notebook's first code cell: import fastlab, else install it from the teacher's source (on Colab) or
    print the line that does."""
    return f'''{CELL_TITLE}
{CELL_MARK} (written by fastlab's tests/install_cell.py; edit that, not this cell)
try:
    import fastlab
except ImportError:
    import os
    import pathlib
    import subprocess
    import sys

    # where to install from, set once by the teacher: a wheel's path or URL, or a clone's folder
    source = os.environ.get("{SOURCE_ENV}", "").strip()
    if not source and pathlib.Path("{SOURCE_FILE}").is_file():
        source = pathlib.Path("{SOURCE_FILE}").read_text().strip()
    try:
        import google.colab  # noqa: F401  on Colab, install it into this runtime now
        on_colab = True
    except ImportError:
        on_colab = False
    if not source:
        print("fastlab is not installed in this kernel, and no install source is set.\\n"
              "Set {SOURCE_ENV} to a fastlab wheel (its path or URL) or to a folder holding a clone:\\n"
              "  in a cell above this one:  %env {SOURCE_ENV}=<path or URL of the fastlab wheel>\\n"
              "  or as the one line of a file {SOURCE_FILE} in " + os.getcwd() + "\\n"
              "then run this cell again. (In a clone of the repository, pip install . works too.)")
        raise ModuleNotFoundError("fastlab is not installed and {SOURCE_ENV} is not set (see above)") from None
    if not on_colab:
        print("fastlab is not installed in this kernel. Run this in a cell, then restart the kernel:\\n"
              f\'%pip install "{{source}}"\')
        raise ModuleNotFoundError("fastlab is not installed (the line to run is printed above)") from None
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", source], check=True)
    import fastlab
print(f"fastlab {{fastlab.__version__}} from {{fastlab.__path__[0]}}")'''


def _is_install_cell(cell: dict) -> bool:
    source = "".join(cell.get("source", []))
    return cell.get("cell_type") == "code" and (cell.get("id") == CELL_ID or source.startswith((CELL_MARK, CELL_TITLE)))


def has_current_install_cell(nb: dict) -> bool:
    """Whether the first code cell is today's install cell, collapsed."""
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    return (bool(code) and _is_install_cell(code[0]) and "".join(code[0]["source"]) == install_cell_source()
            and code[0].get("metadata") == CELL_METADATA)


def ensure_install_cell(path: str | Path) -> bool:
    """Make today's install cell the first code cell; True if the file changed."""
    path = Path(path)
    nb = json.loads(path.read_text(encoding="utf-8"))
    if has_current_install_cell(nb):
        return False
    cells = [c for c in nb["cells"] if not _is_install_cell(c)]
    cell = {"cell_type": "code", "execution_count": None, "metadata": copy.deepcopy(CELL_METADATA), "outputs": [],
            "source": install_cell_source().splitlines(keepends=True)}
    if (nb.get("nbformat"), nb.get("nbformat_minor", 0)) >= (4, 5):
        cell["id"] = CELL_ID
    first_code = next((i for i, c in enumerate(cells) if c["cell_type"] == "code"), len(cells))
    nb["cells"] = cells[:first_code] + [cell] + cells[first_code:]
    # nbformat's layout, so the diff shows only the cell
    write_atomic(path, json.dumps(nb, sort_keys=True, indent=1, ensure_ascii=False) + "\n")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tests/install_cell.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", metavar="DIR", help="insert or update the install cell as the first code cell of "
                                                      "every DIR/*.ipynb")
    folder = parser.parse_args(argv).folder
    paths = sorted(Path(folder).glob("*.ipynb"))
    if not paths:
        print(f"fastlab: no notebooks in {folder} — give the folder that holds the *.ipynb files", file=sys.stderr)
        return 2
    changed = [p for p in paths if ensure_install_cell(p)]
    for p in changed:
        print(f"updated the install cell of {p}")
    print(f"{len(changed)} of {len(paths)} notebooks changed; the others already had the current install cell")
    return 0


if __name__ == "__main__":
    sys.exit(main())
