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
