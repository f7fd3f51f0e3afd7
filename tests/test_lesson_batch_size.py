import math

import pytest

from fastlab.lessons import batch_size as B
from fastlab.profiles import PROFILES
from fastlab.results import RunResult, TtaRecord


class FakeRunner:
    """Fails (like a CUDA out-of-memory run) above `fits_up_to`; peak memory grows with the batch."""

    def __init__(self, fits_up_to: int, mb_per_image: float = 1.0, status_when_too_big: str = "failed"):
        self.fits_up_to = fits_up_to
        self.mb_per_image = mb_per_image
        self.too_big = status_when_too_big
        self.calls: list[int] = []

    def __call__(self, cfg, label="run", progress=False):
        b = cfg.batch_size
        self.calls.append(b)
        assert cfg.train_images == b and cfg.steps >= 1  # probes are short runs
        ok = b <= self.fits_up_to
        return RunResult(config=cfg.to_dict(), label=label, status="ok" if ok else self.too_big,
                         error=None if ok else f"out of memory at batch_size={b}", memory_kind="fake",
                         peak_memory_mb=100 + self.mb_per_image * b)


@pytest.mark.parametrize("threshold", [1, 7, 100, 333, 1000])
def test_search_finds_the_threshold_to_within_resolution(smoke, threshold):
    fake = FakeRunner(threshold)
    found = B.find_max_batch(smoke, max_batch=4096, start=32, resolution=8, runner=fake)
    assert found.largest is not None and found.largest <= threshold
    assert found.smallest_failing is not None and found.smallest_failing > threshold
    assert found.smallest_failing - found.largest <= 8 or found.largest == threshold
    # never probes a size twice, and uses few probes (doubling + bisection, not a linear scan)
    assert len(fake.calls) == len(set(fake.calls)) and len(fake.calls) <= 2 * math.log2(4096) + 2


def test_search_stops_at_max_batch_when_everything_fits(smoke):
    fake = FakeRunner(10_000)
    found = B.find_max_batch(smoke, max_batch=300, start=32, runner=fake)
    assert found.largest == 300 and found.smallest_failing is None
    assert fake.calls == [32, 64, 128, 256, 300]
    assert "max_batch=300" in found.limit and "stopped at its max_batch" in found.summary()


def test_memory_budget_is_a_limit(smoke):
    fake = FakeRunner(10_000, mb_per_image=2.0)  # never "fails", but peak = 100 + 2 * batch MiB
    found = B.find_max_batch(smoke, memory_budget_mb=600, start=16, resolution=4, runner=fake)
    assert found.largest <= 250 < found.smallest_failing and found.smallest_failing - found.largest <= 4
    assert "600 MiB" in found.limit
    assert any(not p.fits and "budget" in p.reason for p in found.probes)


def test_when_even_the_start_does_not_fit_it_halves(smoke):
    fake = FakeRunner(5)
    found = B.find_max_batch(smoke, max_batch=64, start=64, resolution=1, runner=fake)
    assert found.largest == 5 and found.smallest_failing == 6


def test_search_needs_a_limit_on_cpu_and_valid_arguments(smoke):
    with pytest.raises(ValueError, match="memory_budget_mb .* or max_batch"):
        B.find_max_batch(smoke.replace(device="cpu"), runner=FakeRunner(10))
    with pytest.raises(ValueError, match="max_batch=0 is not allowed"):
        B.find_max_batch(smoke, max_batch=0, runner=FakeRunner(10))
    with pytest.raises(ValueError, match="memory_budget_mb=-1"):
        B.find_max_batch(smoke, memory_budget_mb=-1, runner=FakeRunner(10))


def test_real_probe_runs(quick):
    found = B.find_max_batch(quick, max_batch=16, start=8, probe_steps=1)
    assert found.largest == 16 and [p.batch_size for p in found.probes] == [8, 16]
    assert all(p.peak_memory_mb > 0 for p in found.probes)


def test_scaled_lr_rules():
    assert B.scaled_lr(0.1, 32, 128, "linear") == pytest.approx(0.4)
    assert B.scaled_lr(0.1, 32, 128, "sqrt") == pytest.approx(0.2)
    assert B.scaled_lr(0.1, 128, 32, "linear") == pytest.approx(0.025)
    assert B.scaled_lr(0.1, 32, 128, "none") == 0.1
    with pytest.raises(ValueError, match="rule='cubic' is not allowed"):
        B.scaled_lr(0.1, 32, 64, "cubic")
    with pytest.raises(ValueError, match="to_batch=0"):
        B.scaled_lr(0.1, 32, 0)


def test_lr_demo_sees_the_same_images(smoke):
    configs = B.lr_demo_configs(smoke, factor=4)
    images = [(c.warmup_steps + c.steps) * c.batch_size for _, c in configs]
    assert max(images) - min(images) < configs[1][1].batch_size  # equal up to one large batch
    assert configs[1][1].batch_size == 4 * smoke.batch_size and configs[1][1].lr == smoke.lr
    assert configs[2][1].lr == pytest.approx(smoke.lr * 2)  # adam -> sqrt rule
    sgd = B.lr_demo_configs(smoke.replace(optimizer="sgd"), factor=4)
    assert sgd[2][1].lr == pytest.approx(smoke.lr * 4)
    with pytest.raises(ValueError, match="factor=1"):
        B.lr_demo_configs(smoke, factor=1)


def test_sizes(quick):
    assert B.sizes_for(quick) == list(PROFILES["smoke"].batch_grid)
    assert B.sizes_for(quick.replace(profile="custom", batch_size=100)) == [75, 100, 125]
    assert (B.sizes.name, B.lr_scaling.name) == ("04_batch_size:sizes", "04_batch_size:lr_scaling")


def _size(batch, windows):
    return RunResult(config={"batch_size": batch}, label=f"batch {batch}", images_per_step=batch,
                     window_throughput=windows)


def test_a_power_of_two_is_judged_against_its_neighbours_line():
    trend = [_size(24, [100, 102]), _size(32, [130, 134]), _size(40, [160, 166])]
    (reading,) = B.read_powers(trend)
    assert reading.place == "on" and reading.line.median == pytest.approx(132)
    assert "no power of two stands above" in B.judge_powers(trend).verdict
    bump = [_size(24, [100, 102]), _size(32, [200, 204]), _size(40, [160, 166])]
    assert B.judge_powers(bump).verdict == "holds"
    noisy = [_size(24, [20, 80]), _size(32, [25, 71, 98]), _size(40, [37, 38])]  # its own range spans the line
    assert B.read_powers(noisy)[0].place == "on"
    assert "no power of two with a measured neighbour" in B.judge_powers(bump[:2]).verdict


def _tta(label, batch, windows, seconds):
    return RunResult(config={"batch_size": batch}, label=label, images_per_step=batch, window_throughput=windows,
                     extras={"variant": label}, tta_curve=[[1.0, 5, 0.6]],
                     tta=TtaRecord(0.5, seconds is not None, seconds, 10, 0.6,
                                   None if seconds else "step budget spent"))


def test_c8_counts_time_to_accuracy_as_well_as_images_per_second(smoke):
    small = [_tta("batch 32", 32, [100, 102], s) for s in (10.0, 11.0)]
    faster_but_later = [_tta("batch 256", 256, [300, 305], s) for s in (20.0, 21.0)]
    assert B.judge_largest(small + faster_but_later).verdict == "holds only when counted in images/s"
    both = [_tta("batch 256", 256, [300, 305], s) for s in (5.0, 6.0)]
    assert B.judge_largest(small + both).verdict == "holds"
    missed = [_tta("batch 256", 256, [300, 305], None) for _ in range(2)]
    assert "reached in 0 of 2 seeds at the larger batch" in B.judge_largest(small + missed).evidence
    assert B.judge_largest(small + missed).verdict == "holds only when counted in images/s"
    small_missed = [_tta("batch 32", 32, [100, 102], None) for _ in range(2)]
    assert B.judge_largest(small_missed + faster_but_later).verdict == "holds"  # only the larger batch got there
    assert "neither batch" in B.judge_largest(small_missed + missed).evidence
    assert B.large_batch(smoke, 10_000) == smoke.batch_size * PROFILES["smoke"].largest_factor
    assert B.large_batch(smoke, None) == smoke.batch_size * B.LR_DEMO_FACTOR
    (_, a), (label, b) = B.tta_configs(smoke, 128)
    assert b.batch_size == 128 and b.lr > a.lr and "sqrt rule" in label


def test_09s_learning_rate_exercise_scales_adamw_by_the_square_root_of_the_batch_ratio():
    """09's exercise 2 rescales the larger batch's lr by the optimiser's rule, as 04 and 11 do (not linearly for Adam)."""
    import json
    from pathlib import Path

    import fastlab

    nb = Path(__file__).resolve().parents[1] / "notebooks" / "09_all_together.ipynb"
    cell = next("".join(c["source"]) for c in json.loads(nb.read_text())["cells"]
                if c["cell_type"] == "code" and "scaled = cfg_big.replace(" in "".join(c["source"]))
    lines = [line for line in cell.splitlines() if line.startswith(("from fastlab.lessons", "rule =", "scaled ="))]
    for optimizer, factor in (("adamw", 2.0), ("sgd", 4.0)):
        cfg_big = fastlab.config_for("smoke", optimizer=optimizer, batch_size=128, lr=0.01)
        namespace = {"cfg_big": cfg_big, "naive_batch": 32}
        exec("\n".join(lines), namespace)
        assert namespace["scaled"].lr == pytest.approx(0.01 * factor), (optimizer, lines)
