"""The notebooks travel inside the package; pyproject.toml holds everything else.

The top-level notebooks/ folder stays the one source of truth (the layout is fixed by the design). When a
wheel is built (directly, or from an sdist, which carries notebooks/ through MANIFEST.in), build_py copies
notebooks/*.ipynb into fastlab/notebooks/, where `python -m fastlab notebooks DIR` finds them. An editable
install reads the checkout's notebooks/ instead (fastlab.tools.install.packaged_notebooks).
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

NOTEBOOKS = Path(__file__).resolve().parent / "notebooks"


class BuildPyWithNotebooks(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib) / "fastlab" / "notebooks"
        target.mkdir(parents=True, exist_ok=True)
        for notebook in sorted(NOTEBOOKS.glob("*.ipynb")):  # only what a learner opens: no conftest, no checks
            self.copy_file(str(notebook), str(target / notebook.name))


setup(cmdclass={"build_py": BuildPyWithNotebooks})
