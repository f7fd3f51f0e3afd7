"""nbval compares the `# NBVAL_CHECK_OUTPUT` cells against outputs kept in checked_outputs.json.

Committed notebooks carry no outputs at all, yet nbval only compares a cell against the outputs (and
execution count) stored in the notebook it reads. So, once nbval has read a notebook, the expected
outputs are put into its checked cells in memory. A checked cell with no recorded output fails here,
naming the fix, instead of passing unchecked.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import nbformat
from nbval.plugin import IPyNbFile

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from notebook_tools import cell_key, is_checked, load_expected  # noqa: E402

_collect = IPyNbFile.collect


def _collect_with_expected_outputs(self):
    items = list(_collect(self))  # reads self.nb; each item keeps a reference to its cell
    expected = load_expected().get(Path(str(self.fspath)).name, {})
    for cell in self.nb.cells:
        if not is_checked(cell):
            continue
        key = cell_key(cell)
        if key not in expected:
            raise ValueError(f"{self.fspath}: a '# NBVAL_CHECK_OUTPUT' cell has no recorded output; run "
                             f"`python tests/notebook_tools.py {self.fspath}` to record it")
        cell.outputs = [nbformat.from_dict(o) for o in expected[key]]
        cell.execution_count = 1
    return items


IPyNbFile.collect = _collect_with_expected_outputs

# Notebooks record claim verdicts (fastlab.claims); under test they go to a fresh folder, never the reader's store.
os.environ["FASTLAB_RESULTS_DIR"] = tempfile.mkdtemp(prefix="fastlab-results-")
