"""Issue 12: divergence is a status, accuracy comes with its spread, time-to-accuracy."""

from __future__ import annotations

import dataclasses
import math
import time

import pytest
import torch
from torch import nn

import fastlab
from fastlab import bench, outcomes, plots
from fastlab.config import config_for
from fastlab.measure import Spread
from fastlab.results import RunResult, TtaRecord


@pytest.fixture
def quick():
    return config_for("smoke", steps=8, warmup_steps=1, windows=2, train_images=256, eval_images=64, log_every=1)


class TurnsNaN(nn.Module):
    """A small net whose output becomes NaN from its `at`-th training forward on (1-based)."""

    def __init__(self, at: int = 4) -> None:
        super().__init__()
        self.fc = nn.Linear(3 * 32 * 32, 10)
        self.calls, self.at = 0, at

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.fc(x.flatten(1))
        if self.training:
            self.calls += 1
            if self.calls >= self.at:
                return out * float("nan")
        return out


def test_a_nan_output_ends_the_run_as_diverged_with_its_step(quick):
    r = fastlab.run(quick, model=lambda: TurnsNaN(at=4), progress=False)
    assert r.status == "diverged"
    assert r.diverged_step == 3  # 0-based: the 4th step
    assert r.last_finite_loss is not None and math.isfinite(r.last_finite_loss)
    assert "nan" in r.error and not r.ok
    assert r.steps_done == 4  # the diverged step ran; its loss, read at its end, stops the run before the next
    assert "DIVERGED" in r.summary()


def test_divergence_is_found_at_the_next_loss_read_without_extra_syncs(quick):
    r = fastlab.run(quick.replace(log_every=3), model=lambda: TurnsNaN(at=2), progress=False)
    assert r.status == "diverged" and r.diverged_step == 2  # the first read (step index 2) after step index 1


def test_divergence_of_losses_kept_as_tensors_is_found_at_the_end(quick):
    r = fastlab.run(quick.replace(log_loss="tensor"), model=lambda: TurnsNaN(at=5), progress=False)
    assert r.status == "diverged" and r.diverged_step == 4


def test_non_finite_parameters_are_caught_at_the_end(quick):
    class PoisonsItsWeights(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3 * 32 * 32, 10)

        def forward(self, x):
            if self.training:
                self.fc.bias.data[0] = float("inf")
            return self.fc(x.flatten(1))

    # the loss read every 100 steps never happens inside this short run: only the check at the end sees it
    r = fastlab.run(quick.replace(log_every=100), model=PoisonsItsWeights, progress=False)
    assert r.status == "diverged" and r.diverged_step == quick.warmup_steps + quick.steps - 1
    assert [s for s, _ in r.losses] == [quick.warmup_steps + quick.steps - 1]  # the last step's, read at the end


def test_a_healthy_run_is_ok_and_keeps_its_last_finite_loss(quick):
    r = fastlab.run(quick, progress=False)
    assert r.status == "ok" and r.ok and r.diverged_step is None
    assert r.last_finite_loss == pytest.approx(r.losses[-1][1])


def _result(status: str, speed: float, accuracy: float = 0.5) -> RunResult:
    r = RunResult(config={"warmup_steps": 0}, label=status, status=status, window_throughput=[speed] * 3,
                  eval_accuracy=accuracy, dataset={"synthetic": True}, env={"device_name": "CPU"})
    if status == "diverged":
        r.error, r.diverged_step = "the training loss became nan at step 3", 3
    return r


def test_the_ladder_drops_a_diverged_rung_and_the_table_marks_it():
    naive, fast_nan = _result("ok", 100), _result("diverged", 800, 0.1)
    assert bench.drop_reason(fast_nan, naive).startswith("diverged")
    fast_nan.dropped = bench.drop_reason(fast_nan, naive)
    table = bench.markdown_table([naive, fast_nan])
    assert "diverged: speed not credited" in table
    assert "one run" in table  # the accuracy column says it rests on one run


def test_outcome_verdicts_use_the_spread_over_seeds():
    a = [_result("ok", 100, acc) for acc in (0.80, 0.84, 0.86)]
    b = [_result("ok", 100, acc) for acc in (0.82, 0.85, 0.88)]
    c = [_result("ok", 100, acc) for acc in (0.95, 0.96, 0.97)]
    assert fastlab.outcome_verdict(a, b).endswith("the same within seed noise")
    assert fastlab.outcome_verdict(a, c).endswith("higher, outside the seeds' spread")
    assert fastlab.outcome_verdict(c, a).endswith("lower, outside the seeds' spread")
    assert fastlab.outcome_verdict([], c) == "accuracy not measured"
    assert "single runs" in fastlab.outcome_verdict(a[:1], c[:1])
    assert "diverged" in fastlab.outcome_verdict(a, [_result("diverged", 500, 0.1)])
    assert fastlab.accuracy_spread(a) == Spread(0.84, 0.80, 0.86, 3)
    assert "one run" in fastlab.describe_accuracy(a[:1])


def test_run_seeds_runs_each_seed(quick):
    runs = fastlab.run_seeds(quick.replace(steps=2, windows=1), seeds=(3, 4), label="x", progress=False)
    assert [r.config["seed"] for r in runs] == [3, 4]
    assert all(r.extras["variant"] == "x" for r in runs)


def test_time_to_accuracy_reaches_an_easy_target_and_keeps_evaluation_apart(quick):
    tta = fastlab.time_to_accuracy(quick, target=0.0, seeds=(0, 1), eval_every=2, progress=False)
    assert tta.reached == 2
    for r in tta.runs:
        rec = r.tta
        assert rec.reached and rec.steps == 2 and rec.target == 0.0
        assert rec.seconds > 0 and r.tta_curve[0][1] == 2
        assert r.steps_done == 2  # stopped at the checkpoint that reached it
    assert tta.seconds.n == 2 and "reached in 2 of 2 seeds" in tta.summary()


def test_time_to_accuracy_says_not_reached_with_the_best_accuracy(quick):
    tta = fastlab.time_to_accuracy(quick, target=1.01, seeds=(0,), eval_every=3, max_steps=7, progress=False)
    assert tta.reached == 0
    rec, curve = tta.runs[0].tta, tta.runs[0].tta_curve
    assert not rec.reached and rec.why_not == "step budget spent" and rec.seconds is rec.steps is None
    assert [c[1] for c in curve] == [3, 6] and rec.best_accuracy == max(c[2] for c in curve)
    assert "not reached" in tta.summary() and "best accuracy" in tta.summary()


def test_time_to_accuracy_of_a_diverging_run_is_not_reached(quick):
    tta = fastlab.time_to_accuracy(quick, target=0.99, seeds=(0,), eval_every=2, model=lambda: TurnsNaN(at=3),
                                   progress=False)
    assert tta.reached == 0 and tta.runs[0].tta.why_not == "diverged"
    assert bench.tta_drop_reason(tta).startswith("diverged")


def test_each_profile_names_its_targets():
    for profile in ("smoke", "cpu", "gpu"):
        cfg = config_for(profile, device="cpu")
        assert 0 < fastlab.config.target_accuracy(cfg, True) < 1
        assert 0 < fastlab.config.target_accuracy(cfg, False) < 1


def test_tta_bench_writes_a_table_and_figure(tmp_path, monkeypatch):
    from fastlab.profiles import PROFILES

    monkeypatch.setitem(PROFILES, "smoke", dataclasses.replace(
        PROFILES["smoke"], time_to_accuracy=dict(synthetic=0.0, cifar10=0.0, eval_every=2, max_steps=4)))
    out = bench.bench(tmp_path / "b", profile="smoke", only=["naive", "channels_last"], progress=False,
                      metric="time-to-accuracy", seeds=2)
    table = (out / "bench.md").read_text()
    assert "time-to-accuracy ladder" in table and "2/2" in table and "SYNTHETIC" in table
    assert (out / "bench.png").stat().st_size > 0


def test_tta_ladder_does_not_train_a_rung_that_is_a_no_op_here(monkeypatch):
    from fastlab.profiles import PROFILES

    monkeypatch.setitem(PROFILES, "smoke", dataclasses.replace(
        PROFILES["smoke"], time_to_accuracy=dict(synthetic=0.0, cifar10=0.0, eval_every=2, max_steps=4)))
    base = config_for("smoke", device="cpu")
    rungs = bench.select_rungs(bench.ladder(base), only=["cudnn"])
    not_run: dict[str, str] = {}
    ttas = bench.run_tta_ladder(base, rungs, seeds=(0,), progress=False, not_run=not_run)
    assert [t.label for t in ttas] == ["naive"]
    assert "cudnn.benchmark" in " ".join(not_run) and "cuDNN" in " ".join(not_run.values())
    assert "Not run here" in bench.tta_markdown_table(ttas, not_run)


def test_a_reached_run_keeps_the_checkpoint_as_its_accuracy_and_has_windows(quick, monkeypatch):
    """The checkpoint that reached the target is the run's held-out accuracy (no second pass over the held-out
    set), and windows are about eval_every steps long, so images/s exists for a run that stops early."""

    from fastlab import training

    calls = []
    real = training.evaluate

    def counting(*args):
        calls.append(1)
        return real(*args)

    monkeypatch.setenv("FASTLAB_ISOLATION", "thread")  # the counting mock lives in this process
    monkeypatch.setattr(training, "evaluate", counting)
    tta = fastlab.time_to_accuracy(quick.replace(warmup_steps=1), target=0.0, seeds=(0,), eval_every=3,
                                   max_steps=30, progress=False)
    r = tta.runs[0]
    assert len(calls) == 1 and r.eval_accuracy == r.tta_curve[0][2]
    assert r.config["windows"] == (30 - 1) // 3  # windows about eval_every steps long
    long = fastlab.time_to_accuracy(quick.replace(warmup_steps=1), target=1.01, seeds=(0,), eval_every=3,
                                    max_steps=10, progress=False).runs[0]
    assert len(long.window_throughput) == (10 - 1) // 3 == len(long.tta_curve)


def test_the_cpu_profile_evaluates_time_to_accuracy_on_fewer_images(monkeypatch):
    from fastlab import outcomes

    seen = {}

    def fake_run(training, comparison=None, cold_compile_caches=False):
        seen["eval_images"] = training.cfg.eval_images
        return RunResult(config=training.cfg.to_dict(), label=training.result.label, status="ok")

    monkeypatch.setattr(outcomes, "_run", fake_run)
    monkeypatch.setattr(outcomes, "load_data", lambda cfg, dataset: (None, {"synthetic": True}))
    cfg = config_for("cpu", device="cpu", dataset="synthetic")
    fastlab.time_to_accuracy(cfg, seeds=(0,), progress=False)
    assert seen["eval_images"] == fastlab.profiles.PROFILES["cpu"].time_to_accuracy["eval_images"] < cfg.eval_images


def test_a_rung_whose_first_seed_is_a_trap_runs_no_more_seeds(quick):
    from fastlab.outcomes import TrapLimits

    tta = fastlab.time_to_accuracy(quick, target=0.99, seeds=(0, 1, 2), eval_every=2, model=lambda: TurnsNaN(at=3),
                                   progress=False, limits=TrapLimits())
    assert len(tta.runs) == 1 and tta.seeds_not_run.startswith("seeds 1, 2 not run: seed 0 diverged")
    assert tta.runs[0].tta.seeds_not_run == tta.seeds_not_run
    assert "not run" in tta.summary()
    regrouped = outcomes.tta_groups(tta.runs)  # read back from a results file, the note stays
    assert regrouped[0].seeds_not_run == tta.seeds_not_run
    assert "Seeds not run:" in bench.tta_markdown_table(regrouped)
    # without limits (naive), every seed runs
    every = fastlab.time_to_accuracy(quick, target=0.99, seeds=(0, 1), eval_every=2, model=lambda: TurnsNaN(at=3),
                                     progress=False)
    assert len(every.runs) == 2 and every.seeds_not_run == ""


class _Sleepy(nn.Module):
    """10 ms a training batch (preflight's two images pass at once): windows that end before a small budget."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3 * 32 * 32, 10)

    def forward(self, x):
        if x.shape[0] > 2 and self.training:
            time.sleep(0.01)
        return self.fc(x.flatten(1))


def test_a_seed_stopped_by_its_budget_ends_the_rung_only_when_it_stepped_slowly(monkeypatch, quick):
    from fastlab.outcomes import TrapLimits

    monkeypatch.setenv("FASTLAB_ISOLATION", "thread")  # no fresh process's first-op costs inside a small budget
    timed = quick.replace(warmup_steps=0)
    slow = fastlab.time_to_accuracy(timed, target=1.01, seeds=(0, 1), eval_every=2, max_steps=400, progress=False,
                                    model=_Sleepy, limits=TrapLimits(max_training_seconds=0.6,
                                                                     max_seconds_per_image=1e-9))
    r = slow.runs[0]
    assert r.status == "time_limited" and r.window_throughput and "without reaching the target" in r.error
    assert r.tta.why_not == "time budget spent" and r.eval_accuracy is None  # no pass on a trap
    assert len(slow.runs) == 1 and "ms an image" in slow.seeds_not_run and "a speed trap" in slow.seeds_not_run
    # stopped by the budget but stepping at an ordinary speed: slow to learn, not a trap; the other seeds run
    learner = fastlab.time_to_accuracy(timed, target=1.01, seeds=(0, 1), eval_every=2, max_steps=400,
                                       progress=False, model=_Sleepy,
                                       limits=TrapLimits(max_training_seconds=0.6, max_seconds_per_image=1e6))
    assert len(learner.runs) == 2 and learner.seeds_not_run == ""
    # stopped before its first evaluation: said so
    first = fastlab.time_to_accuracy(timed, target=1.01, seeds=(0,), eval_every=2, progress=False,
                                     limits=TrapLimits(max_training_seconds=1e-6, max_seconds_per_image=1e6))
    assert "stopped before its first evaluation" in first.summary()


def test_a_seed_that_spends_its_budget_in_warm_up_ends_the_rung(quick):
    # warm-up (compilation, first allocations) costs every seed the same from fresh caches: no seed would do better
    from fastlab.outcomes import TrapLimits

    tta = fastlab.time_to_accuracy(quick, target=1.01, seeds=(0, 1, 2), eval_every=2, progress=False,
                                   limits=TrapLimits(max_training_seconds=1e-6, max_seconds_per_image=1e6))
    assert tta.runs[0].steps_done == quick.warmup_steps == 1
    assert len(tta.runs) == 1 and "in 1 warm-up step" in tta.seeds_not_run


def test_the_speed_trap_is_per_image_so_a_larger_batch_is_not_one():
    from fastlab.outcomes import TrapLimits

    def stopped(batch: int, step: float) -> RunResult:  # synchronised windows of `step` seconds a step
        return RunResult(config={"warmup_steps": 1}, label="x", status="time_limited", images_per_step=batch,
                         step_seconds=[9.0, step, step], steps_done=3, window_throughput=[batch / step],
                         tta=TtaRecord(0.5, False, why_not="time"), stopped_by="max_training_seconds")

    limits = TrapLimits(max_training_seconds=10.0, max_seconds_per_image=2 * 0.5 / 64)  # below: 0.5 s a 64-batch
    assert limits.trap(stopped(128, 1.2)) is None  # twice the batch, 1.2x the step: faster per image
    assert "a speed trap" in limits.trap(stopped(64, 1.2))
    # stopped in warm-up: warm-up's cost, which every seed repeats from fresh caches
    in_warm_up = RunResult(config={"warmup_steps": 3}, label="x", status="time_limited", images_per_step=64,
                           step_seconds=[50.0], steps_done=1,
                           tta=TtaRecord(0.5, False), stopped_by="max_training_seconds")
    assert "spent 50.0 s, over its budget, in 1 warm-up step (compilation" in limits.trap(in_warm_up)


def test_the_limits_come_from_the_rung_below():
    below = fastlab.TimeToAccuracy("below", 0.5)
    for seconds, step in ((10.0, 0.2), (14.0, 0.4)):
        below.runs.append(RunResult(config={"warmup_steps": 1}, label="x", step_seconds=[3.0, step, step],
                                    images_per_step=10, window_throughput=[10 / step, 10 / step],
                                    tta=TtaRecord(0.5, True, seconds, 5, 0.6)))
    limits = bench.tta_limits(below)
    assert limits.max_training_seconds == 28.0 and limits.max_seconds_per_image == pytest.approx(0.06)
    assert bench.tta_limits(None) is None and bench.tta_limits(fastlab.TimeToAccuracy("none", 0.5)) is None


def _seeds(label: str, seconds: list[float], speed: float, checks: list[list[float]]) -> fastlab.TimeToAccuracy:
    """Seeds that reached 50% at the last of `checks` ([steps, accuracy] each), after `seconds` of training."""
    runs = []
    for i, s in enumerate(seconds):
        curve = [[s * steps / checks[-1][0], steps, acc] for steps, acc in checks]
        r = RunResult(config={"warmup_steps": 0}, label=f"{label} (seed {i})",
                      window_throughput=[speed * k for k in (0.99, 1.0, 1.01)], images_per_step=32, tta_curve=curve,
                      tta=TtaRecord(0.5, True, s, checks[-1][0], checks[-1][1]))
        runs.append(r)
    return fastlab.TimeToAccuracy(label, 0.5, runs)


def test_time_to_accuracy_reached_at_the_first_check_measures_the_checkpoint_interval():
    # both sides reach 50% at their first evaluation, after 10 steps: "2x faster to 50%" would be the 2x faster
    # step over a fixed 10 steps, when either may have reached 50% at step 1
    first = [[10, 0.6]]
    base, other = _seeds("naive", [10.0, 11.0, 12.0], 100.0, first), _seeds("+bf16", [5.0, 5.5, 6.0], 200.0, first)
    v = outcomes.tta_verdict(base, other)
    assert not v.faster and not v.told and v.seconds is not None
    assert v.finding.verdict == ("could not tell here (2.00x in seconds to 50%, but both reached 50% at the first check, "
                                 "after 10 steps: the ratio measures the checkpoint interval, not the change; evaluate "
                                 "more often or set a higher target)"), v.finding.verdict
    assert plots.tta_kind(other, v) == "noise"
    slower = outcomes.tta_verdict(base, _seeds("+compile", [20.0, 21.0, 22.0], 50.0, first))
    assert not slower.told and plots.tta_kind(other, slower) == "noise"  # not "worse" either: it cannot tell
    # the same runs with a check before the target (not reached there): the seconds are the change's, credited
    later = [[5, 0.3], [10, 0.6]]
    told = outcomes.tta_verdict(_seeds("naive", [10.0, 11.0, 12.0], 100.0, later),
                                _seeds("+bf16", [5.0, 5.5, 6.0], 200.0, later))
    assert told.faster and told.finding.verdict.startswith("holds (2.00x faster to 50%")
    # only where both sides reached it at their first check: a side that needed a later check is judged as before
    assert outcomes.tta_verdict(_seeds("naive", [10.0, 11.0, 12.0], 100.0, later), other).faster


def test_a_time_to_accuracy_the_budget_did_not_start_could_not_tell():
    from fastlab import config, train

    cfg = config.config_for("smoke")

    def refused(label):
        r = train.not_started(cfg, label, "not started: the budget was spent")
        r.tta = outcomes.tta_record(r, 0.5)
        return r

    base = outcomes.TimeToAccuracy(label="adam", target=0.5, runs=[refused("adam (seed 0)")])
    other = outcomes.TimeToAccuracy(label="adamw", target=0.5, runs=[refused("adamw (seed 0)")])
    v = outcomes.tta_verdict(base, other)
    assert not v.told and v.finding.verdict.startswith("could not tell here ('adamw (seed 0)' did not run")
    assert other.why_not == "not started: the notebook's budget was spent"
