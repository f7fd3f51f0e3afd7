import json
from pathlib import Path

import pytest

import fastlab
from fastlab import files
from fastlab.measure import Spread
from fastlab.results import SCHEMA_VERSION, RunResult, TtaRecord, load_document, load_results, save_results
from fastlab.verdicts import is_noise


def make(label="r", windows=(100.0, 110.0, 120.0), **kw):
    return RunResult(config=fastlab.TrainConfig().to_dict(), label=label, window_throughput=list(windows),
                     dataset={"name": "synthetic", "synthetic": True}, env={"device_name": "CPU"}, **kw)


def test_round_trip(tmp_path):
    rs = [make("a", losses=[(0, 2.3), (1, 2.1)]), make("b", status="interrupted", steps_done=3)]
    path = save_results(tmp_path / "sub" / "results.json", rs, meta={"kind": "test"})
    back = load_results(path)
    assert [r.label for r in back] == ["a", "b"] and back[1].status == "interrupted"
    assert back[0].throughput == rs[0].throughput
    doc = load_document(path)
    assert doc["schema_version"] == SCHEMA_VERSION and doc["meta"] == {"kind": "test"}


def test_write_is_atomic_a_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    path = save_results(tmp_path / "results.json", [make("old")])
    before = path.read_text()

    def explode(*a, **k):  # a Ctrl-C with the new file half-made beside the old one
        raise KeyboardInterrupt

    monkeypatch.setattr(files.os, "fsync", explode)
    with pytest.raises(KeyboardInterrupt):
        save_results(path, [make("new")])
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


def test_other_schema_version_is_refused_with_a_clear_message(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"schema_version": 99, "results": []}))
    with pytest.raises(ValueError, match="schema version 99; this fastlab reads version 1"):
        load_results(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not a fastlab results file"):
        load_results(path)
    with pytest.raises(FileNotFoundError, match="no results file"):
        load_results(tmp_path / "missing.json")


def test_spread_and_noise():
    a = Spread.of([100, 105, 110])
    assert (a.median, a.low, a.high, a.n) == (105, 100, 110, 3)
    assert is_noise(a, Spread.of([104, 108, 112])) and not is_noise(a, Spread.of([150, 155, 160]))


def test_summary_marks_synthetic_failed_and_interrupted():
    assert "synthetic data" in make().summary()
    assert "FAILED (out of memory" in make(status="failed", error="out of memory at batch_size=4").summary()
    assert "INTERRUPTED after 3 steps" in make(status="interrupted", steps_done=3).summary()


def test_bundled_reference_loads():
    # empty until a GPU reference run is bundled; every file present must load
    for device, results in fastlab.load_reference().items():
        assert device and results and all(r.env.get("device_name") for r in results)


def test_reference_summary_says_when_nothing_is_bundled(monkeypatch, tmp_path):
    import fastlab.results as results

    monkeypatch.setattr(results, "REFERENCE_DIR", tmp_path)
    assert "No reference results" in fastlab.reference_summary("01_data_loading:num_workers")
    ref = make("workers=8")
    ref.comparison = "01_data_loading:num_workers"
    ref.env = {"device_name": "NVIDIA H200", "date": "2026-11-29"}
    save_results(tmp_path / "h200.json", [ref, make("other", comparison="02:x")])
    assert list(fastlab.reference_for("01_data_loading:num_workers")) == ["NVIDIA H200"]
    assert "measured on NVIDIA H200" in fastlab.reference_summary("01_data_loading:num_workers")


def test_reference_summary_of_several_comparisons_says_none_is_bundled_once(monkeypatch, tmp_path):
    import fastlab.results as results

    monkeypatch.setattr(results, "REFERENCE_DIR", tmp_path)
    text = fastlab.reference_summary("01:a", "01:b", "01:c")
    assert text.count("No reference results") == 1 and all(f"'01:{x}'" in text for x in "abc")


def test_no_notebook_prints_the_reference_notice_more_than_once():
    import re

    notebooks = Path(__file__).resolve().parents[1] / "notebooks"
    for path in sorted(notebooks.glob("*.ipynb")):
        code = ["".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
        calls = [src for src in code if "reference_summary(" in src]
        assert len(calls) <= 1 and calls == [src for src in calls if src.count("reference_summary(") == 1], path.name
        assert not any(re.search(r"^\s*for .*:\n\s+print\(fastlab\.reference_summary", src, re.M) for src in calls)


def test_saved_results_follow_the_umask_like_any_other_file(tmp_path):
    import os

    old = os.umask(0o022)
    try:
        path = save_results(tmp_path / "results.json", [make("a")])
        other = tmp_path / "other.txt"
        other.write_text("x")
        assert (path.stat().st_mode & 0o777) == (other.stat().st_mode & 0o777) == 0o644
        os.umask(0o077)
        assert (save_results(tmp_path / "private.json", [make("a")]).stat().st_mode & 0o777) == 0o600
    finally:
        os.umask(old)


def test_what_a_figure_reads_is_a_field_and_older_files_still_load():
    old = {"config": {}, "extras": {"repeats": 2, "repeat_windows": [[1.0], [2.0]], "window_seconds": [0.5, 0.6],
                                    "tta_curve": [[1.0, 5, 0.3]], "stopped_by": "max_seconds",
                                    "kept_loss_tensors": 7, "comparison": "x", "rung": "amp", "dropped": "slower",
                                    "trap": "no native bf16", "budget": "not started", "metric": "tta"}}
    r = RunResult.from_dict(old)
    assert (r.repeats, r.repeat_windows, r.window_seconds) == (2, [[1.0], [2.0]], [0.5, 0.6])
    assert (r.tta_curve, r.stopped_by, r.kept_loss_tensors) == ([[1.0, 5, 0.3]], "max_seconds", 7)
    assert (r.comparison, r.rung, r.dropped, r.trap, r.budget_cut) == ("x", "amp", "slower", "no native bf16",
                                                                       "not started") and r.not_started
    assert r.extras == {"metric": "tta"}  # what several modules do not read stays where it was
    assert RunResult.from_dict(json.loads(json.dumps(r.to_dict()))) == r


def test_time_to_accuracy_is_a_field_and_older_files_still_load():
    """extras["tta"] (a dict that held the checkpoint curve a second time) loads as RunResult.tta, the curve as
    tta_curve; a record round-trips through a results file."""
    old = {"config": {}, "extras": {"variant": "naive", "tta": {
        "target": 0.5, "reached": True, "curve": [[1.0, 5, 0.3], [2.0, 10, 0.6]], "best_accuracy": 0.6,
        "seconds": 2.0, "steps": 10, "images": 320, "why_not": None, "seeds_not_run": "seed 1 not run: a trap"}}}
    r = RunResult.from_dict(old)
    assert r.tta == TtaRecord(0.5, True, 2.0, 10, 0.6, None, "seed 1 not run: a trap")
    assert r.tta_curve == [[1.0, 5, 0.3], [2.0, 10, 0.6]] and r.extras == {"variant": "naive"}
    assert RunResult.from_dict(json.loads(json.dumps(r.to_dict()))) == r
    assert RunResult.from_dict(json.loads(json.dumps(make("a").to_dict()))).tta is None


def test_a_run_that_did_not_run_has_no_warm_up_or_timed_figure():
    """A figure only for what ran: a run never trained, or stopped in its warm-up, has no warm-up seconds; one that
    finished no timed window has no timed seconds. Each says why instead, in the words of its summary."""
    not_trained = make("on", windows=(), status="no_op", error="every change is a no-op here (cudnn_benchmark: CPU)")
    assert not_trained.warmup_words() == ("warm-up did not run (NOT TRAINED: every change is a no-op here "
                                          "(cudnn_benchmark: CPU))")
    assert not_trained.timed_words().startswith("no timed window (NOT TRAINED")
    stopped = make("slow", windows=(), status="time_limited", error="its budget: 10 s", steps_done=2)
    stopped.config["warmup_steps"] = 5
    assert stopped.warmup_words() == "warm-up did not finish (2 of its 5 steps ran; TIME LIMITED: its budget: 10 s)"
    stopped.steps_done, stopped.warmup_seconds = 6, 7.5
    assert stopped.warmup_words() == "warm-up 7.50 s for 5 steps"
    assert stopped.timed_words() == "no timed window (TIME LIMITED: its budget: 10 s)"
    for r in (not_trained, stopped):
        assert "0.00 s" not in r.warmup_words() + r.timed_words()
    ran = make("ok", windows=(100.0, 200.0), steps_done=65, timed_seconds=3.0, window_seconds=[2.0, 1.0],
               images_per_step=10)
    assert ran.timed_words() == "timed 3.00 s for 40 steps"  # (100 x 2 + 200 x 1) images / 10 a step
    assert ran.warmup_words() == f"warm-up 0.00 s for {ran.config['warmup_steps']} steps"  # measured, and 0
