"""Python with every notebook's budget already spent: a test's way to run each cell as a learner's runs after the
notebook's time budget (fastlab.budget) ran out, on the smoke profile (which has no budget of its own).

Python imports `sitecustomize` at startup from its import path, so with this folder on PYTHONPATH every process
started with that environment begins here: pytest, and the notebook's kernel. Once `fastlab.budget` is imported, its
`start` gives a notebook without a budget (smoke's None) one of 0 s, so every run of a registered comparison is refused
(`budget.refusal`), as it is on a loaded machine once the budget is spent; a cell's own single runs still run.

With FASTLAB_BUDGET_LOG naming a file, every refusal appends `<comparison>\t<label>\t<reason>` to it, so a test can
see that runs really were refused, and of which comparison, not just asked to be.
"""

import importlib.abc
import importlib.machinery
import os
import sys


def _spend(budget) -> None:
    """Patch the module `budget` (fastlab.budget): a budget of 0 s where there was none, and each refusal logged."""
    start, refusal = budget.start, budget.refusal

    def start_spent(notebook, profile, seconds, *args, **kwargs):
        return start(notebook, profile, 0.0 if seconds is None else seconds, *args, **kwargs)

    def refusal_logged(label):
        reason = refusal(label)
        log = os.environ.get("FASTLAB_BUDGET_LOG")
        if reason is not None and log:
            with open(log, "a") as f:
                f.write(f"{budget.active().running}\t{label}\t{reason}\n")
        return reason

    budget.start, budget.refusal = start_spent, refusal_logged


class _PatchBudget(importlib.abc.MetaPathFinder):
    """Finds fastlab.budget as Python would, and patches it once it has run (no import of fastlab here: a process
    that never imports it pays nothing)."""

    def find_spec(self, name, path, target=None):
        if name != "fastlab.budget":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _spend(module)

        spec.loader.exec_module = exec_and_patch
        return spec


sys.meta_path.insert(0, _PatchBudget())
