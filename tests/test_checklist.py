"""The checklist table (fastlab.checklist) and notebook 09's ladder logic (fastlab.lessons.all_together)."""

import json
from pathlib import Path

import pytest

import fastlab
from fastlab.bench import ladder, rungs_for, select_rungs, skipped_rungs
from fastlab.checklist import TECHNIQUES, build_checklist, checklist_markdown
from fastlab.environment_report import techniques_here
from fastlab.lessons import all_together as at
from fastlab.outcomes import built_on
from fastlab.results import TtaRecord

APPLIES_ALL = [(t.name, True, "here") for t in TECHNIQUES]


def rung(name, speeds, dropped=None, no_ops=None, **config):
    r = fastlab.RunResult(config={"amp": "off", **config}, label=name, window_throughput=list(speeds),
                          no_ops=dict(no_ops or {}), dataset={"name": "synthetic", "synthetic": True},
                          env={"device_name": "CPU (test)"}, peak_memory_mb=100.0)
    r.rung = name
    if dropped:
        r.dropped = dropped
    return r


def ladder_results():
    return [
        rung("naive", [100, 100, 100]),
        rung("workers", [200, 200, 200], no_ops={"pin_memory": "no GPU", "non_blocking": "no GPU"}),
        rung("amp", [50, 50, 50], dropped="0.25x the rung below it", amp="bf16"),
        rung("channels_last", [300, 300, 300], amp="off"),
    ]


def rows_by_name(rows):
    return {row.technique: row for row in rows}


def test_each_effect_is_measured_against_the_last_kept_rung():
    results = ladder_results()
    assert built_on(results, 3) is results[1]  # the dropped amp rung is not built on
    rows = rows_by_name(build_checklist(results, APPLIES_ALL, skipped={"all_on": "skipped under smoke"}))
    assert rows["channels_last"].here == "1.50x"  # 300 / 200, not 300 / 50
    assert rows["DataLoader workers"].here == "2.00x (one step with pin_memory + non_blocking)"
    assert rows["pin_memory + non_blocking"].here == "no-op here: no GPU"
    assert rows["bf16 autocast"].here.startswith("0.25x: a trap here, dropped")
    assert rows["fp16 autocast + GradScaler"].here == "not on this ladder (its amp rung used amp=bf16)"
    assert rows["torch.compile"].here == "not measured: skipped under smoke"
    assert rows["cudnn.benchmark"].here == "not measured (its rung was not run)"


def test_noise_and_failure_are_named():
    results = [rung("naive", [100, 110, 120]), rung("channels_last", [105, 112, 118])]
    failed = rung("cudnn", [])
    failed.status, failed.error = "failed", "out of memory at batch_size=9"
    rows = rows_by_name(build_checklist(results + [failed], APPLIES_ALL))
    assert rows["channels_last"].here == "1.02x (noise)"
    assert rows["cudnn.benchmark"].here == "failed: out of memory at batch_size=9"


def test_applies_column_and_reference_columns():
    here = [("cudnn.benchmark", False, "cuDNN is not used on cpu")]
    reference = {"NVIDIA H200": [rung("naive", [1000] * 3), rung("workers", [3000] * 3),
                                 rung("channels_last", [4500] * 3)]}
    rows = rows_by_name(build_checklist(ladder_results(), here, reference=reference))
    assert rows["cudnn.benchmark"].applies == "no: cuDNN is not used on cpu"
    assert rows["larger batch"].applies.startswith("yes")
    assert rows["channels_last"].reference == {"NVIDIA H200": "1.50x"}
    assert rows["DataLoader workers"].reference["NVIDIA H200"].startswith("3.00x")
    table = checklist_markdown(list(rows.values()), ladder_results())
    assert "| effect on NVIDIA H200 |" in table and "none bundled yet" not in table
    assert "SYNTHETIC data" in table and "CPU (test)" in table


def test_markdown_without_reference_has_one_row_per_technique():
    rows = build_checklist(ladder_results(), APPLIES_ALL)
    rows[0] = rows[0].__class__(rows[0].technique, "yes: a | b", rows[0].here, {})
    table = checklist_markdown(rows, ladder_results())
    body = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(body) == len(TECHNIQUES)
    assert all(line.endswith("| none bundled yet |") for line in body)
    assert "yes: a \\| b" in table  # a pipe inside a cell cannot break the table
    with pytest.raises(ValueError, match="results is empty"):
        build_checklist([], APPLIES_ALL)


def test_every_checklist_technique_is_known_to_the_environment_report():
    names = {name for name, _, _ in techniques_here()}
    missing = [t.name for t in TECHNIQUES if t.name not in names and t.name != "larger batch"]
    assert missing == []
    rung_names = set(fastlab.bench.RUNG_NAMES)
    assert {t.rung for t in TECHNIQUES if t.rung} <= rung_names
    assert all(t.elsewhere for t in TECHNIQUES if not t.rung)  # a technique off the ladder says where it is measured


def test_tf32_is_not_a_rung_and_points_at_notebook_03():
    tf32 = next(t for t in TECHNIQUES if t.name == "TF32")
    assert tf32.rung == ""
    rows = rows_by_name(build_checklist(ladder_results(), APPLIES_ALL))
    assert rows["TF32"].here.startswith("not a ladder rung") and "notebook 03" in rows["TF32"].here
    from fastlab.lessons import kernels

    assert kernels.compare_tf32.name == "03_cudnn_benchmark_and_channels_last:tf32"  # the comparison the row names
    top = [r for r in fastlab.bench.ladder(fastlab.config_for("smoke")) if r.name == "all_on"][0]
    assert set(top.changes) == {"compile"}  # the all_on rung adds torch.compile only


def test_a_diverged_rung_says_so():
    results = ladder_results()
    results.append(rung("fused_adamw", [400, 400, 400], dropped="diverged: the training loss became nan"))
    results[-1].status, results[-1].diverged_step = "diverged", 7
    results[-1].error = "the training loss became nan at step 7"
    row = rows_by_name(build_checklist(results, APPLIES_ALL))["fused / foreach optimisers"]
    assert row.here.startswith("DIVERGED at step 7 (the training loss became nan at step 7): 1.33x images/s, "
                               "not credited")
    assert "a trap here, dropped" in row.here
    stopped = rung("device_loader", [])
    stopped.status, stopped.error = "diverged", "the training loss became inf at step 1"
    row = rows_by_name(build_checklist(results + [stopped], APPLIES_ALL))["device-resident loader"]
    assert row.here == "diverged: the training loss became inf at step 1"


def _tta_group(name, seconds, status="ok", dropped=None, target=0.5, **config):
    runs = []
    for s in seconds:
        r = rung(name, [100.0], **config)
        r.status = status
        reached = s is not None and status == "ok"
        r.tta = TtaRecord(target, reached, s if reached else None, 10 if reached else None, 0.6,
                          None if reached else "diverged")
        if dropped:
            r.dropped = dropped
        runs.append(r)
    return fastlab.TimeToAccuracy(name, target, runs)


def test_outcome_column_from_time_to_accuracy():
    tta = [_tta_group("naive", [10.0, 11.0, 12.0]), _tta_group("workers", [5.0, 5.5, 6.0]),
           _tta_group("amp", [None] * 3, status="diverged", dropped="diverged", amp="bf16"),
           _tta_group("channels_last", [10.5, 11.5, 11.0])]
    rows = rows_by_name(build_checklist(ladder_results(), APPLIES_ALL, tta=tta,
                                        tta_skipped={"cudnn": "not measured under smoke"}))
    assert rows["DataLoader workers"].outcome == "2.00x (3 of 3 seeds reached 50%; against naive)"
    assert rows["bf16 autocast"].outcome == "DIVERGED in 3 of 3 seeds: no time to accuracy"
    # the dropped rung is not built on: channels_last is measured against workers
    assert rows["channels_last"].outcome == "0.50x (3 of 3 seeds reached 50%; against workers)"
    assert rows["cudnn.benchmark"].outcome == "not measured: not measured under smoke"
    assert rows["TF32"].outcome == "not a ladder rung"
    table = checklist_markdown(list(rows.values()), ladder_results())
    assert "| effect here on time to accuracy (over seeds) |" in table
    notebook = json.loads((Path(__file__).parents[1] / "notebooks" / "09_all_together.ipynb").read_text())
    assert "faster per image can be slower" in "".join("".join(c["source"]) for c in notebook["cells"])  # its reading
    plain = checklist_markdown(build_checklist(ladder_results(), APPLIES_ALL), ladder_results())
    assert "time to accuracy" not in plain


# ---------------------------------------------------------------- notebook 09's ladder logic


def test_smoke_skips_only_the_compile_rung(smoke):
    assert [r.name for r in rungs_for(smoke)][-1] == "large_batch"
    assert "smoke" in skipped_rungs(smoke)["all_on"]
    cpu = fastlab.config_for("cpu", device="cpu")
    assert skipped_rungs(cpu) == {} and rungs_for(cpu)[-1].name == "all_on"


def test_top_of_the_ladder_skips_dropped_rungs_and_summary_is_computed():
    results = ladder_results()
    results.append(rung("device_loader", [], dropped="failed: out of memory"))
    assert at.top_index(results) == 3
    assert at.total_speedup(results) == pytest.approx(3.0)
    # notebook 09's summary: each rung against the rung it was built on (a dropped one is not), the top against naive
    assert built_on(results, 3) is results[1]
    assert str(fastlab.verdict(results[1].throughput, results[3].throughput)).startswith("1.50x (faster)")
    assert str(fastlab.verdict(results[0].throughput, results[3].throughput)).startswith("3.00x (faster)")
    with pytest.raises(ValueError, match="no rung"):
        at.top_index([rung("naive", [])])


def test_a_reference_ladder_is_read_like_this_machines():
    ref = [rung("naive", [1000] * 3, model="resnet18"), rung("channels_last", [12000] * 3, model="resnet18"),
           rung("amp", [500] * 3, dropped="a trap", model="resnet18")]
    assert at.top_index(ref) == 1 and at.total_speedup(ref) == pytest.approx(12.0)


def test_a_dropped_rung_is_retested_on_top(quick):
    rungs = select_rungs(ladder(quick), only=["channels_last"])
    naive = fastlab.run(quick.replace(**rungs[0].changes), label="naive", progress=False)
    naive.rung = "naive"
    cl = rung("channels_last", [1.0], dropped="a trap", channels_last=True)
    retests = at.retest_dropped([naive, cl], rungs, progress=False)
    assert len(retests) == 1
    title, (top, changed) = retests[0]
    assert title == "+channels_last" and top.config["channels_last"] is False and changed.config["channels_last"]
    assert fastlab.runs_verdict(top, changed).comparable  # both fresh runs finished: the notebook prints it
    assert top.repeats == changed.repeats == fastlab.config.comparison_repeats(quick)  # interleaved, not one pair
    with pytest.raises(ValueError, match="limit=-1"):
        at.retest_dropped([naive], rungs, limit=-1)


def test_a_dropped_change_that_cannot_apply_on_top_is_not_retested(quick):
    rungs = ladder(quick)
    workers = next(r for r in rungs if r.name == "workers")
    dropped = rung("workers", [1.0], dropped="noise", **quick.replace(**workers.changes).to_dict())
    on_device = rung("device_loader", [2.0], **quick.replace(loader="device").to_dict())  # no workers there
    assert at.retest_dropped([dropped, on_device], rungs, progress=False) == []


def test_both_notebook_comparisons_are_named_for_their_reference_results():
    from fastlab.lessons import own_model

    assert at.run_all_together.name == at.NAME == "09_all_together:ladder"
    base = fastlab.config_for("cpu")
    assert at.run_all_together.arms(base) == len(rungs_for(base))  # sized by time as one comparison of its rungs
    assert own_model.first_steps_demo.name == own_model.NAME == "10_your_own_model:first_steps"


def test_reference_ladders_fall_back_to_a_bundled_bench_ladder(monkeypatch):
    bench = [rung("naive", [1000] * 3), rung("workers", [2000] * 3)]
    other = fastlab.RunResult(config={}, label="not a rung")
    monkeypatch.setattr(at, "reference_for", lambda name: {})
    monkeypatch.setattr(at, "load_reference", lambda: {"NVIDIA H200": [other, *bench], "A100": [bench[1]]})
    assert at.reference_ladders() == {"NVIDIA H200": bench}  # a set not starting at naive is no ladder
    resnet, compact = ([rung("naive", [1000] * 3), rung("workers", [2000] * 3)] for _ in range(2))
    for r in compact:
        r.config["model"] = "compact"
    resnet[0].config["model"] = "resnet18"
    monkeypatch.setattr(at, "load_reference", lambda: {"NVIDIA H200": resnet + compact})
    # the bundled H200 file holds two ladders: each is its own, not one ladder climbing from ResNet-18 to the net
    assert at.reference_ladders() == {"NVIDIA H200, resnet18": resnet, "NVIDIA H200, compact": compact}
    tagged = {"L4": [rung("naive", [10] * 3)]}
    monkeypatch.setattr(at, "reference_for", lambda name: tagged if name == at.NAME else {})
    assert at.reference_ladders() is tagged
