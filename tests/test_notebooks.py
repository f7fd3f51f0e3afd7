"""Hygiene of the committed notebooks: no outputs, no execution counts, no widget state, no hand-typed figures.

The deterministic outputs that nbval compares (cells marked `# NBVAL_CHECK_OUTPUT`) live in
notebooks/checked_outputs.json, not in the notebooks (see tests/notebook_tools.py and notebooks/conftest.py).
"""

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
# a figure with a unit of speed or a ratio, outside a > blockquote (quoted claims under test are allowed)
TYPED_FIGURE = re.compile(r"\b\d+(\.\d+)?\s*(x faster|x slower|×|x speed|img/s|images/s|% faster|% less|k images)")


def problems(nb: dict) -> list[str]:
    found = []
    if "widgets" in nb.get("metadata", {}):
        found.append("widget state saved in metadata")
    for cell in nb["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code":
            if cell.get("outputs"):
                found.append(f"outputs saved in the cell starting {source[:40]!r}")
            if cell.get("execution_count") is not None:
                found.append(f"execution count saved in the cell starting {source[:40]!r}")
        elif cell["cell_type"] == "markdown":
            prose = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(">"))
            match = TYPED_FIGURE.search(prose)
            if match:
                found.append(f"figure typed by hand: {match.group(0)!r}; print it from a measurement")
    return found


def test_there_are_notebooks():
    assert NOTEBOOKS and NOTEBOOKS[0].name == "00_start_here.ipynb"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_clean(path):
    assert problems(json.loads(path.read_text())) == []


def test_the_check_catches_what_it_looks_for():
    dirty = {"metadata": {"widgets": {}}, "cells": [
        {"cell_type": "code", "source": ["run()"], "outputs": [{"text": "x"}], "execution_count": 3},
        {"cell_type": "code", "source": ["# NBVAL_CHECK_OUTPUT\nprint(1)"], "outputs": [], "execution_count": None},
        {"cell_type": "markdown", "source": ["bf16 made it 2.5x faster here"]},
        {"cell_type": "markdown", "source": ["> The vendor says 3x faster (a claim under test)"]},
    ]}
    found = problems(dirty)
    assert len(found) == 4 and any("'2.5x faster'" in f for f in found)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_checked_cell_has_its_expected_output_recorded(path):
    from notebook_tools import cell_key, is_checked, load_expected

    nb = json.loads(path.read_text())
    checked = [cell_key(c) for c in nb["cells"] if is_checked(c)]
    assert checked, "each notebook checks at least one deterministic output (# NBVAL_CHECK_OUTPUT)"
    recorded = load_expected().get(path.name, {})
    missing = [k for k in checked if k not in recorded]
    assert not missing, f"run `python tests/notebook_tools.py {path}` to record the expected outputs"
    assert all(recorded[k] for k in checked), "a checked cell whose recorded output is empty checks nothing"
