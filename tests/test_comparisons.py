import pytest

import fastlab
from fastlab import calibration, comparisons
from fastlab.comparisons import comparison
from fastlab.config import config_for


def test_a_comparison_is_a_plain_function_that_tags_its_results(quick):
    @comparison("99_test:batch")
    def batch(base, progress=True):
        """Two batch sizes."""
        return fastlab.sweep("batch_size", [8, 16], base=base, progress=progress)

    results = batch(quick, progress=False)
    assert [r.comparison for r in results] == ["99_test:batch"] * 2
    assert [r.config["batch_size"] for r in results] == [8, 16]
    assert (batch.name, batch.arms, batch.repeated, batch.__doc__) == ("99_test:batch", None, True, "Two batch sizes.")
    assert not hasattr(comparisons, "REGISTRY")  # nothing is registered: the caller holds the function
    with pytest.raises(ValueError, match="NN_notebook:what"):
        comparison("noname")


def test_a_comparison_with_arms_sizes_its_base_by_time_and_records_how(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTLAB_CALIBRATION_CACHE", str(tmp_path / "calibration.json"))
    monkeypatch.setattr(calibration, "_KERNEL_CACHE", {})
    monkeypatch.setattr(calibration, "measure_step_seconds", lambda cfg: [0.25] * 4)
    seen = []

    @comparison("99_test:sized", arms=3, repeated=False)
    def sized(base, progress=True, extra=None):
        seen.append((base, extra))
        return [fastlab.RunResult(config=base.to_dict(), label="one")]

    cpu = config_for("cpu", device="cpu", dataset="synthetic")
    (result,) = sized(cpu, progress=False, extra="passed through")
    expected = calibration.steps_for(calibration.calibrate(cpu), calibration.seconds_per_run("cpu", 3), "cpu")
    assert seen == [(cpu.replace(steps=expected), "passed through")] and expected != cpu.steps
    assert result.extras["calibration"]["steps"] == expected and result.extras["calibration"]["arms"] == 3
    assert result.comparison == "99_test:sized"
    seen.clear()
    sized(config_for("smoke"))  # smoke keeps its fixed steps: nothing calibrated, nothing recorded
    assert seen[0][0] == config_for("smoke")


def test_arms_given_as_a_function_of_the_base_are_counted_from_it(tmp_path, monkeypatch):
    """A sweep whose values depend on the machine (01's worker counts, 04's batch sizes) passes a function: the
    comparison's time is shared among as many runs as it returns for this base, times the profile's repeats."""
    monkeypatch.setenv("FASTLAB_CALIBRATION_CACHE", str(tmp_path / "calibration.json"))
    monkeypatch.setattr(calibration, "_KERNEL_CACHE", {})
    monkeypatch.setattr(calibration, "measure_step_seconds", lambda cfg: [0.02] * 4)

    @comparison("99_test:counted", arms=lambda base: base.batch_size // 8)
    def counted(base, progress=True):
        return [fastlab.RunResult(config=base.to_dict(), label="one")]

    cpu = config_for("cpu", device="cpu", dataset="synthetic")
    runs = {}
    for batch in (8, 64):
        (result,) = counted(cpu.replace(batch_size=batch), progress=False)
        runs[batch] = result.extras["calibration"]["arms"]
    repeats = fastlab.config.comparison_repeats(cpu)
    assert runs == {8: 1 * repeats, 64: 8 * repeats}
    with pytest.raises(ValueError, match="a function of the base config"):
        comparison("99_test:bad", arms=0)


def test_the_notebooks_training_comparisons_are_sized_by_time():
    """Issue 27: every comparison a notebook runs that trains for throughput declares its arms; the ones left
    unsized are the ones with their own rules (time to accuracy, simulated storage, evaluation, equal images)."""
    from reference_run import REPEATED_ON_A_GPU

    unsized = sorted(name for name, fn in REPEATED_ON_A_GPU.items() if fn.arms is None)
    assert unsized == sorted([
        "01_data_loading:slow_storage", "04_batch_size:lr_scaling", "04_batch_size:time_to_accuracy",
        "05_no_grad_detach_item:eval_mode", "06_adamw_and_schedules:c12_time_to_accuracy",
        "10_your_own_model:first_steps", "11_multi_gpu_ddp:scaling"]), unsized  # 09's ladder: its rungs are its arms
