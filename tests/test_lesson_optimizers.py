import pytest

from fastlab.comparisons import all_comparisons
from fastlab.lessons import optimizers as O
from fastlab.results import RunResult


def test_presets_apply_and_reject_unknown(smoke):
    w = O.preset(smoke, "adamw")
    assert (w.optimizer, w.weight_decay) == ("adamw", O.OPTIMIZER_PRESETS["adamw"]["weight_decay"])
    assert O.preset(smoke, "sgd").lr > O.preset(smoke, "adam").lr  # SGD needs the larger lr
    with pytest.raises(ValueError, match="name='lion' is not allowed: choose one of 'adam', 'adamw', 'sgd'"):
        O.preset(smoke, "lion")
    assert O.seeds_for(smoke) == (0,) and len(O.seeds_for(smoke.replace(profile="gpu"))) == 3


def _fake(variant, acc, seconds=1.0):
    return RunResult(config={}, label=variant, eval_accuracy=acc, step_seconds=[seconds],
                     extras={"variant": variant})


def test_accuracy_over_seeds_and_noise():
    results = [_fake("adam", 0.50), _fake("adamw", 0.60), _fake("adam", 0.52), _fake("adamw", 0.61),
               _fake("sgd", 0.51), _fake("sgd", 0.505)]
    acc = O.accuracy_by_variant(results)
    assert list(acc) == ["adam", "adamw", "sgd"] and acc["adam"].median == pytest.approx(0.51)
    text = O.describe_accuracy(results)
    assert "adamw: held-out accuracy 60.5%" in text and "+9.5 points" in text
    assert "sgd" in text and text.splitlines()[2].endswith("noise")
    one_seed = O.describe_accuracy([_fake("adam", 0.5), _fake("adamw", 0.6)])
    assert "1 seed: no spread" in one_seed and "cannot tell it from noise" in one_seed


def test_optimizer_step_micro_benchmark(quick):
    timings = O.benchmark_opt_impls(quick, impls=("for-loop", "fused"), repeats=3)
    assert [t.impl for t in timings] == ["for-loop", "fused"]
    assert all(t.steps_per_second.n == 3 and t.milliseconds > 0 for t in timings)
    assert timings[0].params == sum(1 for _ in __import__("fastlab").models.build_model(quick.model).parameters())
    assert "against for-loop" in O.describe_step_timings(timings)
    with pytest.raises(ValueError, match="impl='turbo' is not allowed"):
        O.time_optimizer_step(quick, "turbo")


def test_optimizer_step_changes_parameters_like_a_real_step(quick):
    # the benchmark's optimizer is the one fastlab.run builds: AdamW's decoupled decay shows in its defaults
    import torch

    from fastlab.train import TrainingRun

    opt = TrainingRun(O.preset(quick, "adamw"), "x", None, None, False, None, None)._build_optimizer(torch.nn.Linear(2, 2))
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults["weight_decay"] == 0.05


def test_comparisons_registered_and_run(quick):
    names = set(all_comparisons())
    assert {"06_adamw_and_schedules:optimizers", "06_adamw_and_schedules:schedules",
            "06_adamw_and_schedules:opt_impl"} <= names
    results = O.schedules(quick, progress=False)
    assert [r.config["scheduler"] for r in results] == list(O.SCHEDULES)
    assert all(r.config["optimizer"] == "adamw" and r.eval_accuracy is not None for r in results)
    fig = O.plot_accuracy_vs_time(results)
    assert "SYNTHETIC" in fig.axes[0].get_title()
