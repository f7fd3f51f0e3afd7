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


GOING_FURTHER = "## Going further"
CORE_PATH_MAX = 15  # cells, markdown and code both
# issue 38: every technique notebook (01 to 12; 00 is the method, dashboard the results) opens with its core path
CORE_PATH_NOTEBOOKS = [p.name for p in NOTEBOOKS if re.match(r"\d\d_", p.name) and p.name != "00_start_here.ipynb"]
EXERCISE_TAGS = ("exercise-given", "exercise-mine", "exercise-solution", "exercise-check")


def core_path(nb: dict) -> list[dict] | None:
    """The cells before the markdown cell whose first line is `## Going further`; None without one."""
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "markdown" and "".join(cell["source"]).split("\n", 1)[0] == GOING_FURTHER:
            return nb["cells"][:i]
    return None


def test_every_technique_notebook_has_a_core_path():
    assert len(CORE_PATH_NOTEBOOKS) == 12, CORE_PATH_NOTEBOOKS
    missing = [name for name in CORE_PATH_NOTEBOOKS
               if core_path(json.loads((NOTEBOOKS[0].parent / name).read_text())) is None]
    assert not missing, f"{missing} have no {GOING_FURTHER!r} cell"


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if core_path(json.loads(p.read_text())) is not None],
                         ids=lambda p: p.name)
def test_the_core_path_is_short_and_holds_the_code_and_the_exercise(path):
    """Issue 38: before "Going further", at most 15 cells: the claim, install, setup, "The code", one comparison and
    its verdict, and the "Write it yourself" exercise, whole."""
    core = core_path(json.loads(path.read_text()))
    assert len(core) <= CORE_PATH_MAX, f"{path.name}: {len(core)} cells before {GOING_FURTHER!r}"
    headings = ["".join(c["source"]) for c in core if c["cell_type"] == "markdown"]
    assert any(h.startswith("## The code") for h in headings), f"{path.name}: 'The code' is not in the core path"
    assert any(h.startswith("### Write it yourself") for h in headings), f"{path.name}: no 'Write it yourself'"
    tags = [t for c in core for t in c.get("metadata", {}).get("tags", [])]
    assert all(tags.count(t) == 1 for t in EXERCISE_TAGS), f"{path.name}: the exercise's cells {EXERCISE_TAGS}"


def test_the_core_path_check_catches_a_long_one():
    cells = [{"cell_type": "markdown", "source": [f"## {i}"]} for i in range(16)]
    nb = {"cells": cells + [{"cell_type": "markdown", "source": ["## Going further\n", "What follows."]}]}
    assert len(core_path(nb)) == 16 and core_path({"cells": cells}) is None
    assert core_path({"cells": [{"cell_type": "markdown", "source": ["## Going further, and more"]}]}) is None


def redefined_signatures(nb: dict) -> list[str]:
    """Top-level functions a notebook defines twice with different parameters: re-running the earlier cell's caller
    after the later cell ran would call the wrong one (a TypeError in a learner's face)."""
    import ast

    seen: dict[str, list[str]] = {}
    found = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        try:
            tree = ast.parse("".join(line for line in cell["source"] if not line.lstrip().startswith(("%", "!"))))
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                params = [a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]
                if node.name in seen and seen[node.name] != params:
                    found.append(f"{node.name}({', '.join(seen[node.name])}) is defined again as "
                                 f"{node.name}({', '.join(params)})")
                seen[node.name] = params
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_function_name_keeps_its_signature(path):
    assert redefined_signatures(json.loads(path.read_text())) == []


def test_the_signature_check_catches_a_redefinition():
    nb = {"cells": [{"cell_type": "code", "source": ["def my_loop(w):\n", "    pass\n"]},
                    {"cell_type": "code", "source": ["def my_loop(w):  # the learner's copy\n", "    return 1\n"]},
                    {"cell_type": "code", "source": ["def my_loop(w, loader):\n", "    pass\n"]}]}
    assert redefined_signatures(nb) == ["my_loop(w) is defined again as my_loop(w, loader)"]


NUMBERED = re.compile(r"(\d+)([a-z]?)\. \S")  # "5. Title", "5b. Title"
UNNUMBERED = ("The code", "Going further", "Checklist", "Guard rails")
# the dashboard is no technique notebook: its sections are the panel's parts, unnumbered
UNNUMBERED_ALSO = {"dashboard.ipynb": ("The knobs", "The baseline", "The panel")}


def level_two_headings(nb: dict) -> list[str]:
    """The `## ` headings of the markdown cells, in reading order, without the `## ` (none from fenced code)."""
    found = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        fenced = False
        for line in "".join(cell["source"]).splitlines():
            if line.lstrip().startswith("```"):
                fenced = not fenced
            elif not fenced and line.startswith("## "):
                found.append(line[3:].strip())
    return found


def heading_order_problems(headings: list[str], unnumbered: tuple[str, ...] = UNNUMBERED) -> list[str]:
    """Numbered headings read 1, 2, 3 ... in order, each the one before + 1; a lettered one (5b, 5c) follows its
    number's headings in alphabetical order, the plain number counting as its "a"; any other heading is one of
    `unnumbered`, word for word."""
    found, number, letter = [], 0, "a"
    for heading in headings:
        m = NUMBERED.match(heading)
        if m is None:
            if heading not in unnumbered:
                found.append(f"{heading!r} is neither numbered ('N. Title') nor one of {list(unnumbered)}")
            continue
        n, suffix = int(m.group(1)), m.group(2)
        if not suffix and n != number + 1:
            found.append(f"{heading!r} comes after section {number or 'none'}: expected {number + 1}")
        elif suffix and (n != number or suffix != chr(ord(letter) + 1)):
            found.append(f"{heading!r} comes after {number}{'' if letter == 'a' else letter}: "
                         f"expected {number}{chr(ord(letter) + 1)} or {number + 1}")
        number, letter = n, suffix or "a"
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_numbered_headings_are_in_reading_order(path):
    """A reader who meets 1, 2, 5, 3 looks for the missing sections: the numbers count up by one as the cells read."""
    headings = level_two_headings(json.loads(path.read_text()))
    problems = heading_order_problems(headings, UNNUMBERED + UNNUMBERED_ALSO.get(path.name, ()))
    assert not problems, f"{path.name}: {problems}"


def test_the_heading_check_catches_what_it_looks_for():
    assert heading_order_problems(["The code", "1. A", "2. B", "2b. C", "3. D", "Going further", "4. E",
                                   "Checklist", "Guard rails"]) == []
    assert heading_order_problems(["1. A", "2. B", "5. C", "3. D"]) == [
        "'5. C' comes after section 2: expected 3", "'3. D' comes after section 5: expected 6"]
    assert len(heading_order_problems(["2. A"])) == 1  # the first is 1
    assert len(heading_order_problems(["1. A", "1c. B"])) == 1  # b before c
    assert len(heading_order_problems(["1. A", "2b. B"])) == 1  # a letter follows its own number
    assert len(heading_order_problems(["1. A", "Pitfalls", "2 B"])) == 2  # neither numbered nor allowed
    nb = {"cells": [{"cell_type": "markdown", "source": ["## 1. A\n", "```\n", "## 7 in a fence\n", "```\n"]},
                    {"cell_type": "code", "source": ["## 9. a comment"]},
                    {"cell_type": "markdown", "source": ["### 4. a level three\n", "## 2. B"]}]}
    assert level_two_headings(nb) == ["1. A", "2. B"]


CONCLUDES = re.compile(r"""claims\.conclude\(\s*["'](C\d+)["']""")
VERDICT = re.compile(r"\bverdict\w*\(")  # fastlab.verdict, runs_verdict, tta_verdict ... printed
CLAIMS_OF = {}
for _claim in json.loads((NOTEBOOKS[0].parents[1] / "fastlab" / "claims.json").read_text())["claims"]:
    CLAIMS_OF.setdefault(_claim["notebook"] + ".ipynb", []).append(_claim["id"])
# A core path whose run measures a technique no claim names: it ends with that comparison's verdict
CORE_RUN_NAMES_NO_CLAIM = {"07_compile_and_export.ipynb": "torch.compile (C14, export, is judged in section 7)"}


def core_verdict_problems(core: list[dict], claim_ids: list[str]) -> list[str]:
    """The core path's last code cell before its exercise (the cells tagged EXERCISE_TAGS) prints the verdict: the
    conclusion on one of the notebook's claims (`claims.conclude("C1", ...)`), or where the notebook has none in
    fastlab/claims.json, a comparison's verdict."""
    cells = [c for c in core if c["cell_type"] == "code"
             and not set(c.get("metadata", {}).get("tags", [])) & set(EXERCISE_TAGS)]
    if not cells:
        return ["the core path has no code cell before its exercise"]
    last = "".join(cells[-1]["source"])
    if claim_ids:
        concluded = CONCLUDES.findall(last)
        if not set(concluded) & set(claim_ids):
            return [f"the core path's last cell before the exercise concludes none of {claim_ids}"
                    + (f" (it concludes {concluded})" if concluded else f": it starts {last[:60]!r}")]
    elif not (CONCLUDES.search(last) or VERDICT.search(last)):
        return [f"the core path's last cell before the exercise prints no verdict: it starts {last[:60]!r}"]
    return []


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.name in CORE_PATH_NOTEBOOKS], ids=lambda p: p.name)
def test_the_core_path_ends_with_its_verdict(path):
    """DESIGN, "A technique notebook": the core path is the claim, the code, the run and the verdict on the claim
    (step 8), then the one "Write it yourself"; so the last cell before the exercise prints the verdict."""
    core = core_path(json.loads(path.read_text()))
    assert core is not None
    claim_ids = [] if path.name in CORE_RUN_NAMES_NO_CLAIM else CLAIMS_OF.get(path.name, [])
    assert core_verdict_problems(core, claim_ids) == []


def test_the_verdict_check_catches_what_it_looks_for():
    def code(source, *tags):
        return {"cell_type": "code", "source": [source], "metadata": {"tags": list(tags)}}

    exercise = [{"cell_type": "markdown", "source": ["### Write it yourself"]}] + [
        code("comparison = exercise.check(given_loop, my_loop)", tag) for tag in EXERCISE_TAGS]
    concludes = code('print(claims.conclude("C1", lesson.judge(runs), runs))')
    compares = code("print(fastlab.verdict(a.throughput, b.throughput))")
    plots = code("plots.plot_comparison(runs)")
    assert core_verdict_problems([concludes] + exercise, ["C1", "C2"]) == []
    assert core_verdict_problems([compares] + exercise, []) == []
    assert len(core_verdict_problems([concludes, plots] + exercise, ["C1"])) == 1  # not the last before it
    assert len(core_verdict_problems([compares] + exercise, ["C1"])) == 1  # a comparison, not the claim's verdict
    assert "concludes ['C15']" in core_verdict_problems(
        [code('claims.conclude("C15", finding)')] + exercise, ["C1"])[0]  # another notebook's claim
    assert len(core_verdict_problems(exercise, [])) == 1
