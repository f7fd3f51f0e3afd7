"""fastlab.pictures: the step anatomy from the sampled parts of a step, and the data-pipeline diagram."""

import pytest

import fastlab
from fastlab import pictures
from fastlab.results import RunResult, load_results, save_results


def _sampled(label="naive", wait=0.010, fwd=0.020, bwd=0.040, opt=0.005, rest=0.001, read=0.002):
    """A run of 4 steps whose steps 1-3 were sampled: parts in seconds, the same each step."""
    step = wait + fwd + bwd + opt + rest
    return RunResult(config={"warmup_steps": 4}, label=label, step_seconds=[1.0] + [step + read] * 3,
                     data_wait_seconds=[0.5] + [wait] * 3, forward_seconds=[fwd] * 3, backward_seconds=[bwd] * 3,
                     optimizer_step_seconds=[opt] * 3, sampled_step_seconds=[step] * 3,
                     env={"device_name": "CPU (test)"}, dataset={"synthetic": True})


def test_step_anatomy_adds_up_from_the_sampled_parts():
    parts = pictures.step_anatomy(_sampled())
    assert list(parts) == ["data wait + copy", "forward", "backward", "optimiser", "loss read / sync", "other"]
    assert parts == pytest.approx({"data wait + copy": 10, "forward": 20, "backward": 40, "optimiser": 5,
                                   "loss read / sync": 2, "other": 1})
    assert "naive: 78.0 ms a sampled step = data wait + copy 10.0 ms (13%)" in pictures.describe_anatomy([_sampled()])
    with pytest.raises(ValueError, match="run 'x' has no sampled steps"):
        pictures.step_anatomy(RunResult(config={}, label="x"))


def test_a_timed_copy_is_split_from_the_data_wait():
    r = _sampled(wait=0.006, rest=0.005)  # the sampled step holds the copy: 4 ms of the 5 not otherwise named
    r.copy_seconds = [0.0, 0.004, 0.004, 0.004]  # a run that timed the copy apart (per step)
    parts = pictures.step_anatomy(r)
    assert list(parts)[:2] == ["data wait", "copy"]
    assert parts["copy"] == pytest.approx(4) and parts["data wait"] == pytest.approx(6)
    assert parts["other"] == pytest.approx(1)  # the copy is not counted twice


def test_a_real_run_samples_forward_and_backward_and_keeps_them(quick, tmp_path):
    r = fastlab.run(quick.replace(warmup_steps=3), progress=False)
    assert len(r.forward_seconds) == len(r.backward_seconds) == len(r.sampled_step_seconds) == 2
    for i in range(2):
        inside = r.forward_seconds[i] + r.backward_seconds[i] + r.optimizer_step_seconds[i]
        assert 0 < r.forward_seconds[i] and 0 < r.backward_seconds[i] and inside <= r.sampled_step_seconds[i]
    assert len(r.copy_seconds) == 2 and "copy" in pictures.step_anatomy(r)  # the copy of each sampled step
    again = load_results(save_results(tmp_path / "r.json", [r]))[0]
    assert again.forward_seconds == r.forward_seconds and again.backward_seconds == r.backward_seconds
    assert sum(pictures.step_anatomy(r).values()) > 0


def test_the_figures_draw():
    fig = pictures.plot_step_anatomy([_sampled(), _sampled("tuned", wait=0.001, bwd=0.01)])
    ax = fig.axes[0]
    assert len(ax.patches) == 12 and [t.get_text() for t in ax.get_yticklabels()] == ["naive", "tuned"]
    assert "SYNTHETIC" in ax.get_title()
    cpu = pictures.plot_data_pipeline("cpu").axes[0]
    texts = [t.get_text() for t in cpu.texts]
    assert [n for n, _, _ in pictures.PIPELINE] == [t for t in texts if t in {n for n, _, _ in pictures.PIPELINE}]
    assert sum("nothing to do on a CPU" in t for t in texts) == 2
    assert not any("nothing to do" in t.get_text() for t in pictures.plot_data_pipeline("cuda").axes[0].texts)


def test_two_samples_name_the_drift_of_the_parts_their_change_does_not_touch():
    """naive vs tuned changed only the loader and the optimiser: forward and backward moving between the two
    sampled runs is the machine drifting, printed as such; a change that may touch every part gets no such line."""
    naive = _sampled("naive", fwd=0.020, bwd=0.040)
    tuned = _sampled("tuned", wait=0.001, fwd=0.015, bwd=0.036, opt=0.002)  # forward -25%, backward -10%
    naive.config.update(loader="dataloader", opt_impl="for-loop", log_every=1, seed=0)
    tuned.config.update(loader="device", opt_impl="foreach", log_every=10, seed=1)
    text = pictures.describe_anatomy([naive, tuned])
    assert ("Parts the change does not touch moved by up to 25% between the two samples (forward 20.0 -> 15.0 ms "
            "(-25%), backward 40.0 -> 36.0 ms (-10%)): differences of that size here are drift") in text
    assert "optimiser" not in text.splitlines()[-1] and "data wait" not in text.splitlines()[-1]
    tuned.config["channels_last"] = True  # acts on forward and backward: nothing is untouched
    assert "drift" not in pictures.describe_anatomy([naive, tuned])


def test_a_run_the_budget_did_not_start_has_no_anatomy_only_its_reason():
    refused = RunResult(config={"warmup_steps": 4}, label="tuned", status="time_limited", error="not started: spent",
                        budget_cut="not started", env={"device_name": "CPU (test)"})
    text = pictures.describe_anatomy([_sampled(), refused])
    assert "naive: 78.0 ms a sampled step" in text
    assert "tuned: no step anatomy: warm-up did not run (TIME LIMITED: not started: spent)" in text
    assert "drift" not in text  # no second sample to compare
    pictures.plot_step_anatomy([_sampled(), refused])
    pictures.plot_step_anatomy([refused])
