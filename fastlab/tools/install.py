"""Getting the workbook onto a machine: each notebook's install cell, and the copy of the notebooks.

The teacher sets the install source once (SOURCE_ENV, or SOURCE_FILE beside the notebook): a wheel's path or URL,
or a clone's folder. copy_notebooks() is `python -m fastlab notebooks DIR`; it keeps notebooks the user edited.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..files import write_atomic, write_json

# After changing these, run `python -m fastlab.tools.install --ensure-notebooks notebooks/`.
SOURCE_ENV = "FASTLAB_INSTALL_SOURCE"
SOURCE_FILE = "fastlab-install-source.txt"

CELL_ID = "fastlab-install"  # the install cell's id in every notebook (nbformat 4.5 cell ids)
CELL_MARK = "# fastlab install check"  # how the cell is found again
# out of the learner's path: JupyterLab collapses its input, Colab shows it as a form
CELL_TITLE = "# @title Install check: imports fastlab, or says how to install it"
CELL_METADATA = {"cellView": "form", "jupyter": {"source_hidden": True}}
MANIFEST = ".fastlab-notebooks.json"  # in a copy's folder: the hash of each notebook as it was copied
DEFAULT_DIR = "fastlab-notebooks"


def install_cell_source() -> str:
    """Every notebook's first code cell: import fastlab, else install it from the teacher's source (on Colab) or
    print the line that does."""
    return f'''{CELL_TITLE}
{CELL_MARK} (written by `python -m fastlab.tools.install`; edit fastlab/tools/install.py, not this cell)
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


def packaged_notebooks() -> Path:
    """The notebooks this fastlab carries: fastlab/notebooks in a wheel, else the checkout's notebooks/."""
    here = Path(__file__).resolve().parents[1]  # the fastlab package
    for folder in (here / "notebooks", here.parent / "notebooks"):
        if any(folder.glob("*.ipynb")):
            return folder
    raise FileNotFoundError(f"this fastlab ({here}) carries no notebooks: reinstall it from a wheel or sdist "
                            "built from a clone (pip wheel --no-deps . -w dist), or run it from the clone itself")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class CopyReport:
    folder: Path
    copied: list[str] = field(default_factory=list)  # new in the folder
    updated: list[str] = field(default_factory=list)  # an earlier copy, unedited, replaced by this version's
    unchanged: list[str] = field(default_factory=list)  # already identical: skipped quietly
    kept: list[str] = field(default_factory=list)  # edited by the user: left alone (force=False)
    overwritten: list[str] = field(default_factory=list)  # edited by the user, replaced (force=True)


def copy_notebooks(dest: str | Path = DEFAULT_DIR, force: bool = False) -> CopyReport:
    """Copy the packaged notebooks into `dest`, replacing one there only while it is what an earlier copy wrote
    (hashes in MANIFEST): one the user edited or ran is kept unless `force`."""
    source = packaged_notebooks()
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    manifest_path = dest / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        manifest = {}
    report = CopyReport(dest)
    for nb in sorted(source.glob("*.ipynb")):
        target = dest / nb.name
        new, copied = _sha256(nb), manifest.get(nb.name)  # copied: the hash an earlier copy wrote
        have = _sha256(target) if target.exists() else None
        if have == new:
            bucket = report.unchanged
        elif have not in (None, copied) and not force:
            report.kept.append(nb.name)
            continue
        else:
            bucket = report.copied if have is None else report.updated if have == copied else report.overwritten
            write_atomic(target, nb.read_bytes())
        manifest[nb.name] = new
        bucket.append(nb.name)
    write_json(manifest_path, manifest, sort_keys=True)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fastlab.tools.install", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ensure-notebooks", metavar="DIR", required=True,
                        help="insert or update the install cell as the first code cell of every DIR/*.ipynb")
    args = parser.parse_args(argv)
    paths = sorted(Path(args.ensure_notebooks).glob("*.ipynb"))
    if not paths:
        print(f"fastlab: no notebooks in {args.ensure_notebooks} — give the folder that holds the *.ipynb files",
              file=sys.stderr)
        return 2
    changed = [p for p in paths if ensure_install_cell(p)]
    for p in changed:
        print(f"updated the install cell of {p}")
    print(f"{len(changed)} of {len(paths)} notebooks changed; the others already had the current install cell")
    return 0


if __name__ == "__main__":
    sys.exit(main())
