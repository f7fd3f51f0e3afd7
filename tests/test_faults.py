"""Faults a user's bad day brings (issue 50): values that are not numbers, a nested w.step, files that parse but hold
the wrong things, wrong data in the reader's Dataset. Each ends in one line naming what is wrong, before any timing."""

import math

import pytest

from fastlab import TrainConfig

# ----------------------------------------------------------------- values that are not numbers


@pytest.mark.parametrize("field, value", [
    ("lr", math.inf), ("lr", math.nan), ("max_seconds", math.nan), ("max_seconds", math.inf),
    ("weight_decay", math.nan), ("momentum", -math.inf),
])
def test_a_value_that_is_not_a_finite_number_is_refused_naming_the_field(field, value):
    with pytest.raises(ValueError) as e:
        TrainConfig(**{field: value})
    text = str(e.value)
    assert "\n" not in text and f"TrainConfig.{field}=" in text and "finite" in text, text


def test_more_workers_than_the_machine_can_start_are_refused_with_the_limit_named():
    from fastlab.config import max_workers

    limit = max_workers()
    TrainConfig(num_workers=limit)  # the limit itself is allowed
    with pytest.raises(ValueError) as e:
        TrainConfig(num_workers=10_000)
    assert f"at most {limit}" in str(e.value) and "\n" not in str(e.value)


def test_notebook_01s_worker_sweep_stays_under_the_limit():
    from fastlab.config import max_workers
    from fastlab.lessons.data_loading import worker_counts
    from fastlab.measure import usable_cpu_count

    assert max(worker_counts(usable_cpu_count())) <= max_workers()
    assert max(worker_counts(16)) <= max_workers()  # a reference run recorded on a 16-core machine replays anywhere


@pytest.mark.parametrize("args, fragment", [
    (["run", "--lr", "inf"], "TrainConfig.lr=inf is not allowed"),
    (["run", "--lr", "nan"], "TrainConfig.lr=nan is not allowed"),
    (["run", "--max-seconds", "nan"], "TrainConfig.max_seconds=nan is not allowed"),
    (["run", "--num-workers", "10000"], "TrainConfig.num_workers=10000 is not allowed"),
])
def test_the_cli_refuses_them_in_one_line(args, fragment, capsys, monkeypatch):
    from fastlab.__main__ import main

    monkeypatch.setenv("FASTLAB_PROFILE", "smoke")
    status = main(args + ["--out", "/nonexistent-never-written"])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and fragment in err, err


# ----------------------------------------------------------------- a w.step inside a w.step


def test_a_step_inside_a_step_is_refused_in_one_line():
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    import fastlab

    data = TensorDataset(torch.randn(8, 3, 4, 4), torch.randint(0, 10, (8,)))
    w = fastlab.watch("nested", warmup_steps=0)
    with pytest.raises(RuntimeError) as e:
        for x, _ in w(DataLoader(data, batch_size=4)):
            with w.step(len(x)):
                with w.step(len(x)):
                    pass
    text = str(e.value)
    assert "\n" not in text and text.startswith("fastlab.watch") and "inside" in text, text
    w2 = fastlab.watch("step_done inside", warmup_steps=0)
    with pytest.raises(RuntimeError, match="inside"):
        for x, _ in w2(DataLoader(data, batch_size=4)):
            with w2.step(len(x)):
                w2.step_done(len(x))


# ----------------------------------------------------------------- words said once


def test_a_failed_runs_summary_says_after_n_steps_once():
    from fastlab import RunResult

    r = RunResult({}, label="run")
    r.status, r.steps_done = "failed", 6
    r.error = "the run's process ended without a result (killed by SIGKILL) after 6 steps"
    assert r.summary().count("after 6 steps") == 1, r.summary()
    r.error = "RuntimeError: boom"
    assert r.summary() == "run: FAILED (RuntimeError: boom) after 6 steps"


# ----------------------------------------------------------------- files that parse but hold the wrong things


def _doc(**changes):
    from fastlab.results import SCHEMA_VERSION, RunResult

    return {"schema_version": SCHEMA_VERSION, "meta": {}, "results": [RunResult({}, label="a").to_dict()], **changes}


@pytest.mark.parametrize("doc, fragment", [
    (_doc(results=None), "'results'"),
    ({"schema_version": 1, "meta": {}}, "no 'results'"),
    (_doc(results=[{"label": "a", "status": 3}]), "results[0].status"),
    (_doc(results=["a run"]), "results[0]"),
    (_doc(results=[{"label": "a", "window_throughput": "fast"}]), "results[0].window_throughput"),
    (_doc(meta=[]), "'meta'"),
])
def test_a_results_file_of_the_right_version_with_wrong_fields_names_the_path_and_the_field(tmp_path, doc, fragment):
    import json

    from fastlab.results import load_results

    path = tmp_path / "results.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError) as e:
        load_results(path)
    text = str(e.value)
    assert str(path) in text and fragment in text and "\n" not in text, text


def test_a_binary_results_file_names_the_file(tmp_path):
    from fastlab.results import load_results

    path = tmp_path / "results.json"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00")
    with pytest.raises(ValueError) as e:
        load_results(path)
    assert str(path) in str(e.value), e.value


def test_the_cli_names_a_results_file_with_wrong_fields_in_one_line(tmp_path, capsys):
    import json

    from fastlab.__main__ import main

    path = tmp_path / "results.json"
    path.write_text(json.dumps({"schema_version": 1, "meta": {}}))
    assert main(["advise", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and "KeyError" not in err, err


@pytest.mark.parametrize("content", [
    b'{"schema_version": 1, "notebooks": []}',
    b'{"schema_version": 1, "notebooks": {"00_start_here": []}}',
    b'{"schema_version": 1, "notebooks": {"00_start_here": {"smoke": {"seconds": "long", "machine": 3}}}}',
    b'{"schema_version": 1, "notebooks": {"00_start_here": {"smoke": {"seconds": 5}}}}',
    b'{"schema_version": 1, "notebooks": {"00_start_here": {"smoke": {"seconds": 5, "status": "ok", "machine": "m", '
    b'"date": "2026-01-01", "load": "high"}}}}',
    b"\xff\xfe\x00binary",
    b"[1, 2]",
])
def test_a_damaged_timings_file_never_breaks_a_notebooks_first_cell(tmp_path, monkeypatch, capsys, content):
    from fastlab.tools.timings import begin_notebook

    path = tmp_path / "timings.json"
    path.write_bytes(content)
    monkeypatch.setenv("FASTLAB_TIMINGS", str(path))
    line = begin_notebook("00_start_here.ipynb", "smoke")
    assert "not measured yet" in line, line


def test_wrong_entries_in_the_timings_file_are_ignored_in_one_line_naming_the_path(tmp_path, capsys):
    from fastlab.tools.timings import load_timings

    path = tmp_path / "timings.json"
    path.write_text('{"schema_version": 1, "notebooks": {"a": {"smoke": {"seconds": "long"}, "cpu": {"seconds": 3, '
                    '"status": "ok", "machine": "m", "date": "2026-01-01"}}}}')
    assert list(load_timings(path)["a"]) == ["cpu"]
    said = capsys.readouterr()
    text = said.out + said.err
    assert text.count("\n") == 1 and str(path) in text and "a/smoke" in text, text


# ----------------------------------------------------------------- the verdict store


def test_the_verdict_store_never_drops_an_entry_it_cannot_read(tmp_path, monkeypatch, capsys):
    import json

    from fastlab import claims

    monkeypatch.setenv("FASTLAB_RESULTS_DIR", str(tmp_path))
    monkeypatch.setattr(claims, "_now", lambda: "2026-01-01T00:00:00+00:00")
    path = claims.store_path()
    path.write_text(json.dumps({"schema_version": claims.STORE_VERSION, "verdicts": [{"claim": "x", "odd": 1}]}))
    before = path.read_text()
    sample = claims.Verdict(claims.CLAIMS[0].id, claims.VERDICT_HEADS[0])
    claims.record(sample)
    asides = [p for p in tmp_path.iterdir() if ".unreadable-" in p.name]
    assert len(asides) == 1 and asides[0].read_text() == before  # the unreadable entry is kept, beside the store
    text = capsys.readouterr().out
    assert text.count("\n") == 1 and str(path) in text and asides[0].name in text, text
    assert [v.claim for v in claims.load_verdicts(path)] == [sample.claim]


# ----------------------------------------------------------------- wrong data in the reader's Dataset


class _Items(__import__("torch").utils.data.Dataset):
    """Images and labels as given, one per item."""

    def __init__(self, images, labels):
        self.images, self.labels = images, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.images[i], self.labels[i]


def _tiny_net():
    import torch

    return torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(3, 10))


@pytest.mark.parametrize("case, fragment", [
    ("float labels", "item 0 of the train dataset has label 0.0"),
    ("labels 1..10", "item 9 of the train dataset has label 10"),
    ("sizes differ", "item 7 of the train dataset"),
])
def test_wrong_data_is_named_in_one_line_by_its_item_before_any_timing(case, fragment):
    import torch

    from fastlab.preflight import preflight

    n = 40
    images = [torch.rand(3, 8, 8) for _ in range(n)]
    labels = [i % 10 for i in range(n)]
    if case == "float labels":
        labels = [float(y) for y in labels]
    if case == "labels 1..10":
        labels = [y + 1 for y in labels]
    if case == "sizes differ":
        images[7] = torch.rand(3, 9, 9)
    pair = (_Items(images, labels), _Items(images[:8], [i % 10 for i in range(8)]))
    with pytest.raises(ValueError) as e:
        preflight(_tiny_net, pair, TrainConfig(batch_size=4, device="cpu"))
    text = str(e.value)
    assert "\n" not in text and fragment in text, text


def test_ctrl_c_while_torch_loads_ends_the_cli_in_one_line(tmp_path):
    """A Ctrl-C in the first seconds of `python -m fastlab` (torch loading) is one line and status 130: a stand-in
    torch that is interrupted as it imports makes the moment exact."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise KeyboardInterrupt\n")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-m", "fastlab", "env"], cwd=root, capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(root)])})
    assert out.returncode == 130 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip() == "fastlab: interrupted (Ctrl-C) while starting — nothing was run"
