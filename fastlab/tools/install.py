"""Getting the workbook onto a machine: the copy of the notebooks, `python -m fastlab notebooks DIR` (copy_notebooks),
which keeps notebooks the user edited. Each notebook's first cell, which installs fastlab from the source a teacher
sets once, is written into the repository's notebooks by tests/install_cell.py.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from ..files import write_atomic, write_json

MANIFEST = ".fastlab-notebooks.json"  # in a copy's folder: the hash of each notebook as it was copied
DEFAULT_DIR = "fastlab-notebooks"


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
