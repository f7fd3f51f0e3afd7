"""A notebook's time budget (fastlab.budget): split among its comparisons before each starts, cuts said in a line,
and no run started once it is spent. Constructed clocks and runs: the mechanism, never a speed."""

from __future__ import annotations

import threading

from notebook_timings import record_timing, timings_table

import fastlab
from fastlab import budget, comparisons, train
from fastlab.calibration import Calibration
from fastlab.config import comparison_repeats, config_for, demonstration_config
from fastlab.results import RunResult
from fastlab.tools import timings


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_comparison_that_fits_its_share_is_not_cut():
    f = budget.fit(1000.0, runs_per_repeat=2, repeats=3, steps=20, fewest_steps=10, warmup_steps=3, step_seconds=0.1)
    assert (f.steps, f.repeats, f.cuts, f.line) == (20, 3, (), None)


def test_steps_are_cut_first_then_repeats_and_each_cut_is_said():
    kw = dict(runs_per_repeat=2, repeats=3, steps=40, fewest_steps=10, warmup_steps=3, step_seconds=1.0)
    steps_only = budget.fit(2 * 3 * (3 + 25 + budget.RUN_OVERHEAD_SECONDS), **kw)
    assert (steps_only.steps, steps_only.repeats) == (25, 3)
    assert steps_only.estimate_seconds <= steps_only.share_seconds
    assert "25 timed steps a run instead of 40" in steps_only.line and "repeat" not in steps_only.line
    both = budget.fit(2 * 2 * (3 + 10 + budget.RUN_OVERHEAD_SECONDS), **kw)
    assert (both.steps, both.repeats) == (10, 2)
    assert "10 timed steps a run instead of 40" in both.line and "2 interleaved repeats instead of 3" in both.line
    single = budget.fit(30.0, **kw)
    assert single.repeats == 1 and "its verdict cannot tell" in single.line  # what the cut costs, said


def test_a_spent_budget_refuses_a_run_without_starting_it(quick, monkeypatch):
    clock = Clock()
    budget.start("01_data_loading", "cpu", 60.0, clock)
    clock.now += 61
    assert fastlab.run(quick.replace(steps=1, warmup_steps=0, windows=1), label="a cell's own", progress=False).steps_done
    with budget.within("01_data_loading:num_workers", None):  # a registered comparison's runs are held to it
        r = fastlab.run(quick, label="late", progress=False)
    assert r.status == "time_limited" and r.not_started and not r.step_seconds
    assert "budget of 60 s on profile cpu was spent" in r.error
    assert "no step finished" in r.summary() and " s over 0 steps" not in r.summary()  # no figure for what never ran
    panel: list[str | None] = []
    worker = threading.Thread(target=lambda: panel.append(budget.refusal("a panel's run")))
    worker.start()
    worker.join()
    assert panel == [None]  # a panel's Run button (another thread) is the reader's choice: never refused


def test_interleaved_arms_stop_at_the_budget_past_it_by_at_most_one_run(quick, monkeypatch, capsys):
    clock, started = Clock(), []
    budget.start("01_data_loading", "cpu", 12.0, clock)

    def five_seconds(training, cold=False):
        started.append((training.result.label, clock.now - 1000.0))
        clock.now += 5.0
        return RunResult(config=training.cfg.to_dict(), label=training.result.label, window_throughput=[1.0])

    monkeypatch.setattr(train.isolation, "execute", five_seconds)
    monkeypatch.setattr(train, "check_gpu_profile_here", lambda cfg, dev: None)
    with budget.within("01_data_loading:num_workers", None):
        out = fastlab.interleave([("A", quick), ("B", quick.replace(seed=1))], repeats=3, progress=False)
    assert [at for _, at in started] == [0.0, 5.0, 10.0]  # the fourth would have started at 15 s, past 12 s
    assert budget.active().elapsed() <= 12.0 + 5.0  # the budget, plus the longest single run
    a, b = out  # turns A B, B A, A B: the refused runs are left out of their arms, never worn as their status
    assert a.status == "ok" and a.repeats == 1 and a.extras["budget_cut_repeats"] == 2
    assert b.status == "ok" and b.repeats == 2 and b.extras["budget_cut_repeats"] == 1
    with budget.within("01_data_loading:pipeline", None):
        out = fastlab.interleave([("A", quick), ("B", quick.replace(seed=1))], repeats=1, progress=False)
    assert [r.status for r in out] == ["time_limited", "time_limited"]  # an arm with no run left: not started
    said = capsys.readouterr().out.splitlines()
    assert len(said) == 1 and said[0].startswith("budget: 'A' not started")  # the first refusal alone is said


def test_a_registered_comparison_gets_its_share_and_its_repeats_cut(monkeypatch, capsys):
    clock, seen = Clock(), {}
    base = config_for("cpu", device="cpu")

    @comparisons.comparison("99_test_notebook:first", arms=2)
    def first(cfg, progress=True):
        seen.update(steps=cfg.steps, repeats=comparison_repeats(cfg))
        return []

    @comparisons.comparison("99_test_notebook:second", arms=2)
    def second(cfg, progress=True):
        return []

    try:
        monkeypatch.setattr(comparisons, "sized", lambda cfg, arms: (cfg.replace(steps=40), {"step_seconds": 1.0}))
        budget.start("99_test_notebook", "cpu", 200.0, clock)
        first(base, progress=False)
        line = capsys.readouterr().out
        # 200 s less the quarter kept for the cells' own runs, for two
        assert line.startswith("99_test_notebook:first: budget: this comparison's share is 75 s")
        assert seen["steps"] < 40 and seen["repeats"] < comparison_repeats(base)
        assert comparison_repeats(base) == 2  # the cap holds only while that comparison runs
        assert budget.active().parts_done == {"99_test_notebook:first"}
        seen.clear()
        budget.stop()
        first(base, progress=False)  # no budget (smoke, custom): nothing cut, nothing said
        assert seen == {"steps": 40, "repeats": 2} and capsys.readouterr().out == ""
    finally:
        for name in ("99_test_notebook:first", "99_test_notebook:second"):
            comparisons.REGISTERED.pop(name, None)
            budget.PARTS[name.split(":")[0]].remove(name)


def test_the_first_line_estimates_this_machine_from_the_calibrations(tmp_path, monkeypatch):
    path = tmp_path / "timings.json"
    monkeypatch.setenv("FASTLAB_TIMINGS", str(path))
    record_timing(path, "01_data_loading", "cpu", 120.0, "ok", "CPU (x, AVX512, 2 cores usable), no GPU",
                          "2026-12-01T00:00", step_seconds=0.2)
    cal = Calibration(step_seconds=0.5, workload={}, fingerprint={}, steps_measured=4, measured_at="now")
    monkeypatch.setattr("fastlab.calibration.calibrate", lambda cfg, measure=None: cal)
    line = timings.begin_notebook("01_data_loading", "cpu")
    assert line.startswith("budget 4.0 min (runs are cut to fit, each cut said); estimated here now: 4.0 min (the time "
                           "measured elsewhere, scaled by this machine's calibrated step against that machine's); "
                           "01_data_loading took 2.0 min")  # 120 s x 0.5 / 0.2 = 5.0 min, held to the budget
    assert budget.active().notebook == "01_data_loading" and budget.active().seconds == 240.0
    record_timing(path, "01_data_loading", "cpu", 120.0, "ok", "CPU (x)", "2026-12-01T00:00")
    assert "not estimated here" in timings.begin_notebook("01_data_loading", "cpu")
    assert timings.begin_notebook("01_data_loading", "smoke").startswith("01_data_loading: not measured yet")
    assert budget.active() is None  # smoke's steps are fixed: no budget


# ---------------------------------------------------------------- parts held to the budget that are not comparisons

def test_a_held_part_takes_its_share_of_the_split():
    clock = Clock()
    name = budget.part("99_test_notebook:exercise")
    try:
        budget.start("99_test_notebook", "cpu", 120.0, clock)
        assert budget.parts_of("99_test_notebook") == [name]
        assert budget.share_of(name) == 90.0  # alone: the whole budget but the cells' own runs' quarter
        with budget.within("99_test_notebook:other", None):
            pass
        clock.now += 30.0
        assert budget.share_of(name) == 60.0  # what is left; a part that ran is not counted again
        assert budget.share_of("98_another:exercise") is None  # another notebook's part: no share here
    finally:
        budget.PARTS[name.split(":")[0]].remove(name)


def test_a_part_another_notebook_calls_takes_a_share_of_that_notebooks_budget_too():
    clock = Clock()
    borrowed = budget.part("98_another:comparison", notebook="99_test_notebook")
    own = budget.part("99_test_notebook:own")
    try:
        budget.start("99_test_notebook", "cpu", 120.0, clock)
        assert budget.parts_of("99_test_notebook") == [borrowed, own]
        assert budget.share_of(borrowed) == 45.0  # 90 s for the parts, split in two
        assert borrowed not in budget.parts_of("98_another")  # declared for 99 only: 98 declares its own
        budget.start("98_another", "cpu", 120.0, clock)
        assert budget.share_of(borrowed) is None
    finally:
        budget.PARTS.pop("98_another", None)
        budget.PARTS["99_test_notebook"].clear()


def test_a_run_outside_a_part_is_cut_to_a_short_run_once_the_budget_is_spent(monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(train.isolation, "execute", lambda training, cold=False: ran.append(training.cfg) or training.result)
    base = config_for("smoke").replace(steps=40, warmup_steps=5, max_seconds=45.0, eval_images=256)
    clock = Clock()
    budget.start("99_test_notebook", "cpu", 60.0, clock)
    first = train.run(base, label="before")
    assert ran[-1] == base and not first.budget_cut  # within the budget: the run as written
    clock.now += 61.0
    cut = train.run(base, label="after")
    line = capsys.readouterr().out
    assert ran[-1] == demonstration_config(base) and ran[-1].steps < base.steps and ran[-1].eval_images < 256
    assert line.startswith("budget: 'after' is cut to a short run: notebook 99_test_notebook's budget of 60 s")
    assert cut.budget_cut.startswith("cut to a short run") and "a short run: cut to" in cut.summary()
    train.run(base, label="again")
    assert ran[-1] == demonstration_config(base) and capsys.readouterr().out == ""  # said once
    with budget.within("99_test_notebook:part", None):  # a part's run is refused, never cut (its caller says so)
        assert budget.own_run_cut("in a part") is None
    other = threading.Thread(target=lambda: train.run(base, label="panel"))  # a panel's Run button: never cut
    other.start()
    other.join()
    assert ran[-1] == base


def test_every_exercise_is_a_part_of_its_own_notebook():
    from pathlib import Path

    from fastlab import exercise

    notebooks = {p.stem: p.read_text() for p in (Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb")}
    for technique, t in exercise.TECHNIQUES.items():
        assert f"{t.notebook}:exercise" in budget.parts_of(t.notebook)
        assert f'technique=\\"{technique}\\"' in notebooks[t.notebook], (technique, t.notebook)


def loop(calls: list[str], name: str):
    def run(w):
        calls.append(name)
        for _x in w(range(6)):
            with w.step(1):
                pass
    return run


def test_an_exercise_check_is_not_started_once_the_budget_is_spent(capsys):
    from fastlab import exercise

    calls: list[str] = []
    clock = Clock()
    budget.start("05_no_grad_detach_item", "cpu", 10.0, clock)
    clock.now += 11.0

    def mine(w):
        calls.append("mine")

    result = exercise.check(loop(calls, "given"), mine, technique="no_grad")
    out = capsys.readouterr().out.splitlines()
    assert calls == [] and result.outcome == "not run"
    assert out[0].startswith("budget: 'run (as given) #1' not started: notebook 05_no_grad_detach_item's budget")
    assert "did not run" in out[-1] and "images/s" in out[-1]
    assert budget.active().parts_done == {"05_no_grad_detach_item:exercise"}


def test_compare_loops_stops_its_turns_at_the_budget_past_it_by_at_most_one_run(capsys):
    from fastlab.watch import compare_loops

    clock, calls = Clock(), []
    budget.start("05_no_grad_detach_item", "cpu", 12.0, clock)

    def timed(name):
        def run(w):
            loop(calls, name)(w)
            clock.now += 5.0
        return run

    with budget.within("05_no_grad_detach_item:exercise", None):
        c = compare_loops(timed("before"), timed("after"), repeats=3, warmup_steps=1, window_steps=2)
    assert calls == ["before", "after", "after"]  # turns before/after, after/before: the fourth would start at 15 s
    assert c.outcome == "not run" and "before #2 did not run" in c.sentence
    assert budget.active().elapsed() <= 12.0 + 5.0
    assert sum(line.startswith("budget: ") for line in capsys.readouterr().out.splitlines()) == 1
    budget.stop()
    c = compare_loops(timed("before"), timed("after"), repeats=1, warmup_steps=1, window_steps=2)
    assert c.outcome != "not run"  # no budget: every turn runs


def test_the_ddp_demo_fits_its_runs_to_its_share(capsys):
    from fastlab.lessons import ddp

    cfg = config_for("cpu", device="cpu")
    assert ddp.fit_to_budget(cfg, runs=4, launches=2) == cfg  # no budget: the profile's max_seconds
    clock = Clock()
    budget.start("11_multi_gpu_ddp", "cpu", 240.0, clock)
    share = budget.share_of(ddp.NAME)
    assert share < 240.0  # the exercise is a part of the notebook too
    cut = ddp.fit_to_budget(cfg, runs=4, launches=2)
    expected = max(budget.FEWEST_RUN_SECONDS, (share - 2 * ddp.LAUNCH_OVERHEAD_SECONDS) / 4)
    assert cut.max_seconds == round(expected, 1) < cfg.max_seconds
    assert "so each stops after" in capsys.readouterr().out
    clock.now += 1000.0  # spent: the runs keep their floor, so the cell's figures still come
    assert ddp.fit_to_budget(cfg, runs=4, launches=2).max_seconds == budget.FEWEST_RUN_SECONDS


def test_the_timings_table_says_each_notebooks_budget_and_estimate_beside_its_time(tmp_path):
    path = tmp_path / "timings.json"
    record_timing(path, "05_no_grad_detach_item", "cpu", 300.0, "ok", "CPU (x, AVX2, 2 cores usable), no GPU",
                          "2026-12-06T00:00", load=6.1, step_seconds=0.3, budget_seconds=240.0, estimate=200.0)
    record_timing(path, "05_no_grad_detach_item", "smoke", 20.0, "ok", "CPU (x, AVX2, 2 cores usable), no GPU",
                          "2026-12-06T00:00")
    table = timings_table(path=path)
    assert "| 5.0 min (budget 4.0 min, estimated 3.3 min before it ran) |" in table
    assert "| 20 s |" in table  # fixed steps: no budget, no estimate


def test_the_worker_sweep_leaves_out_its_most_oversubscribed_counts_to_fit_its_share(monkeypatch, capsys):
    from fastlab.lessons import data_loading

    base = config_for("cpu", device="cpu")
    monkeypatch.setattr(data_loading, "calibrate", lambda cfg: Calibration(0.1, {}, {}, 4, "now"))
    assert data_loading.sweep_counts(base, 2) == data_loading.worker_counts(2)  # no budget: every count
    clock = Clock()
    budget.start("01_data_loading", "cpu", 4000.0, clock)
    assert data_loading.sweep_counts(base, 2, say=True) == data_loading.worker_counts(2)  # a share that fits them
    assert capsys.readouterr().out == ""
    assert len(budget.parts_of("01_data_loading")) == 4  # three comparisons and the exercise
    clock.now += 4000.0 - (1000.0 + 4 * 40.0)  # 40 s left for each part, beside the cells' own runs' quarter
    counts = data_loading.sweep_counts(base, 2, say=True)
    assert counts[:3] == [0, 1, 2] and len(counts) < len(data_loading.worker_counts(2))  # the cores always run
    repeats, fewest = comparison_repeats(base), max(base.windows, 10)
    per_run = budget.run_seconds(0.1, fewest, base.warmup_steps, -(-base.eval_images // base.batch_size))
    assert sum(repeats * (per_run + n * data_loading.WORKER_START_SECONDS) for n in counts) <= 40.0 or \
        counts == [0, 1, 2]
    line = capsys.readouterr().out
    assert line.startswith("01_data_loading:num_workers: budget: this comparison's share is 40 s, so num_workers=")
    clock.now += 1000.0
    assert data_loading.sweep_counts(base, 2) == [0, 1, 2]  # spent: the cores' counts (refused all the same)


def test_a_part_stops_at_its_own_share_leaving_the_rest_to_the_parts_after_it(quick, monkeypatch, capsys):
    clock, started = Clock(), []
    budget.start("01_data_loading", "cpu", 400.0, clock)

    def five_seconds(training, cold=False):
        started.append(training.result.label)
        clock.now += 5.0
        return RunResult(config=training.cfg.to_dict(), label=training.result.label, window_throughput=[1.0])

    monkeypatch.setattr(train.isolation, "execute", five_seconds)
    monkeypatch.setattr(train, "check_gpu_profile_here", lambda cfg, dev: None)
    with budget.within("01_data_loading:num_workers", None, share=12.0):
        fastlab.interleave([("A", quick), ("B", quick.replace(seed=1))], repeats=3, progress=False)
    assert started == ["A", "B", "B"]  # the fourth would have started 15 s into a 12 s share
    said = capsys.readouterr().out.splitlines()
    assert len(said) == 1 and "the share of notebook 01_data_loading's budget" in said[0]
    assert "this part's later runs are not started" in said[0] and not budget.active().spent()
    with budget.within("01_data_loading:pipeline", None, share=12.0):  # the next part has its own share
        fastlab.interleave([("C", quick), ("D", quick.replace(seed=1))], repeats=1, progress=False)
    assert started[3:] == ["C", "D"]


def test_first_steps_fits_each_run_to_what_is_left_of_its_share_from_the_runs_it_measured(monkeypatch, capsys):
    # notebook 10 at load 6: each MobileNet run took 45 s of training and 30 s around it, for an 88 s share
    from types import SimpleNamespace

    from fastlab.lessons import own_model

    clock, caps = Clock(), []

    def run_with_overhead(training, cold=False):
        caps.append(training.cfg.max_seconds)
        trained = min(training.cfg.max_seconds, 45.0)
        clock.now += 30.0 + trained
        return RunResult(config=training.cfg.to_dict(), label=training.result.label, window_throughput=[1.0],
                         step_seconds=[1.0], warmup_seconds=1.0, timed_seconds=trained - 1.0)

    monkeypatch.setattr(train.isolation, "execute", run_with_overhead)
    monkeypatch.setattr(train, "check_gpu_profile_here", lambda cfg, dev: None)
    monkeypatch.setattr(own_model, "time", SimpleNamespace(monotonic=clock))
    monkeypatch.setattr(own_model, "candidates",
                        lambda base, ds, mb: ({"A": dict(seed=1), "B": dict(seed=2), "C": dict(seed=3)}, {}, None))
    cfg = config_for("cpu", device="cpu")
    data = (own_model.StripesDataset(8, "train", 0), own_model.StripesDataset(8, "held_out", 0))
    first = own_model.first_steps(cfg, model=own_model.demo_model, dataset=data, progress=False)
    assert len(first) == 4 and caps == [45.0] * 4  # no budget: the profile's max_seconds, every run
    budget.start("10_your_own_model", "cpu", 240.0, clock)
    share, caps[:] = budget.share_of(own_model.NAME), []
    started = clock.now
    results = own_model.first_steps(cfg, model=own_model.demo_model, dataset=data, progress=False)
    ran = [c for c, r in zip(caps, results) if r.step_seconds]
    assert ran[0] < 45.0 and all(later <= ran[0] for later in ran[1:])  # the later ones know the 30 s around a run
    assert clock.now - started <= share + 30.0 + budget.FEWEST_RUN_SECONDS  # past it by at most its shortest run
    said = capsys.readouterr().out
    assert said.count("so each stops after") == 1 and "max_seconds; the profile's: 45 s" in said


def test_first_steps_starts_no_technique_when_its_fitted_baseline_timed_no_window(monkeypatch, capsys):
    # at load 6 the baseline's fitted run ended before a timed window: each technique would have had nothing to be
    # compared with, so none starts
    from types import SimpleNamespace

    from fastlab.lessons import own_model

    clock, started = Clock(), []

    def no_window_when_cut(training, cold=False):
        started.append(training.result.label)
        clock.now += 30.0 + training.cfg.max_seconds
        windows = [1.0] if training.cfg.max_seconds >= 45.0 else []
        return RunResult(config=training.cfg.to_dict(), label=training.result.label, window_throughput=windows,
                         step_seconds=[5.0], warmup_seconds=5.0, timed_seconds=0.0, status="time_limited")

    monkeypatch.setattr(train.isolation, "execute", no_window_when_cut)
    monkeypatch.setattr(train, "check_gpu_profile_here", lambda cfg, dev: None)
    monkeypatch.setattr(own_model, "time", SimpleNamespace(monotonic=clock))
    monkeypatch.setattr(own_model, "candidates",
                        lambda base, ds, mb: ({"A": dict(seed=1), "B": dict(seed=2)}, {}, None))
    cfg = config_for("cpu", device="cpu")
    data = (own_model.StripesDataset(8, "train", 0), own_model.StripesDataset(8, "held_out", 0))
    assert len(own_model.first_steps(cfg, model=own_model.demo_model, dataset=data, progress=False)) == 3  # no cut
    budget.start("10_your_own_model", "cpu", 240.0, clock)
    started.clear()
    results = own_model.first_steps(cfg, model=own_model.demo_model, dataset=data, progress=False)
    assert started == ["your model as is"] and len(results) == 1
    assert "the 2 techniques are not started: they would have nothing to be compared with" in capsys.readouterr().out
    assert own_model.advice(results)[0].startswith("The baseline did not finish a timed window")
