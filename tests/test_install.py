"""The install cell (tests/install_cell.py): no address built in, the install source a teacher sets once, the first cell
of every notebook; the notebook copy (fastlab.tools.install), and the Colab dry run: a fresh venv with only the
built wheel beside the notebook packages, a stub google.colab, a notebook run top to bottom outside the repository."""

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import types
from pathlib import Path

import install_cell
import pytest

import fastlab
from fastlab.tools import install

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def code_cells(path):
    return [c for c in json.loads(Path(path).read_text())["cells"] if c["cell_type"] == "code"]


def test_the_cell_reads_the_teachers_source_and_builds_in_no_address():
    source = install_cell.install_cell_source()
    compile(source, "install-cell", "exec")
    assert source.startswith(install_cell.CELL_TITLE) and install_cell.CELL_MARK in source and install_cell.SOURCE_ENV in source and install_cell.SOURCE_FILE in source
    assert "://" not in source and "git+" not in source


def test_ensure_notebooks_inserts_the_cell_once_as_the_first_code_cell(tmp_path, capsys):
    nb = shutil.copy(NOTEBOOKS[0], tmp_path / NOTEBOOKS[0].name)
    others = [c for c in code_cells(nb) if not install_cell._is_install_cell(c)]
    assert install_cell.main([str(tmp_path)]) == 0
    after = code_cells(nb)
    assert "".join(after[0]["source"]) == install_cell.install_cell_source() and after[0]["outputs"] == []
    assert after[0]["metadata"] == install_cell.CELL_METADATA  # collapsed: out of the learner's path
    assert after[1:] == others  # the notebook's own cells, untouched and not executed
    text = Path(nb).read_text()
    assert install_cell.main([str(tmp_path)]) == 0  # idempotent: nothing to do
    assert Path(nb).read_text() == text and "0 of 1 notebooks changed" in capsys.readouterr().out


def test_an_old_install_cell_is_updated_and_moved_first(tmp_path):
    nb = Path(shutil.copy(NOTEBOOKS[0], tmp_path / NOTEBOOKS[0].name))
    doc = json.loads(nb.read_text())
    doc["cells"] = [c for c in doc["cells"] if not install_cell._is_install_cell(c)]
    stale = {"cell_type": "code", "execution_count": None, "id": install_cell.CELL_ID, "metadata": {}, "outputs": [],
             "source": [install_cell.CELL_MARK + "\n", "pip install old-address\n"]}
    doc["cells"].append(stale)  # last, and out of date
    nb.write_text(json.dumps(doc))
    assert install_cell.ensure_install_cell(nb) is True
    cells = code_cells(nb)
    assert "".join(cells[0]["source"]) == install_cell.install_cell_source()
    assert sum(install_cell._is_install_cell(c) for c in cells) == 1
    assert install_cell.ensure_install_cell(nb) is False


def run_cell(capsys):
    exec(compile(install_cell.install_cell_source(), "install-cell", "exec"), {})
    return capsys.readouterr().out


@pytest.fixture
def no_fastlab(monkeypatch, tmp_path):
    """fastlab not importable, no install source set, the working folder empty."""
    monkeypatch.setitem(sys.modules, "fastlab", None)
    monkeypatch.delenv(install_cell.SOURCE_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def on_colab(monkeypatch):
    monkeypatch.setitem(sys.modules, "google", types.ModuleType("google"))
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))


def test_the_cell_imports_fastlab_when_it_is_there(capsys):
    assert f"fastlab {fastlab.__version__}" in run_cell(capsys)


@pytest.mark.parametrize("colab", [False, True])
def test_with_no_source_set_the_cell_says_what_to_set(no_fastlab, monkeypatch, capsys, colab):
    if colab:
        on_colab(monkeypatch)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("nothing to install from"))
    with pytest.raises(ModuleNotFoundError, match=f"{install_cell.SOURCE_ENV} is not set"):
        run_cell(capsys)
    out = capsys.readouterr().out
    assert f"%env {install_cell.SOURCE_ENV}=" in out and install_cell.SOURCE_FILE in out and str(no_fastlab) in out


def test_off_colab_the_cell_prints_the_line_for_the_teachers_source(no_fastlab, monkeypatch, capsys):
    monkeypatch.setenv(install_cell.SOURCE_ENV, "/srv/class/fastlab-0.1.0-py3-none-any.whl")
    with pytest.raises(ModuleNotFoundError, match="printed above"):
        run_cell(capsys)
    assert '%pip install "/srv/class/fastlab-0.1.0-py3-none-any.whl"' in capsys.readouterr().out


@pytest.mark.parametrize("where", ["env", "file"])
def test_on_colab_the_cell_installs_from_the_teachers_source(no_fastlab, monkeypatch, capsys, where):
    calls = []

    def fake_pip(cmd, check):
        calls.append(cmd)
        sys.modules["fastlab"] = fastlab  # what the install makes importable

    on_colab(monkeypatch)
    if where == "env":
        monkeypatch.setenv(install_cell.SOURCE_ENV, "/content/fastlab.whl")
    else:
        (no_fastlab / install_cell.SOURCE_FILE).write_text("/content/fastlab.whl\n")
    monkeypatch.setattr(subprocess, "run", fake_pip)
    assert "fastlab " in run_cell(capsys)
    assert calls == [[sys.executable, "-m", "pip", "install", "--quiet", "/content/fastlab.whl"]]


def test_a_copy_made_earlier_and_not_edited_is_updated(tmp_path):
    report = install.copy_notebooks(tmp_path)
    assert len(report.copied) == len(NOTEBOOKS)
    old = tmp_path / NOTEBOOKS[0].name
    old.write_text("{}")  # an older fastlab's copy, recorded as written by that copy
    manifest = json.loads((tmp_path / install.MANIFEST).read_text())
    manifest[old.name] = install._sha256(old)
    (tmp_path / install.MANIFEST).write_text(json.dumps(manifest))
    report = install.copy_notebooks(tmp_path)
    assert report.updated == [old.name] and report.kept == [] and old.read_bytes() == NOTEBOOKS[0].read_bytes()


def test_every_repository_notebook_starts_with_the_current_install_cell():
    """Fails until `python tests/install_cell.py notebooks/` has been run on the repository."""
    stale = [p.name for p in NOTEBOOKS if not install_cell.has_current_install_cell(json.loads(p.read_text()))]
    assert stale == [], f"run `python tests/install_cell.py notebooks/`; stale: {stale}"


UNSEEN_ADDRESSES = re.compile(r"fastlab-workbook|git\+https?://|github\.com/[\w.-]+/fastlab\b")


def test_no_unverified_install_address_anywhere_in_the_repository():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    hits = []
    for name in files:
        path = ROOT / name
        if path.suffix in (".png", ".whl", ".gz") or not path.is_file() or name == "tests/test_install.py":
            continue
        hits += [f"{name}: {m.group(0)}" for m in UNSEEN_ADDRESSES.finditer(path.read_text(errors="replace"))]
    assert hits == []


def test_the_readme_and_the_workshop_guide_say_how_to_set_the_source():
    for doc in ("README.md", "docs/workshop.md"):
        text = (ROOT / doc).read_text()
        assert install_cell.SOURCE_ENV in text and install_cell.SOURCE_FILE in text and "pip install ." in text, doc
        assert "pip wheel --no-deps" in text, doc


# ---------------------------------------------------------------- the Colab dry run


def build_wheel(dest: Path) -> Path:
    """A wheel built from a copy of the checkout's files (no caches, no egg-info), offline."""
    src = dest / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", ".ipynb_checkpoints", "*.pyc")
    for folder in ("fastlab", "notebooks"):
        shutil.copytree(ROOT / folder, src / folder, ignore=ignore)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                    "-w", str(dest), str(src)], check=True, capture_output=True, text=True, timeout=300)
    (whl,) = dest.glob("fastlab-*.whl")
    return whl


def fresh_venv(dest: Path) -> Path:
    """A new venv that sees this environment's packages (torch, jupyter, pip ...) but not its fastlab.

    Installing torch into a new venv takes minutes and gigabytes, so a .pth file lists a folder of links to
    every entry of this environment's site-packages except fastlab's (its editable finder, its .pth and its
    dist-info): a folder named by a .pth is added to sys.path, but the .pth files inside it are not run, and
    pip sees no fastlab it could uninstall."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)], check=True, timeout=120)
    view = dest / "view-of-the-dev-environment"
    view.mkdir()
    here = Path(sysconfig.get_paths()["purelib"])
    for entry in here.iterdir():
        if not re.match(r"(__editable__[._]*)?_?fastlab", entry.name):
            (view / entry.name).symlink_to(entry)
    python = dest / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    (Path(purelib) / "dev-environment.pth").write_text(f"{view}\n")
    return python


@pytest.mark.timeout(300)
def test_a_colab_dry_run_installs_the_wheel_from_the_first_cell_and_runs_a_notebook(tmp_path):
    wheel = build_wheel(tmp_path)
    python = fresh_venv(tmp_path / "venv")
    stub = tmp_path / "stub" / "google" / "colab"  # google stays a namespace package (protobuf lives in it too)
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FASTLAB_DATA", "VIRTUAL_ENV")}
    env.update(PYTHONPATH=str(tmp_path / "stub"), FASTLAB_PROFILE="smoke", MPLBACKEND="Agg", PIP_NO_INDEX="1",
               FASTLAB_RESULTS_DIR=str(tmp_path / "results"), **{install_cell.SOURCE_ENV: str(wheel)})
    content = tmp_path / "content"  # Colab's working folder: outside the repository
    content.mkdir()
    before = subprocess.run([str(python), "-c", "import fastlab"], cwd=content, env=env, capture_output=True,
                            text=True)
    assert before.returncode != 0 and "No module named 'fastlab'" in before.stderr  # only the wheel will bring it
    shutil.copy(ROOT / "notebooks" / "00_start_here.ipynb", content)
    run = subprocess.run([str(python), "-m", "nbconvert", "--to", "notebook", "--execute", "--output", "ran.ipynb",
                          "--ExecutePreprocessor.timeout=240", "00_start_here.ipynb"], cwd=content, env=env,
                         capture_output=True, text=True, timeout=280)
    assert run.returncode == 0, run.stderr[-4000:]
    cells = json.loads((content / "ran.ipynb").read_text())["cells"]
    first = "".join("".join(o.get("text", "")) for o in code_cells_of(cells)[0]["outputs"])
    installed = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                    capture_output=True, text=True, check=True).stdout.strip())
    assert f"fastlab {fastlab.__version__} from {installed / 'fastlab'}" in first, first


def code_cells_of(cells: list) -> list:
    return [c for c in cells if c["cell_type"] == "code"]
