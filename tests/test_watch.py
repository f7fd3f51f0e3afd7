"""fastlab.watch: a loop you wrote, measured and diagnosed. A slow loader is data-bound, a loop that keeps its
loss tensors leaks, a healthy loop gets neither; windows sync only at their ends; the profiler window, sync
counting, divergence and the callback-style hooks each do what they say."""

import importlib
import json
import time
import warnings

import pytest
import torch
from fresh_process import ran_in_fresh_process
from torch import nn
from torch.utils.data import DataLoader, Dataset

import fastlab
from fastlab import loop_instruments, loop_record
from fastlab.advisor import findings_for, verify
from fastlab.models import build_model
from fastlab.results import load_results, save_results

watch_mod = importlib.import_module("fastlab.watch")  # the module: fastlab.watch itself is the function


class SlowDataset(Dataset):
    """CIFAR-shaped random images that take `delay` seconds each to 'decode': a loader slowed on purpose."""

    def __init__(self, n: int, delay: float = 0.0) -> None:
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 3, 32, 32, generator=gen)
        self.y = torch.randint(0, 10, (n,), generator=gen)
        self.delay = delay
        self.synthetic = True

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        if self.delay:
            time.sleep(self.delay)  # sleeping, not computing: the share stays large however loaded the machine
        return self.x[i], int(self.y[i])


def batches(n_batches: int, batch_size: int = 32) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Ready-made batches in memory: a loader that costs nothing."""
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(batch_size, 3, 32, 32, generator=gen), torch.randint(0, 10, (batch_size,), generator=gen))
            for _ in range(n_batches)]


def linear_model() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10))


def train_loop(w, loader, net: nn.Module, keep: str = "item") -> list:
    """A plain training loop with the two touches; keep: what it logs of each loss ("item" or "tensor")."""
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    history = []
    for x, y in w(loader):
        with w.step(len(x)):
            loss = nn.functional.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            history.append(loss.item() if keep == "item" else loss)
    return history


def keys(result):
    return [f.key for f in findings_for(result)]


# ----------------------------------------------------------------- what the issue asks to see


def test_a_slow_loader_is_data_bound():
    w = fastlab.watch("slow loader", window_steps=4)
    # 160 ms of sleeping per batch: on a machine so loaded that even the linear step takes 140 ms (seen with
    # six processes on two cores), the wait is still about half of each step
    train_loop(w, DataLoader(SlowDataset(8 * 14, delay=0.02), batch_size=8), linear_model())
    r = w.result()
    found = {f.key: f for f in findings_for(r)}
    assert "data_bound" in found, fastlab.advise(r).text()
    f = found["data_bound"]
    assert f.notebooks == ("01_data_loading",) and f.confidence
    # said in terms of the reader's own loader: workers, even on two cores, since a wait that sleeps needs no core
    # of its own
    assert f.changes["num_workers"] >= 2 and "DataLoader(num_workers=" in f.technique
    assert r.extras["watch"]["data_cpu_share"] < 0.25 and "off the CPU" in f.confidence
    assert f.evidence[0].value == pytest.approx(r.data_wait_fraction())


def test_a_loop_that_keeps_its_loss_tensors_leaks():
    # Evaluation without no_grad that keeps each loss: every step's graph and its activations stay alive
    # (about 12 MiB per step for the tiny net at batch 32: far above the few MiB RSS moves on its own). In a fresh
    # interpreter: memory earlier tests freed is reused first, and the resident size does not grow (seen in CI).
    if ran_in_fresh_process(f"{__file__}::test_a_loop_that_keeps_its_loss_tensors_leaks"):
        return
    net = build_model("tiny")
    w = fastlab.watch("keeps loss tensors", window_steps=4)
    kept = []
    for x, y in w(batches(19)):
        with w.step(len(x)):
            kept.append(nn.functional.cross_entropy(net(x), y))
    r = w.result()
    assert keys(r)[0] == "memory_leak", fastlab.advise(r).text()
    f = findings_for(r)[0]
    assert f.notebooks == ("05_no_grad_detach_item",) and "C11" in f.why and "loss.item()" in f.technique
    assert f.evidence[0].value > 50  # MiB over the timed steps
    del kept


def test_a_healthy_loop_gets_none_of_those():
    w = fastlab.watch("healthy", window_steps=4)
    history = train_loop(w, batches(19), build_model("tiny"))
    r = w.result()
    assert all(isinstance(v, float) for v in history)
    assert not {"data_bound", "memory_leak", "diverged"} & set(keys(r)), fastlab.advise(r).text()


# ----------------------------------------------------------------- the record


def test_the_result_is_a_run_result_that_saves_plots_and_reloads(tmp_path):
    w = fastlab.watch("mine", warmup_steps=2, window_steps=3, config={"amp": "off", "model": "linear"})
    train_loop(w, DataLoader(SlowDataset(8 * 12), batch_size=8), linear_model())
    r = w.result()
    assert r.extras["watched"] is True and r.config["watched"] is True and r.status == "ok"
    assert r.config["loader"] == "dataloader" and r.config["num_workers"] == 0 and r.config["amp"] == "off"
    assert r.steps_done == 12 and r.images_per_step == 8 and r.config["warmup_steps"] == 2
    assert len(r.step_seconds) == len(r.data_wait_seconds) == 12
    assert len(r.memory_trace_mb) == len(r.extras["watch"]["memory_steps"]) == 12  # short run: every step sampled
    assert len(r.window_throughput) == 3 and r.timed_seconds > 0  # 10 timed steps: 3 windows of 3, 1 step merged
    assert r.dataset == {"name": "SlowDataset", "synthetic": True, "source": loop_record.SOURCE, "train_images": 96}
    assert r.env["device_type"] == "cpu" and r.memory_kind == "process_rss" and r.peak_memory_mb > 0
    assert all(w_ >= 0 for w_ in r.data_wait_seconds) and all(s > 0 for s in r.step_seconds)
    path = save_results(tmp_path / "mine.json", [r])
    back = load_results(path)[0]
    assert back.extras["watched"] and back.window_throughput == r.window_throughput
    json.loads(path.read_text())
    from fastlab import plots

    plots.plot_comparison([r], title="watched")
    plots.plot_step_split([r], title="watched")


def test_windows_synchronise_only_at_their_ends(monkeypatch):
    calls = []
    monkeypatch.setattr(watch_mod, "synchronize", lambda device: calls.append(len(w.res.step_seconds)))
    w = fastlab.watch("syncs", warmup_steps=3, window_steps=5)
    for x, _ in w(batches(23, batch_size=2)):
        w.step_done(len(x))
    # before recording steps 3 (warm-up end), 8, 13, 18, 23, and once when the epoch's batches ran out (what
    # follows an epoch is not a step's time): never in between
    assert calls == [2, 7, 12, 17, 22, 23]
    r = w.result()
    assert len(calls) == 7 and len(r.window_throughput) == 4
    assert r.timed_seconds == pytest.approx(sum(r.step_seconds[3:]), rel=0.05)


def test_a_short_remainder_joins_the_last_window_and_a_gpu_tail_stays_untimed():
    w = fastlab.watch("tail", warmup_steps=0, window_steps=4)
    for x, _ in w(batches(9, batch_size=2)):
        w.step_done(len(x))
    assert len(w.result().window_throughput) == 2  # 4 + (4 + 1)
    meta = fastlab.watch("async device", device="meta", warmup_steps=0, window_steps=4)
    for x, _ in meta(batches(9, batch_size=2)):
        meta.step_done(len(x))
    r = meta.result()
    assert len(r.window_throughput) == 2 and r.extras["watch"]["untimed_tail_steps"] == 1


def test_a_callback_style_trainer_feeds_watch_through_its_hooks():
    class WatchCallback:
        def __init__(self, w):
            self.w = w

        def on_train_start(self, loader):
            self.w.describe(loader)

        def on_train_batch_start(self, batch):
            self.w.batch_ready()

        def on_train_batch_end(self, batch, loss):
            self.w.step_done(len(batch[0]), loss=loss)

    w = fastlab.watch("trainer", warmup_steps=1, window_steps=2, log_every=1)
    cb = WatchCallback(w)
    loader = DataLoader(SlowDataset(28), batch_size=4)
    cb.on_train_start(loader)
    for batch in batches(7, batch_size=4):
        time.sleep(0.02)  # the trainer fetching the batch
        cb.on_train_batch_start(batch)
        cb.on_train_batch_end(batch, torch.tensor(1.5))
    r = w.result()
    assert r.data_wait_fraction() > 0.9 and r.losses == [(i, 1.5) for i in range(7)] and r.last_finite_loss == 1.5
    assert r.dataset["name"] == "SlowDataset" and r.config["loader"] == "dataloader"


def test_a_loss_that_turns_nan_marks_the_run_diverged_and_advise_names_it_first():
    w = fastlab.watch("nan", warmup_steps=1, window_steps=2, log_every=2)
    for i, (x, _) in enumerate(w(batches(8, batch_size=2))):
        w.step_done(len(x), loss=torch.tensor(float("nan") if i >= 5 else 2.0 - i / 10))
    r = w.result()
    assert r.status == "diverged" and r.diverged_step == 5 and r.last_finite_loss == pytest.approx(1.7)
    assert keys(r)[0] == "diverged" and not r.ok
    with pytest.raises(ValueError, match="cannot re-run it"):
        verify(r)


def test_an_error_in_the_step_is_recorded():
    w = fastlab.watch("boom")
    with pytest.raises(RuntimeError, match="boom"):
        for x, _ in w(batches(3)):
            with w.step(len(x)):
                raise RuntimeError("boom")
    r = w.result()
    assert r.status == "failed" and "boom" in r.error and r.steps_done == 0
    with pytest.raises(RuntimeError, match="has finished"):
        w.step_done(1)


def test_bad_options_are_refused_by_name():
    for name, value in (("window_steps", 0), ("warmup_steps", -1), ("profile_steps", 1.5), ("log_every", True)):
        with pytest.raises(ValueError, match=f"{name}={value!r}"):
            fastlab.watch(**{name: value})


# ----------------------------------------------------------------- syncs and the profiler window


def test_sync_debug_on_a_cpu_is_a_no_op_with_its_reason():
    w = fastlab.watch("cpu", sync_debug=True, warmup_steps=1)
    for x, _ in w(batches(3, batch_size=2)):
        w.step_done(len(x))
    r = w.result()
    assert "CUDA" in r.no_ops["sync_debug"] and "syncs" not in r.extras["watch"]


def test_the_sync_counter_counts_torchs_warnings_by_line_and_passes_others_on(monkeypatch):
    modes = []
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    counter = loop_instruments.SyncCounter()
    with warnings.catch_warnings(record=True) as others:
        warnings.simplefilter("always")
        counter.start()
        for _ in range(3):
            warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=1)  # as torch says it
        with counter.paused():
            pass
        warnings.warn("something else", UserWarning, stacklevel=1)
        summary = counter.stop(steps=3)
    assert summary["count"] == 3 and summary["per_step"] == 1.0
    assert summary["where"][0][0].startswith(__file__ + ":") and summary["where"][0][1] == 3  # one line, 3 times
    assert [str(w.message) for w in others] == ["something else"]
    assert modes == ["warn", 0, "warn", 0]  # on, paused off and on again, restored


def test_caught_syncs_on_a_gpu_become_a_finding():
    r = fastlab.RunResult(config={"watched": True, "warmup_steps": 0, "loader": "iterable"}, label="gpu loop",
                          window_throughput=[100.0] * 3, step_seconds=[0.01] * 10, data_wait_seconds=[0.0] * 10,
                          images_per_step=64, env={"device_type": "cuda", "device_name": "GPU"},
                          extras={"watched": True, "watch": {"syncs": {"count": 20, "steps": 10, "per_step": 2.0,
                                                                       "where": [["train.py:41", 10]]}}})
    f = {x.key: x for x in findings_for(r)}["host_sync_every_step"]
    assert any("train.py:41" in str(e.value) for e in f.evidence) and f.notebooks == ("05_no_grad_detach_item",)
    r.extras["watch"]["syncs"]["per_step"] = 0.1
    assert "host_sync_every_step" not in keys(r)


def test_a_profile_window_splits_idle_time_and_saves_a_trace(tmp_path):
    w = fastlab.watch("profiled", warmup_steps=1, window_steps=2, profile_steps=2, trace_dir=tmp_path)
    delay, batch = 0.02, 4
    train_loop(w, DataLoader(SlowDataset(batch * 8, delay=delay), batch_size=batch), linear_model())
    r = w.result()
    p = r.extras["watch"]["profile"]
    assert p["steps"] == 2 and r.config["warmup_steps"] == 4  # 1 warm-up, 1 profiler warm-up, 2 profiled
    parts = p["busy_ms"] + p["idle_waiting_for_data_ms"] + p["idle_waiting_on_host_ms"]
    assert parts == pytest.approx(p["span_ms"], rel=0.02)
    # the loader sleeps at least 2 steps x 4 images x 20 ms inside the profiled steps: all of it idle for data
    assert p["idle_waiting_for_data_ms"] >= 0.9 * 2 * batch * delay * 1000
    trace = tmp_path / "profiled.pt.trace.json"
    assert p["trace"] == str(trace) and loop_instruments.DATA_RANGE in trace.read_text()
    assert "profiled steps" in loop_instruments.profile_text(r) and len(r.window_throughput) == 2


class Event:
    def __init__(self, name, start, end, device="CPU"):
        self.name = name
        self.time_range = type("R", (), {"start": start, "end": end})()
        self.device_type = type("D", (), {"name": device})()


def test_idle_breakdown_on_a_gpu_trace():
    events = [Event("ProfilerStep#1", 0, 1000), Event("ProfilerStep#2", 1000, 2000),
              Event(loop_instruments.DATA_RANGE, 0, 400), Event(loop_instruments.DATA_RANGE, 1000, 1300),
              Event("kernel_a", 300, 900, "CUDA"), Event("kernel_b", 800, 950, "CUDA"),
              Event("kernel_c", 1500, 1700, "CUDA"), Event("aten::mm", 400, 900)]
    b = loop_instruments.idle_breakdown(events, cuda=True)
    assert b["span_ms"] == 2.0 and b["busy_ms"] == pytest.approx(0.85)  # 300-950 and 1500-1700
    assert b["idle_waiting_for_data_ms"] == pytest.approx(0.6)  # 0-300 and 1000-1300
    assert b["idle_waiting_on_host_ms"] == pytest.approx(0.55)
    assert loop_instruments.idle_breakdown([Event("aten::mm", 0, 1)], cuda=False) == {}
