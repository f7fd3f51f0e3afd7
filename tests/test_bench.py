import json
from pathlib import Path

import pytest

import fastlab
from fastlab.bench import RUNG_NAMES, ladder, markdown_table, run_ladder, select_rungs, write_report
from fastlab.results import save_results


def test_ladder_is_cumulative_and_selectable(smoke):
    rungs = ladder(smoke)
    assert [r.name for r in rungs] == RUNG_NAMES and RUNG_NAMES[0] == "naive" and RUNG_NAMES[-1] == "all_on"
    assert [r.name for r in select_rungs(rungs, only=["amp"])] == ["naive", "amp"]
    assert "amp" not in [r.name for r in select_rungs(rungs, skip=["amp"])]
    with pytest.raises(ValueError, match="unknown rung 'turbo'"):
        select_rungs(rungs, only=["turbo"])
    with pytest.raises(ValueError, match="both --only and --skip"):
        select_rungs(rungs, only=["amp"], skip=["amp"])
    with pytest.raises(ValueError, match="naive rung"):
        select_rungs(rungs, skip=["naive"])


def test_run_ladder_report_comes_from_the_results_file(tmp_path, quick):
    rungs = select_rungs(ladder(quick), only=["amp", "device_loader"])
    results = run_ladder(quick, rungs, progress=False)
    assert [r.rung for r in results] == ["naive", "amp", "device_loader"]
    # cumulative: the amp rung's change is carried up, unless it was a trap here and so dropped
    if results[1].dropped:
        assert results[2].config["amp"] == "off"
    else:
        assert results[2].config["amp"] == results[1].config["amp"] != "off"
    path = save_results(tmp_path / "results.json", results)
    png, md = write_report(path)
    assert png.read_bytes()[:4] == b"\x89PNG"
    table = md.read_text()
    assert all(r.label in table for r in results) and "SYNTHETIC data" in table
    # edit the file: the redrawn table follows the file, not any state in memory
    doc = json.loads(path.read_text())
    doc["results"][0]["window_throughput"] = [12345.0, 12345.0]
    path.write_text(json.dumps(doc))
    _, md = write_report(path)
    assert "12,345 (12,345-12,345)" in md.read_text()


def test_table_marks_noise_and_failures():
    base = fastlab.RunResult(config={}, label="naive", window_throughput=[100, 110, 120, 100, 110, 120],
                             repeat_windows=[[100, 110, 120], [100, 110, 120]])
    same = fastlab.RunResult(config={}, label="same", window_throughput=[105, 112, 118, 105, 112, 118],
                             repeat_windows=[[105, 112, 118], [105, 112, 118]])
    fail = fastlab.RunResult(config={}, label="big", status="failed", error="out of memory at batch_size=9")
    table = markdown_table([base, same, fail])
    assert "1.02x (noise)" in table and "out of memory at batch_size=9" in table


def test_a_single_pass_reads_one_run_each_not_noise():
    # gpu-check's one-pass ladder on an H200 printed "6.96x (noise)": one run a rung cannot tell drift from anything
    base = fastlab.RunResult(config={}, label="naive", window_throughput=[100, 101, 102], repeats=1)
    big = fastlab.RunResult(config={}, label="+batch 1024", window_throughput=[700, 701, 702], repeats=1)
    table = markdown_table([base, big])
    assert "6.94x (one run each)" in table and "(noise)" not in table.split("images/s =")[0]


def test_a_trap_rung_is_shown_then_dropped(quick):
    from fastlab.bench import drop_reason

    below = fastlab.RunResult(config={}, label="below", window_throughput=[100, 100])
    assert drop_reason(fastlab.RunResult(config={}, window_throughput=[80, 90]), below) is None
    assert "trap" in drop_reason(fastlab.RunResult(config={}, window_throughput=[30, 40]), below)
    noisy_below = fastlab.RunResult(config={}, label="below", window_throughput=[20, 100, 160])
    assert drop_reason(fastlab.RunResult(config={}, window_throughput=[30, 40]), noisy_below) is None
    limited = fastlab.RunResult(config={}, status="time_limited", error="stopped at its max_seconds=1 budget")
    assert "time_limited" in drop_reason(limited, below)
    assert drop_reason(limited, None) is None  # the naive rung is never dropped


def test_time_budget_stops_a_run_and_keeps_its_steps(quick):
    import isolation_probe  # a model that sleeps 0.3 s a training step, inside the run's own process

    r = fastlab.run(quick.replace(steps=40, windows=2, max_seconds=1.0), model=isolation_probe.slow_net,
                    progress=False)
    assert r.status == "time_limited" and 2 <= r.steps_done < 41
    assert "max_seconds=1 budget" in r.error and "TIME LIMITED" in r.summary()


def test_a_rung_of_no_ops_is_marked_as_drift_not_as_a_speed_up():
    from fastlab.results import RunResult

    def rung(label, speed, no_ops=None, **config):
        return RunResult(config={"num_workers": 0, "cudnn_benchmark": False, **config}, label=label,
                         window_throughput=[speed * 0.99, speed, speed * 1.01], no_ops=no_ops or {})

    naive = rung("naive", 50)
    cudnn = rung("+cudnn.benchmark", 75, {"cudnn_benchmark": "no cuDNN here"}, cudnn_benchmark=True)
    workers = rung("+workers", 80, {"cudnn_benchmark": "no cuDNN here"}, cudnn_benchmark=True, num_workers=2)
    table = markdown_table([naive, cudnn, workers])
    assert "1.50x (no-op: drift)" in table and "Every change of +cudnn.benchmark (1.50x) is a no-op here" in table
    assert "| +workers |" in table and table.count("no-op: drift") == 1  # num_workers applies: a real change


def test_the_readme_tables_are_what_report_prints_from_their_results_files():
    from fastlab.bench import report_markdown
    from fastlab.results import load_document

    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    files = sorted((root / "docs" / "results").glob("*/*/results.json"))
    assert files, "no results files under docs/results"
    for path in files:
        text = report_markdown(load_document(path))
        where = path.relative_to(root)
        assert text == (path.parent / "bench.md").read_text(), f"redraw with: python -m fastlab report {where}"
        assert text.rstrip("\n") in readme, f"README's table is not what `python -m fastlab report {where}` prints"


def test_the_tta_figure_keeps_a_last_rung_that_did_not_reach_the_target_inside_its_axes():
    from fastlab.plots import plot_tta_ladder
    from fastlab.results import RunResult, TtaRecord

    def rung(label: str, reached: bool) -> fastlab.TimeToAccuracy:
        tta = fastlab.TimeToAccuracy(label, 0.5)
        tta.runs.append(RunResult(config={}, label=label, tta=TtaRecord(
            0.5, reached, 10.0 if reached else None, 5 if reached else None, 0.6 if reached else 0.3,
            None if reached else "time budget spent")))
        return tta

    fig = plot_tta_ladder([rung("naive", True), rung("+compile", False)])
    ax = fig.axes[0]
    labels = [t for t in ax.texts if t.get_text() == "not reached"]
    assert len(labels) == 1 and ax.get_xlim()[0] < 0 < 1 < ax.get_xlim()[1]


def test_rung_descriptions_say_what_the_rung_does_on_this_device(smoke, monkeypatch):
    import torch

    from fastlab import bench

    cpu = {r.name: r.why for r in ladder(smoke.replace(device="cpu"))}
    assert "tensor cores want" not in cpu["channels_last"] and "asynchronously" not in cpu["workers"]
    assert "do nothing without a GPU" in cpu["workers"] and cpu["cudnn"].startswith("a no-op here")
    assert "no tensor cores" in cpu["amp"]
    monkeypatch.setattr(bench, "resolve_device", lambda name: torch.device("cuda"))
    monkeypatch.setattr(bench, "preferred_amp", lambda device: "bf16")
    gpu = {r.name: r.why for r in ladder(smoke)}
    assert "asynchronously" in gpu["workers"] and "tensor cores" in gpu["amp"] and "no-op" not in gpu["cudnn"]


def test_a_rung_stopped_before_its_first_window_is_judged_by_its_step_time():
    # bf16 autocast on a CPU without bf16 kernels: the harness's budget ran out before its first timed window,
    # but each step it took was timed: far slower a step than the rung below is a trap, and said with its figures
    from fastlab.bench import DROP_BELOW_RATIO, drop_reason
    from fastlab.results import RunResult

    below = RunResult(config={"warmup_steps": 1}, label="below", window_throughput=[100.0, 101.0],
                      step_seconds=[6.0, 4.0, 4.0, 4.0])

    def stopped(steps: list[float]) -> RunResult:
        return RunResult(config={"warmup_steps": 1}, label="+bf16", status="time_limited", stopped_by="max_seconds",
                         error="stopped at its max_seconds=60 budget", step_seconds=steps)

    trap = drop_reason(stopped([50.0, 47.0, 49.0]), below)
    assert trap.startswith(f"0.08x the rung below it by step time (under {DROP_BELOW_RATIO}x; 12.0x slower a step "
                           "(48.0 s vs 4.0 s a step, median)): a trap on this machine; the harness's time budget ran "
                           "out before its first timed window (stopped at its max_seconds=60 budget)"), trap
    mild = drop_reason(stopped([6.0, 5.0]), below)  # slower, but not past the trap ratio: not measured, no verdict
    assert mild.startswith("not measured: the harness's time budget ran out before its first timed window") and \
        mild.endswith("against the rung below, 1.25x slower a step (5.0 s vs 4.0 s a step, median)")
    nothing = drop_reason(stopped([]), below)  # no step finished: nothing known either way
    assert nothing.startswith("not measured:") and nothing.endswith("no step time recorded for '+bf16'")
    for said in (mild, nothing):
        assert "trap" not in said, said
