"""fastlab.install: the install address in one place, the first cell of every notebook, the notebook copy."""

import json
import shutil
import sys
import types
from pathlib import Path

import pytest

import fastlab
from fastlab import install

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def code_cells(path):
    return [c for c in json.loads(Path(path).read_text())["cells"] if c["cell_type"] == "code"]


def test_the_cell_is_generated_from_the_one_address():
    source = install.install_cell_source()
    compile(source, "install-cell", "exec")
    assert source.startswith(install.CELL_MARK) and install.PIP_TARGET in source
    assert install.PIP_TARGET.endswith(install.PROJECT_URL) and install.PROJECT_URL in install.INSTALL_LINE
    assert "other/url" in install.install_cell_source("fastlab @ git+https://example.org/other/url")


def test_ensure_notebooks_inserts_the_cell_once_as_the_first_code_cell(tmp_path, capsys):
    nb = shutil.copy(NOTEBOOKS[0], tmp_path / NOTEBOOKS[0].name)
    others = [c for c in code_cells(nb) if not install._is_install_cell(c)]
    assert install.main(["--ensure-notebooks", str(tmp_path)]) == 0
    after = code_cells(nb)
    assert "".join(after[0]["source"]) == install.install_cell_source() and after[0]["outputs"] == []
    assert after[1:] == others  # the notebook's own cells, untouched and not executed
    text = Path(nb).read_text()
    assert install.main(["--ensure-notebooks", str(tmp_path)]) == 0  # idempotent: nothing to do
    assert Path(nb).read_text() == text and "0 of 1 notebooks changed" in capsys.readouterr().out


def test_an_old_install_cell_is_updated_and_moved_first(tmp_path):
    nb = Path(shutil.copy(NOTEBOOKS[0], tmp_path / NOTEBOOKS[0].name))
    doc = json.loads(nb.read_text())
    doc["cells"] = [c for c in doc["cells"] if not install._is_install_cell(c)]
    stale = {"cell_type": "code", "execution_count": None, "id": install.CELL_ID, "metadata": {}, "outputs": [],
             "source": [install.CELL_MARK + "\n", "pip install old-address\n"]}
    doc["cells"].append(stale)  # last, and out of date
    nb.write_text(json.dumps(doc))
    assert install.ensure_install_cell(nb) is True
    cells = code_cells(nb)
    assert "".join(cells[0]["source"]) == install.install_cell_source()
    assert sum(install._is_install_cell(c) for c in cells) == 1
    assert install.ensure_install_cell(nb) is False


def run_cell(capsys):
    exec(compile(install.install_cell_source(), "install-cell", "exec"), {})
    return capsys.readouterr().out


def test_the_cell_imports_fastlab_or_prints_the_install_line(monkeypatch, capsys):
    assert f"fastlab {fastlab.__version__}" in run_cell(capsys)
    monkeypatch.setitem(sys.modules, "fastlab", None)  # fastlab not importable, and not on Colab
    with pytest.raises(ModuleNotFoundError, match="printed above"):
        run_cell(capsys)
    assert f'%pip install "{install.PIP_TARGET}"' in capsys.readouterr().out


def test_on_colab_the_cell_installs_fastlab(monkeypatch, capsys):
    import subprocess

    calls = []

    def fake_pip(cmd, check):
        calls.append(cmd)
        sys.modules["fastlab"] = fastlab  # what the install makes importable

    monkeypatch.setitem(sys.modules, "fastlab", None)
    monkeypatch.setitem(sys.modules, "google", types.ModuleType("google"))
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    monkeypatch.setattr(subprocess, "run", fake_pip)
    assert "fastlab " in run_cell(capsys)
    assert calls == [[sys.executable, "-m", "pip", "install", "--quiet", install.PIP_TARGET]]


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
    """Fails until `python -m fastlab.install --ensure-notebooks notebooks/` has been run on the repository."""
    stale = [p.name for p in NOTEBOOKS if not install.has_current_install_cell(json.loads(p.read_text()))]
    assert stale == [], f"run `python -m fastlab.install --ensure-notebooks notebooks/`; stale: {stale}"


def test_the_readme_gives_the_same_install_address():
    assert install.PIP_TARGET in (ROOT / "README.md").read_text()
