import dataclasses

import pytest
from fresh_process import ran_in_fresh_process

from fastlab.lessons import hygiene as H
from fastlab.profiles import PROFILES
from fastlab.results import RunResult
from fastlab.verdicts import verdict


def test_a_kept_loss_keeps_its_graph_only_without_backward():
    leak = H.kept_graph_memory("loss", steps=3, backward=False, batch_size=4)
    assert leak.saved_tensors > 0 and leak.saved_mb > 0 and leak.graph_nodes > 0
    for keep in ("detach", "item"):
        clean = H.kept_graph_memory(keep, steps=3, backward=False, batch_size=4)
        assert clean.saved_tensors == 0 and clean.saved_mb == 0 and clean.graph_nodes == 0
    after_backward = H.kept_graph_memory("loss", steps=3, backward=True, batch_size=4)
    # backward() frees the saved activations; the graph's nodes stay reachable from the kept loss
    assert after_backward.saved_tensors == 0 and after_backward.graph_nodes == leak.graph_nodes


def test_kept_graph_grows_linearly_with_steps():
    rows = [H.kept_graph_memory("loss", steps, batch_size=4) for steps in (1, 2, 4)]
    mb = [g.saved_mb for g in rows]
    # each step adds the same amount (the shared input batch is counted once)
    assert mb[0] > 0 and mb[2] - mb[1] == pytest.approx(2 * (mb[1] - mb[0])) and mb[1] > mb[0]


def test_demo_rejects_bad_arguments():
    with pytest.raises(ValueError, match="keep='tensor' is not allowed: choose one of 'loss', 'detach', 'item'"):
        H.kept_graph_memory("tensor")
    with pytest.raises(ValueError, match="steps=0"):
        H.kept_graph_memory("loss", steps=0)


def _fake_eval(mode, seconds, peak, end_of_training=100.0):
    return RunResult(config={"eval_mode": mode}, dataset={"eval_images": 100}, eval_seconds=seconds,
                     eval_peak_memory_mb=peak, memory_trace_mb=[90.0, end_of_training])


def test_eval_summary_groups_repeats_and_calls_noise():
    results = [_fake_eval("autograd", 1.0, 150), _fake_eval("no_grad", 0.5, 110),
               _fake_eval("autograd", 1.1, 152), _fake_eval("no_grad", 0.55, 111)]
    rows = H.summarize_eval(results)
    assert [s.mode for s in rows] == ["autograd", "no_grad"]
    assert rows[0].speed.n == 2 and rows[1].speed.median == pytest.approx((200 + 100 / 0.55) / 2)
    assert rows[0].growth_mb.median == pytest.approx(51)
    # 05 prints each mode against autograd by the noise rule: faster, and memory rose 40.5 MiB less
    assert "(faster)" in str(verdict(rows[0].speed, rows[1].speed, "eval images/s"))
    assert not verdict(rows[0].growth_mb, rows[1].growth_mb, "MiB").noise
    assert rows[1].growth_mb.median - rows[0].growth_mb.median == pytest.approx(-40.5)
    same = H.summarize_eval([_fake_eval("autograd", 1.0, 150), _fake_eval("no_grad", 0.98, 150.5),
                             _fake_eval("autograd", 1.05, 151), _fake_eval("no_grad", 1.03, 149)])
    assert str(verdict(same[0].speed, same[1].speed, "eval images/s")).startswith("1.02x: noise")
    assert verdict(same[0].growth_mb, same[1].growth_mb, "MiB").noise


def test_log_loss_description_compares_growth_with_jitter():
    item = RunResult(config={"log_loss": "item"}, memory_trace_mb=[100, 101, 100, 101])
    flat = RunResult(config={"log_loss": "tensor"}, memory_trace_mb=[100, 100.5, 101, 101.5])
    grows = RunResult(config={"log_loss": "tensor"}, memory_trace_mb=[100, 150, 200, 250])
    assert H.memory_growth_mb(grows) == 150 and H.step_jitter_mb(item) == 1
    assert "noise" in H.describe_log_loss([item, flat])
    assert "more than the step-to-step jitter" in H.describe_log_loss([item, grows])


def test_eval_mode_comparison_runs(quick, monkeypatch):
    monkeypatch.setitem(PROFILES, "smoke", dataclasses.replace(PROFILES["smoke"], eval_repeats=1))
    assert [c.name for c in (H.eval_modes, H.log_loss, H.log_every)] == [
        "05_no_grad_detach_item:eval_mode", "05_no_grad_detach_item:log_loss", "05_no_grad_detach_item:log_every"]
    results = H.eval_modes(quick, progress=False)
    assert [r.config["eval_mode"] for r in results] == list(H.EVAL_MODES)
    assert all(r.steps_done == 1 and r.eval_seconds > 0 for r in results)


def test_eval_modes_take_turns_like_every_comparison(quick, monkeypatch):
    monkeypatch.setitem(PROFILES, "smoke", dataclasses.replace(PROFILES["smoke"], eval_repeats=2))
    monkeypatch.setattr(H, "run", lambda cfg, label, progress: RunResult(config={"eval_mode": cfg.eval_mode}))
    results = H.eval_modes(quick, progress=False)
    assert [r.config["eval_mode"] for r in results] == [*H.EVAL_MODES, *reversed(H.EVAL_MODES)]
    assert [r.extras["repeat"] for r in results] == [0, 0, 0, 1, 1, 1]


def test_the_sync_comparison_runs_where_nothing_else_syncs(smoke):
    cfg = H.sync_free_config(smoke.replace(amp="fp16", num_workers=2))
    assert cfg.loader == "device" and cfg.num_workers == 0 and cfg.amp in ("bf16", "off")
    runs = [RunResult(config={}, label=f"log_every={n}", window_throughput=[10, 11], env={"device_type": "cpu"})
            for n in (1, 10)]
    assert H.item_sync_finding(runs).verdict.startswith("no-op here (on cpu")
    if not __import__("torch").cuda.is_available():
        assert "CUDA feature" in H.find_syncs(smoke)


def test_c9_c10_c11_verdicts_from_counts():
    assert H.forward_saved_mb("no_grad", 4) == 0 < H.forward_saved_mb("autograd", 4)
    evals = [RunResult(config={"eval_mode": m, "batch_size": 4, "model": "tiny"}, label=m, eval_seconds=s,
                       eval_peak_memory_mb=100.0, memory_trace_mb=[100.0], memory_kind="process_rss",
                       dataset={"eval_images": 64})
             for m, s in (("autograd", 1.0), ("no_grad", 0.5), ("autograd", 1.1), ("no_grad", 0.55))]
    assert H.judge_eval(evals).verdict.startswith("holds (the memory half is true by construction on cpu")


def test_c9_memory_half_measured_on_a_gpu_says_nothing_of_construction():
    evals = [RunResult(config={"eval_mode": m, "batch_size": 4, "model": "tiny"}, label=m, eval_seconds=s,
                       eval_peak_memory_mb=mb, memory_trace_mb=[100.0], memory_kind="cuda_max_allocated",
                       dataset={"eval_images": 64}, env={"device_type": "cuda"})
             for m, s, mb in (("autograd", 1.0, 300.0), ("no_grad", 0.5, 120.0), ("autograd", 1.1, 300.0),
                              ("no_grad", 0.55, 120.0))]
    assert "by construction" not in H.judge_eval(evals).verdict
    rows = H.graph_memory_table(steps=2, batch_size=4)
    assert H.judge_detach(rows).verdict.startswith("holds only when no backward() runs")
    finding = H.judge_logging([], rows)
    assert finding.verdict.startswith("holds only when no backward() runs")


def test_log_loss_description_gives_no_growth_for_a_run_that_did_not_start():
    """A mode the notebook's budget did not start has no memory trace: its line says why, and no difference is
    computed from it (it once printed "+nan MiB over 0 steps" and "more than the step-to-step jitter")."""
    item = RunResult(config={"log_loss": "item"}, memory_trace_mb=[100, 101, 100, 101])
    refused = RunResult(config={"log_loss": "tensor"}, label="log_loss=tensor", status="time_limited",
                        error="not started: the notebook's budget was spent")
    text = H.describe_log_loss([item, refused])
    assert "nan" not in text and "difference in growth" not in text
    assert "log_loss=tensor: no memory trace to compare" in text and "not started" in text


def test_log_loss_runs_the_budget_did_not_start_state_no_growth_and_no_difference():
    from fastlab import config, train

    cfg = config.config_for("smoke")
    refused = [train.not_started(cfg.replace(log_loss=m), f"log_loss={m}", "not started: spent") for m in ("item", "tensor")]
    text = H.describe_log_loss(refused)
    assert "log_loss=item: no memory trace to compare (log_loss=item: TIME LIMITED" in text
    assert "nan" not in text and "difference in growth" not in text

def test_find_syncs_sets_the_mode_in_the_process_that_trains(quick, monkeypatch, tmp_path):
    """05 under the gpu profile (issue 53): runs train in a fresh process, and the sync-debug mode is per process, so
    find_syncs must set it where the steps train and bring that process's warnings back. On this CPU: a recorded
    set_sync_debug_mode, and a training that warns as CUDA would while the mode is "warn"; children are forked
    (not started by the forkserver), so they carry these fakes; in a fresh interpreter, since a fork after the
    suite's earlier backward passes started autograd's threads refuses to run."""
    if ran_in_fresh_process(f"{__file__}::test_find_syncs_sets_the_mode_in_the_process_that_trains"):
        return
    import multiprocessing
    import os
    import warnings

    import torch

    from fastlab import harness, isolation

    log = tmp_path / "log"

    def record(what: str) -> None:
        with open(log, "a") as f:
            f.write(f"{what} {os.getpid()}\n")

    mode = {"now": 0}

    def set_mode(value):
        mode["now"] = value
        record(f"mode={value}")

    execute = harness.TrainingRun.execute

    def training(self):
        record("train")
        if mode["now"] == "warn":
            warnings.warn("called a synchronizing CUDA operation (simulated)", stacklevel=2)
        return execute(self)

    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", set_mode)
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: 0)
    monkeypatch.setattr(harness.TrainingRun, "execute", training)
    monkeypatch.setattr(H, "resolve_device", lambda device: torch.device("cuda"))  # past its CUDA-only guard
    monkeypatch.setattr(isolation, "_context", multiprocessing.get_context("fork"))
    environ, path, cwd, _, start = isolation._setup()  # one thread in the forked child: a team of OpenMP threads
    monkeypatch.setattr(isolation, "_setup", lambda: (environ, path, cwd, 1, start))  # would hang after a fork
    found = H.find_syncs(quick.replace(device="cpu"))
    events = [line.split() for line in log.read_text().splitlines()]
    trained = {pid for what, pid in events if what == "train"}
    warned = {pid for what, pid in events if what == "mode=warn"}
    assert len(trained) == 1 and trained == warned, events  # the mode was on in the process that trained
    assert found == ["called a synchronizing CUDA operation (simulated)"]


@pytest.mark.skipif(not __import__("torch").cuda.is_available(),
                    reason="set_sync_debug_mode warns at CUDA syncs only: this needs a CUDA GPU")
def test_find_syncs_on_a_gpu_finds_the_loss_read(quick):
    found = H.find_syncs(quick.replace(device="cuda", log_every=1))  # .item() every step: a sync every step
    assert isinstance(found, list) and found and all("synchroniz" in text.lower() for text in found)
