"""Hygiene of the committed notebooks: no outputs, no execution counts, no widget state, no hand-typed figures.

The one exception: cells marked `# NBVAL_CHECK_OUTPUT` keep their deterministic output, because that stored
output is what nbval compares against (tests/notebook_tools.py writes it), with the execution count 1 that
nbval needs before it compares a cell.
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
            checked = "# NBVAL_CHECK_OUTPUT" in source
            if cell.get("outputs") and not checked:
                found.append(f"outputs saved in the cell starting {source[:40]!r}")
            if cell.get("execution_count") not in ((None, 1) if checked else (None,)):
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
        {"cell_type": "code", "source": ["# NBVAL_CHECK_OUTPUT\nprint(1)"], "outputs": [{"text": "1"}],
         "execution_count": 1},
        {"cell_type": "markdown", "source": ["bf16 made it 2.5x faster here"]},
        {"cell_type": "markdown", "source": ["> The vendor says 3x faster (a claim under test)"]},
    ]}
    found = problems(dirty)
    assert len(found) == 4 and any("'2.5x faster'" in f for f in found)
