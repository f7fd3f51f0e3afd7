"""Packaging: environment.yml mirrors pyproject.toml; a wheel carries every notebook; outside the repository,
with only that wheel (beside the installed torch), `python -m fastlab notebooks DIR` writes them and one runs."""

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONDA_TO_PIP = {"pytorch": "torch"}  # conda-forge names that differ from PyPI's
NOT_PACKAGES = {"python", "pip"}  # environment.yml entries that are the environment itself
# The notebook run from the copied workbook: the smallest (one smoke-profile run and a panel), so the
# end-to-end test stays near a minute on an idle 2-core machine.
SMALLEST_NOTEBOOK = "dashboard.ipynb"


def _requirement(text: str) -> tuple[str, str]:
    """("name", "specifier") of a requirement such as "ipywidgets>=8" (names normalised as PyPI does)."""
    m = re.match(r"\s*([A-Za-z0-9_.\-]+)\s*(\[[^\]]*\])?\s*(.*)$", text)
    assert m, text
    name = re.sub(r"[-_.]+", "-", m.group(1)).lower()
    return CONDA_TO_PIP.get(name, name), m.group(3).replace(" ", "")


def pyproject_requirements() -> dict[str, str]:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        reqs += [r for r in extra if not r.startswith("fastlab")]  # fastlab[notebook] etc. name other extras
    return dict(_requirement(r) for r in reqs)


def environment_requirements() -> dict[str, str]:
    """The conda and pip entries of environment.yml (a plain list: no YAML library needed)."""
    out = {}
    in_dependencies = False
    for line in (ROOT / "environment.yml").read_text().splitlines():
        if re.match(r"[A-Za-z_]+:", line):  # a top-level key: name, channels, dependencies
            in_dependencies = line.startswith("dependencies:")
        entry = re.match(r"\s*-\s+([^#]+?)\s*(#.*)?$", line)
        if not in_dependencies or not entry or entry.group(1).endswith(":") or entry.group(1).startswith("-e "):
            continue  # the "pip:" key and the editable install of fastlab itself
        text = entry.group(1)
        if "=" in text and not re.search(r"[<>!~=]=|[<>]", text):  # conda's "python=3.11" pins
            text = text.replace("=", "==", 1)
        name, spec = _requirement(text)
        if name not in NOT_PACKAGES:
            out[name] = spec
    return out


def test_environment_yml_lists_what_pyproject_lists():
    py, env = pyproject_requirements(), environment_requirements()
    assert sorted(set(py) - set(env)) == [], "in pyproject.toml, missing from environment.yml"
    assert sorted(set(env) - set(py)) == [], "in environment.yml, missing from pyproject.toml"
    assert {n: (py[n], env[n]) for n in py if py[n] != env[n]} == {}, "version constraints differ"


def test_environment_yml_python_satisfies_requires_python():
    tomllib = pytest.importorskip("tomllib")
    floor = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    pinned = re.search(r"-\s*python\s*=\s*([\d.]+)", (ROOT / "environment.yml").read_text()).group(1)
    assert tuple(map(int, pinned.split("."))) >= tuple(map(int, floor.lstrip(">=").split(".")))


# ---------------------------------------------------------------- the wheel


def _copy_source(dest: Path) -> Path:
    """The files a build reads, as in a clean checkout (no caches, no egg-info, no venv)."""
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", ".ipynb_checkpoints", "*.pyc")
    for folder in ("fastlab", "notebooks"):
        shutil.copytree(ROOT / folder, dest / folder, ignore=ignore)
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """sdist first, then a wheel from that sdist: both steps must carry the notebooks."""
    src = _copy_source(tmp_path_factory.mktemp("src"))
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-c", f"from setuptools import build_meta as b; b.build_sdist({str(dist)!r})"],
                   cwd=src, check=True, capture_output=True, text=True, timeout=300)
    (sdist,) = dist.glob("fastlab-*.tar.gz")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                    "-q", "-w", str(dist), str(sdist)], check=True, capture_output=True, text=True, timeout=300)
    (whl,) = dist.glob("fastlab-*.whl")
    return whl


@pytest.mark.timeout(300)
def test_the_wheel_holds_every_notebook_and_nothing_only_tests_need(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    notebooks = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert notebooks and [n for n in notebooks if f"fastlab/notebooks/{n}" not in names] == []
    assert not any(n.endswith(("checked_outputs.json", "conftest.py")) for n in names)
    assert "fastlab/tools/install.py" in names and "fastlab/__main__.py" in names
    # the maintainers' GPU instruments (make gpu-check, gpu-notebooks, the reference run) stay in tests/
    assert not any(n.endswith(("gpu_check.py", "gpu_notebooks.py", "reference_run.py")) for n in names)
    assert "fastlab/points/h200-plain-pytorch.json" in names  # reference_points' table travels with the package
    assert "fastlab/claims.json" in names  # the claims table (fastlab.claims reads it)


@pytest.mark.timeout(300)  # the build (shared with the test above) and the smallest notebook: about a minute idle
def test_outside_the_repository_the_wheel_alone_gives_a_workbook_that_runs(wheel, tmp_path):
    site = tmp_path / "site"  # the wheel unpacked is what pip would install; torch comes from this environment
    zipfile.ZipFile(wheel).extractall(site)
    work = tmp_path / "class"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FASTLAB_DATA")}
    env.update(PYTHONPATH=str(site), FASTLAB_PROFILE="smoke", MPLBACKEND="Agg")
    where = subprocess.run([sys.executable, "-c", "import fastlab; print(fastlab.__file__)"], cwd=work, env=env,
                           capture_output=True, text=True, timeout=120)
    assert where.stdout.strip().startswith(str(site)), where  # the wheel's fastlab, not the checkout's

    out = subprocess.run([sys.executable, "-m", "fastlab", "notebooks", "workbook"], cwd=work, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    expected = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert sorted(p.name for p in (work / "workbook").glob("*.ipynb")) == expected

    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--nbval-lax",
                          "--nbval-current-env", SMALLEST_NOTEBOOK], cwd=work / "workbook", env=env,
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " passed" in run.stdout
