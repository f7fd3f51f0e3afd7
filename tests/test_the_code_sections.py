"""Every technique notebook shows its technique's PyTorch lines and has the learner write them.

"The code": a section headed so, before the notebook's first numbered section, whose code cells compute the diff
(fastlab.code_diff, or a snippet diff for a technique without a config knob): never a diff typed by hand. Its
cells are run here (code generation only, no training) and what they show must name the technique's own calls.

"Write it yourself": a plain loop (tagged exercise-given), the learner's copy (exercise-mine), the worked solution
in a collapsed cell (exercise-solution) and the measuring cell (exercise-check). The cells are run here under the
smoke profile: the solution is what is measured, through compare_loops, against the unedited loop.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import linecache
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"

# notebook -> the PyTorch calls its "The code" section must name (in its cells or in the diffs they compute; any case)
CODE_CALLS_01_06: dict[str, list[str]] = {
    "01_data_loading": ["pin_memory", "num_workers", "non_blocking"],
    "02_mixed_precision": ["autocast", "GradScaler"],
    "03_cudnn_benchmark_and_channels_last": ["channels_last", "cudnn.benchmark"],
    "04_batch_size": ["batch_size", "lr"],  # the batch and its rescaled learning rate
    "05_no_grad_detach_item": ["no_grad", ".item()", "detach"],
    "06_adamw_and_schedules": ["AdamW", "fused", "CosineAnnealingLR"],
}
CODE_CALLS_07_12: dict[str, list[str]] = {
    "07_compile_and_export": ["torch.compile", "torch.export", "onnx"],
    "08_profiling": ["profiler", "schedule", "prof.step"],
    "09_all_together": ["num_workers", "channels_last", "autocast", "fused", "DeviceLoader"],  # the checklist's lines
    "10_your_own_model": ["fastlab.watch", "w.step", "w.paused"],  # fastlab.watch on the reader's own loop
    "11_multi_gpu_ddp": ["DistributedDataParallel", "init_process_group", "DistributedSampler"],
    "12_memory": ["checkpoint", "use_reentrant=False", "set_to_none"],
}
CODE_CALLS = {**CODE_CALLS_01_06, **CODE_CALLS_07_12}
# 09 names its config `base`, 10 takes its own model's (own_model.notebook_config)
SETUP = re.compile(r"^(cfg|base)(, note)? = (fastlab\.config_for|own_model\.notebook_config)\(\)", re.M)
DIFF_CALLS = re.compile(r"\b(code_diff|snippet_diff|solution_diff)\(")
EXERCISE_TAGS = ("exercise-given", "exercise-mine", "exercise-solution", "exercise-check")


def cells(name: str) -> list[dict]:
    return json.loads((NOTEBOOKS / f"{name}.ipynb").read_text())["cells"]


def text(cell: dict) -> str:
    return "".join(cell["source"])


def the_code_section(nb: list[dict]) -> tuple[int, list[dict]]:
    """(index of the heading, the section's cells up to the next ## heading)."""
    start = next(i for i, c in enumerate(nb) if c["cell_type"] == "markdown" and text(c).startswith("## The code"))
    end = next((i for i in range(start + 1, len(nb))
                if nb[i]["cell_type"] == "markdown" and re.match(r"## ", text(nb[i]))), len(nb))
    return start, nb[start:end]


def setup_cell(nb: list[dict]) -> dict:
    """The notebook's import cell: the first code cell that sets cfg."""
    return next(c for c in nb if c["cell_type"] == "code" and SETUP.search(text(c)))


def run_cell(source: str, namespace: dict[str, Any], label: str) -> str:
    """Exec a cell as IPython would (its source kept in linecache, so inspect.getsource works); its stdout."""
    filename = f"<{label}>"
    source = re.sub(r"^%.*$", "pass  # an IPython magic", source, flags=re.M)  # 09 and 10 set %matplotlib inline
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(source, filename, "exec"), namespace)
    return out.getvalue()


def shown_last(source: str) -> str:
    """The cell with its last expression passed to display(), as Jupyter shows it."""
    tree = ast.parse(source)
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body[-1]
        tree.body[-1] = ast.Expr(ast.Call(ast.Name("display", ast.Load()), [last.value], []))
        ast.fix_missing_locations(tree)
        return ast.unparse(tree)
    return source


def notebook_namespace(nb: list[dict], name: str) -> tuple[dict[str, Any], list[Any]]:
    shown: list[Any] = []
    namespace: dict[str, Any] = {"display": shown.append, "__name__": f"notebook_{name}"}
    run_cell(text(setup_cell(nb)), namespace, f"{name}:setup")
    return namespace, shown


@pytest.fixture
def smoke(monkeypatch, tmp_path):
    monkeypatch.setenv("FASTLAB_PROFILE", "smoke")
    monkeypatch.setenv("FASTLAB_RESULTS_DIR", str(tmp_path))
    monkeypatch.delenv("FASTLAB_SOLUTION", raising=False)


def test_the_dicts_cover_every_technique_notebook():
    names = {p.stem for p in NOTEBOOKS.glob("[01][0-9]_*.ipynb")} - {"00_start_here"}
    assert set(CODE_CALLS_01_06) <= names and not set(CODE_CALLS_01_06) & set(CODE_CALLS_07_12)


@pytest.mark.parametrize("name", sorted(CODE_CALLS))
def test_the_code_section_computes_its_diff_and_names_the_calls(name, smoke):
    nb = cells(name)
    start, section = the_code_section(nb)
    first_numbered = next(i for i, c in enumerate(nb) if c["cell_type"] == "markdown" and re.match(r"## 1\. ", text(c)))
    assert start < first_numbered, "'The code' comes right after the claim, before section 1"
    code_cells = [c for c in section if c["cell_type"] == "code"]
    assert code_cells and all(DIFF_CALLS.search(text(c)) for c in code_cells[:1]), "the diff is computed in a cell"
    for c in section:
        if c["cell_type"] == "markdown":  # a diff typed into prose would not follow the code
            assert not re.search(r"^(\+\+\+|---|@@) ", text(c), re.M), f"a hand-typed diff in {name}'s prose"
    namespace, shown = notebook_namespace(nb, name)
    printed = ""
    for i, c in enumerate(code_cells):
        printed += run_cell(shown_last(text(c)), namespace, f"{name}:the_code:{i}")
    diffs = [str(d) for d in shown] + [printed]
    computed = "\n".join(diffs)
    assert re.search(r"^\+ ", computed, re.M), f"{name}: the section's cells show no added line"
    everything = "\n".join(text(c) for c in section) + "\n" + computed
    missing = [call for call in CODE_CALLS[name] if call.lower() not in everything.lower()]
    assert not missing, f"{name}'s 'The code' never names {missing}"
    assert any(call.lower() in computed.lower() for call in CODE_CALLS[name]), f"{name}: no call in the computed diffs"


@pytest.mark.parametrize("name", sorted(CODE_CALLS_01_06))
def test_the_code_under_the_gpu_profile_shows_every_change(name, monkeypatch, tmp_path):
    """The gpu profile's own settings (log_every=10, the device loader) must not hide a diff's change."""
    monkeypatch.setenv("FASTLAB_PROFILE", "gpu")
    monkeypatch.setenv("FASTLAB_RESULTS_DIR", str(tmp_path))
    nb = cells(name)
    namespace, shown = notebook_namespace(nb, name)
    _, section = the_code_section(nb)
    printed = "".join(run_cell(shown_last(text(c)), namespace, f"{name}:the_code:{i}")
                      for i, c in enumerate(c for c in section if c["cell_type"] == "code"))
    diffs = [d for d in shown if hasattr(d, "added")]
    assert diffs and all(d.added or d.removed for d in diffs), [str(d) for d in diffs]
    if name.startswith("03_"):  # the gpu profile's loader converts the batches: its line is shown, not only evaluate's
        assert "x = x.contiguous(memory_format=torch.channels_last)" in printed, printed


@pytest.mark.parametrize("name", sorted(CODE_CALLS))
def test_write_it_yourself_runs_its_solution_through_compare_loops(name, smoke, monkeypatch):
    from fastlab import exercise
    from fastlab.watch import LoopComparison

    nb = cells(name)
    tagged = {tag: [c for c in nb if tag in c["metadata"].get("tags", [])] for tag in EXERCISE_TAGS}
    assert all(len(v) == 1 for v in tagged.values()), f"{name}: one cell per tag {EXERCISE_TAGS}"
    assert tagged["exercise-solution"][0]["metadata"]["jupyter"]["source_hidden"], "the solution is collapsed"
    heading = next(c for c in nb if text(c).startswith("### Write it yourself"))
    assert nb.index(heading) < nb.index(tagged["exercise-given"][0]) < nb.index(tagged["exercise-check"][0])

    calls = []
    real = exercise.compare_loops

    def spy(before, after, *args, **kwargs):
        calls.append((before, after))
        return real(before, after, *args, **kwargs)

    monkeypatch.setattr(exercise, "compare_loops", spy)
    namespace, shown = notebook_namespace(nb, name)
    for tag in EXERCISE_TAGS[:3]:
        run_cell(text(tagged[tag][0]), namespace, f"{name}:{tag}")
    given, mine, solved = namespace["given_loop"], namespace["my_loop"], namespace["solved_loop"]
    assert exercise.unchanged(given, mine), "the learner's cell starts as a copy of the given loop"
    diff = exercise.solution_diff(given, solved)
    added = "\n".join(diff.added).lower()
    assert added and any(call.lower() in added for call in CODE_CALLS[name]), \
        f"{name}: the solution's added lines name none of {CODE_CALLS[name]}"
    check_cell = text(tagged["exercise-check"][0])
    technique = re.search(r'technique="(\w+)"', check_cell).group(1)
    printed = run_cell(check_cell, namespace, f"{name}:exercise-check")
    assert calls == [] and "nothing was measured" in printed, "under smoke the learner's unedited loop is not run"
    assert exercise.TECHNIQUES[technique].line in printed  # the unedited loop: the technique's line is missing
    # an edit that adds no technique is measured, and the check names what the watch saw instead
    edited = exercise.loop_source(given).replace("def given_loop(w):", "def edited_loop(w):\n    unused = None", 1)
    run_cell(edited, namespace, f"{name}:edited")
    printed = run_cell(check_cell.replace("my_loop", "edited_loop"), namespace, f"{name}:edited-check")
    assert namespace["comparison"].technique == (technique, False), printed
    assert "the technique is missing from edited_loop: the watch saw" in printed
    calls.clear()
    monkeypatch.setenv("FASTLAB_SOLUTION", "1")
    printed = run_cell(check_cell, namespace, f"{name}:exercise-check")
    assert calls == [(given, solved)], "with FASTLAB_SOLUTION=1 the solution is measured, against the given loop"
    assert namespace["comparison"].technique == (technique, True), printed
    comparison = namespace["comparison"]
    assert isinstance(comparison, LoopComparison) and comparison.outcome != "failed", printed
    assert all(r.ok and r.window_throughput for r in comparison.before + comparison.after)
    assert "worked solution" in printed and comparison.outcome in printed  # the words follow the measurement


def test_the_learners_loop_runs_under_every_profile_unless_the_flag_asks_for_the_solution(monkeypatch, capsys):
    from fastlab import exercise

    def yours(w):
        return w

    def answer(w):
        return None

    monkeypatch.delenv(exercise.SOLUTION_ENV, raising=False)
    for profile in ("smoke", "cpu"):  # a workshop room under smoke measures its own edits
        monkeypatch.setenv("FASTLAB_PROFILE", profile)
        assert not exercise.solution_runs() and exercise.pick(yours, answer) is yours
    assert "your loop, yours" in capsys.readouterr().out
    monkeypatch.setenv(exercise.SOLUTION_ENV, "1")  # CI's make test
    assert exercise.solution_runs() and exercise.pick(yours, answer) is answer
    assert "worked solution" in capsys.readouterr().out


def test_an_unedited_copy_is_not_measured_and_an_edit_is(monkeypatch, capsys):
    from fastlab import exercise

    def given(w):
        total = 0
        for x in w([1, 2]):
            total += x
        return total

    def copy(w):  # the same body under another name
        total = 0
        for x in w([1, 2]):
            total += x
        return total

    def commented(w):  # an edit of comments and layout only: the same code runs
        total = 0  # the running total

        for x in w([1,
                    2]):
            total += x  # add the technique here
        return total

    def edited(w):
        total = 0
        for x in w([1, 2]):
            total += 2 * x
        return total

    measured = []
    def fake(before, after, **options):
        measured.append((before, after))
        return SimpleNamespace(text=lambda: "measured", not_compared="")

    monkeypatch.setattr(exercise, "compare_loops", fake)
    assert exercise.check(given, copy) is None and not measured
    assert "nothing was measured" in capsys.readouterr().out
    assert exercise.check(given, commented) is None and not measured
    assert "comments and layout aside" in capsys.readouterr().out
    exercise.check(given, edited)
    assert measured == [(given, edited)]
    diff = exercise.solution_diff(given, edited)
    assert diff.added == ["        total += 2 * x"] and diff.removed == ["        total += x"]


@pytest.mark.parametrize("name", sorted(CODE_CALLS))
def test_every_exercise_trains_on_the_notebooks_device(name):
    """In a GPU room the exercise's model and batches are on the GPU: a model built on the CPU would measure fused
    AdamW, checkpointing or the profiler there."""
    nb = cells(name)
    given, solution = (text(next(c for c in nb if tag in c["metadata"].get("tags", [])))
                       for tag in ("exercise-given", "exercise-solution"))
    assert re.search(r"^device = resolve_device\((cfg|base)\.device\)", given, re.M) or name.startswith("10_"), name
    for source in (given, solution):
        for line in source.splitlines():
            assert "build_model(" not in line or ".to(device" in line, f"{name}: {line.strip()}"
