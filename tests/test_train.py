import threading

import pytest
import torch
from torch import nn

import fastlab
from fastlab.clocks import window_ends
from fastlab.data import ImageSet, make_synthetic


def test_a_smoke_run_measures_everything(smoke):
    r = fastlab.run(smoke, progress=False)
    total = smoke.warmup_steps + smoke.steps
    assert r.status == "ok" and r.steps_done == total
    assert len(r.window_throughput) == smoke.windows
    t = r.throughput
    assert 0 < t.low <= t.median <= t.high
    assert len(r.step_seconds) == len(r.data_wait_seconds) == len(r.memory_trace_mb) == total
    assert all(0 <= w <= s for w, s in zip(r.data_wait_seconds, r.step_seconds))
    assert r.warmup_seconds > 0 and r.timed_seconds > 0
    # throughput is images over timed wall time: consistent with the per-step host times
    assert r.images_per_step * smoke.steps / r.timed_seconds == pytest.approx(t.median, rel=0.5)
    assert [s for s, _ in r.losses] == list(range(total))
    assert r.peak_memory_mb > 0 and r.memory_kind in ("process_rss", "cuda_max_allocated")
    assert r.env["torch"] == torch.__version__ and r.env["profile"] == "smoke" and r.env["cpu_count"] >= 1
    assert r.dataset["synthetic"] is True and r.dataset["name"] == "synthetic"
    assert 0.0 <= r.data_wait_fraction() <= 1.0
    assert "synthetic data" in r.summary()


def test_the_smoke_run_learns_clearly_above_chance(smoke):
    r = fastlab.run(smoke, progress=False)
    assert r.eval_accuracy > 0.17, f"10 classes: chance is 0.10, got {r.eval_accuracy}"
    first, last = r.losses[0][1], sum(v for _, v in r.losses[-5:]) / 5
    assert last < first


def test_same_seed_same_losses(quick):
    a = fastlab.run(quick, progress=False)
    b = fastlab.run(quick, progress=False)
    assert [v for _, v in a.losses] == pytest.approx([v for _, v in b.losses], rel=1e-5)


@pytest.mark.skipif(torch.cuda.is_available(), reason="no-ops are CPU-only here")
def test_gpu_only_knobs_are_recorded_as_no_ops_on_cpu(quick):
    r = fastlab.run(quick.replace(pin_memory=True, non_blocking=True, cudnn_benchmark=True, tf32=False,
                                  num_workers=1), progress=False)
    assert r.status == "ok"
    assert set(r.no_ops) == {"pin_memory", "non_blocking", "cudnn_benchmark", "tf32"}
    assert "cpu" in r.no_ops["cudnn_benchmark"].lower()


def test_stop_event_ends_the_run_interrupted_with_partial_steps(quick):
    stop = threading.Event()

    def on_step(done, total):
        if done == 3:
            stop.set()

    cfg = quick.replace(steps=200, windows=2, max_seconds=0.0)
    r = fastlab.run(cfg, stop=stop, on_step=on_step, progress=False)
    # the run's process reports its steps as it goes, so it may have finished a step or two more by the time the
    # stop reaches it: every step it finished is kept
    assert r.status == "interrupted" and 3 <= r.steps_done < cfg.warmup_steps + cfg.steps
    assert len(r.step_seconds) == r.steps_done
    assert r.eval_accuracy is None


def test_keyboard_interrupt_ends_the_run_with_its_steps(quick):
    def on_step(done, total):
        if done == 2:
            raise KeyboardInterrupt

    cfg = quick.replace(steps=200, windows=2, max_seconds=0.0)
    r = fastlab.run(cfg, on_step=on_step, progress=False)
    assert r.status == "interrupted" and 2 <= r.steps_done < cfg.warmup_steps + cfg.steps
    assert len(r.losses) == r.steps_done // cfg.log_every


class BlowsUpAbove(nn.Module):
    """Raises CUDA's out-of-memory error for batches larger than `limit`, like a GPU that is too small."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.net = fastlab.models.TinyNet()

    def forward(self, x):
        if len(x) > self.limit:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return self.net(x)


def test_out_of_memory_fails_that_run_and_the_next_one_works(quick):
    r = fastlab.run(quick.replace(batch_size=64), model=lambda: BlowsUpAbove(32), progress=False)
    assert r.status == "failed"
    assert r.error.startswith("out of memory at batch_size=64")
    ok = fastlab.run(quick.replace(batch_size=16), model=lambda: BlowsUpAbove(32), progress=False)
    assert ok.status == "ok"


def test_other_errors_are_not_swallowed(quick):
    class Broken(nn.Linear):  # passes the preflight check (eval mode), then fails in training
        def forward(self, x):
            if self.training:
                raise RuntimeError("shape mismatch")
            return torch.zeros(len(x), 10)

    with pytest.raises(RuntimeError, match="shape mismatch"):
        fastlab.run(quick, model=Broken(2, 2), progress=False)


def test_loss_tensor_logging_keeps_every_step(quick):
    r = fastlab.run(quick.replace(log_loss="tensor", log_every=2), progress=False)
    total = quick.warmup_steps + quick.steps
    assert r.kept_loss_tensors == total
    assert [s for s, _ in r.losses] == [1, 3, 4]  # every log_every steps, and the last step (read after the run)


def test_grad_accumulation_counts_images(quick):
    r = fastlab.run(quick.replace(batch_size=8, grad_accum_steps=3), progress=False)
    assert r.images_per_step == 24


@pytest.mark.parametrize("changes", [
    dict(amp="bf16", channels_last=True),
    dict(amp="fp16"),
    dict(loader="device", optimizer="adamw", opt_impl="fused", scheduler="cosine"),
    dict(optimizer="sgd", opt_impl="foreach", scheduler="onecycle", eval_mode="inference_mode"),
    dict(num_workers=2, persistent_workers=True, prefetch_factor=2, eval_mode="autograd"),
])
def test_knob_combinations_run(quick, changes):
    r = fastlab.run(quick.replace(**changes), progress=False)
    assert r.status == "ok" and r.eval_accuracy is not None
    if changes.get("amp") == "fp16":
        assert r.grad_scale and r.grad_scale[0] > 1


def test_model_and_dataset_can_be_brought(quick):
    x, y = make_synthetic(96, "train")
    ex, ey = make_synthetic(32, "eval")
    own = ImageSet(x, y, ex, ey, "synthetic", "made in a test")
    r = fastlab.run(quick, model=nn.Sequential(nn.Flatten(), nn.Linear(3072, 10)), dataset=own, progress=False)
    assert r.status == "ok" and r.dataset["train_images"] == 96


def test_compare_and_sweep(quick):
    base, changed = fastlab.compare(quick, batch_size=16, progress=False)
    assert base.label == "baseline" and changed.label == "batch_size=16"
    assert changed.images_per_step == 16
    results = fastlab.sweep("batch_size", [8, 16], base=quick, progress=False)
    assert [r.label for r in results] == ["batch_size=8", "batch_size=16"]
    with pytest.raises(ValueError, match="batch_size=0"):
        fastlab.sweep("batch_size", [8, 0], base=quick, progress=False)


def test_windows_cover_every_timed_step():
    ends = window_ends(3, 20, 3)
    assert sum(ends.values()) == 20 and max(ends) == 23 and min(ends) == 9


def test_optimizer_share_is_sampled_in_warm_up_only(quick):
    r = fastlab.run(quick.replace(warmup_steps=3), progress=False)
    assert len(r.optimizer_step_seconds) == len(r.sampled_step_seconds) == 2
    assert 0 < r.optimizer_share() < 1


def test_torch_datasets_can_be_brought(quick):
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(0)
    train = TensorDataset(torch.randn(64, 3, 32, 32, generator=g), torch.randint(0, 10, (64,), generator=g))
    held_out = TensorDataset(torch.randn(20, 3, 32, 32, generator=g), torch.randint(0, 10, (20,), generator=g))
    r = fastlab.run(quick.replace(batch_size=16), dataset=(train, held_out), progress=False, comparison="t:x")
    assert r.status == "ok" and r.dataset["train_images"] == 64 and r.dataset["eval_images"] == 20
    assert r.comparison == "t:x" and r.eval_accuracy is not None
    with pytest.raises(ValueError, match="loader='device' needs the images as arrays"):
        fastlab.run(quick.replace(loader="device"), dataset=(train, held_out), progress=False)
