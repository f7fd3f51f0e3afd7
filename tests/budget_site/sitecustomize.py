"""Python with every notebook's budget already spent: a test's way to run each cell as a learner's runs after the
notebook's time budget (fastlab.budget) ran out, on the smoke profile (which has no budget of its own).

Python imports `sitecustomize` at startup from its import path, so with this folder on PYTHONPATH every process
started with that environment begins here: pytest, and the notebook's kernel. Once `fastlab.budget` is imported, its
`start` gives a notebook without a budget (smoke's None) one of 0 s, so every run of a registered comparison is refused
(`budget.refusal`), and every cell's own single run is cut to a short run (`budget.own_run_cut`), as they are on a
loaded machine once the budget is spent.

With FASTLAB_BUDGET_LOG naming a file, every refusal appends `<comparison>\t<label>\t<reason>` to it, and every cut
`(own run)\t<label>\t<reason>`, so a test can see that runs really were refused or cut, and which, not just asked to be.
"""

import importlib.abc
import importlib.machinery
import os
import sys


def _spend(budget) -> None:
    """Patch the module `budget` (fastlab.budget): a budget of 0 s where there was none, and each refusal logged."""
    start, refusal, own_run_cut = budget.start, budget.refusal, budget.own_run_cut

    def start_spent(notebook, profile, seconds, *args, **kwargs):
        return start(notebook, profile, 0.0 if seconds is None else seconds, *args, **kwargs)

    def logged(check, whose):
        def check_logged(label):
            reason = check(label)
            log = os.environ.get("FASTLAB_BUDGET_LOG")
            if reason is not None and log:
                with open(log, "a") as f:
                    f.write(f"{whose()}\t{label}\t{reason}\n")
            return reason
        return check_logged

    budget.start = start_spent
    budget.refusal = logged(refusal, lambda: budget.active().running)
    budget.own_run_cut = logged(own_run_cut, lambda: "(own run)")


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
