"""fastlab.advise: each rule fires first on a run built to trigger it, none on a balanced run, and verify
reports a measured effect (or honestly none)."""

import dataclasses
import os
import time

import pytest
import torch
from torch.utils.data import Dataset

import fastlab
from fastlab import advise as adv_fn
from fastlab.advisor import (
    CPU_SMALL_BATCH,
    DATA_WAIT_SHARE,
    MEMORY_HEADROOM_SHARE,
    MEMORY_LIMIT_SHARE,
    OPTIMIZER_SHARE,
    SHORT_STEP_S,
    advice_html,
    findings_for,
    verify,
)
from fastlab.bench import ladder
from fastlab.config import config_for
from fastlab.results import RunResult, save_results
from fastlab.verdicts import is_noise

# ----------------------------------------------------------------- real CPU runs


class SlowDataset(Dataset):
    """CIFAR-shaped random images that take `delay` seconds each to 'decode': a loader slowed on purpose."""

    def __init__(self, n: int, delay: float) -> None:
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 3, 32, 32, generator=gen)
        self.y = torch.randint(0, 10, (n,), generator=gen)
        self.delay = delay
        self.synthetic = True

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        if self.delay:
            time.sleep(self.delay)
        return self.x[i], int(self.y[i])


def linear_model() -> torch.nn.Module:
    """Next to no compute, so the sleeping loader dominates even on a busy machine."""
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 10))


def keys(findings):
    return [f.key for f in findings]


def test_a_slow_loader_is_data_bound_first_and_more_workers_help(quick):
    data = (SlowDataset(128, 0.01), SlowDataset(32, 0.0))
    cfg = quick.replace(batch_size=8, steps=6, windows=2, device="cpu")
    r = fastlab.run(cfg, dataset=data, model=linear_model, progress=False)
    findings = fastlab.advise(r)
    assert keys(findings)[0] == "data_bound"
    top = findings[0]
    wait = top.evidence[0]
    assert wait.value == pytest.approx(r.data_wait_fraction()) and wait.value >= DATA_WAIT_SHARE
    assert f"{DATA_WAIT_SHARE:.0%}" in wait.rule and top.notebooks == ("01_data_loading",)
    # torch Datasets cannot go device-resident: more workers is the change
    assert top.changes["num_workers"] >= 2 and "loader" not in top.changes
    # where the cores give no more workers, the wait is still named, with a remedy outside the knobs
    busy = dataclasses.replace(r, config={**r.config, "num_workers": 4}, env={**r.env, "usable_cpus": 2})
    named = {f.key: f for f in findings_for(busy)}["data_bound"]
    assert named.changes == {} and "__getitem__" in named.technique and "2 cores" in named.technique
    with pytest.raises(ValueError, match="dataset="):
        verify(r)
    v = verify(r, dataset=data, model=linear_model)
    assert v.changed[0].config["num_workers"] == top.changes["num_workers"]
    assert v.baseline[0].config == r.config  # a fresh run of the original config, not the stored result
    # The mechanism, not the direction (a loaded machine read it as noise once): the words follow the numbers.
    c = v.comparison
    assert c.direction in ("better", "noise", "worse"), v.text()
    assert c.noise == is_noise(c.base, c.other) and c.words in v.text()


def test_a_tiny_batch_with_no_data_wait_is_overhead_bound(quick):
    r = fastlab.run(quick.replace(loader="device", batch_size=2, opt_impl="fused", device="cpu"), progress=False)
    # The premise, pinned: no data wait. A device-resident batch is an index, but on a loaded machine (CI with other
    # work) its measured share once crossed the data-wait line, and then no rule fired: the rule is the test here.
    r.data_wait_seconds = [0.0] * len(r.data_wait_seconds)
    findings = findings_for(r)
    assert keys(findings)[0] == "overhead_bound", adv_fn(r).text()
    top = findings[0]
    assert top.changes["batch_size"] > 2 and "04_batch_size" in top.notebooks
    assert any(e.value == 2 and str(CPU_SMALL_BATCH) in e.rule for e in top.evidence)
    # CPU run: no GPU advice at all
    assert not {"fp32_on_tensor_cores", "host_sync_every_step", "memory_headroom", "memory_near_limit"} & set(keys(findings))


def test_validation_without_no_grad_is_named(quick):
    r = fastlab.run(quick.replace(loader="device", batch_size=32, eval_mode="autograd", opt_impl="fused", device="cpu"),
                    progress=False)
    found = {f.key: f for f in findings_for(r)}
    assert "eval_with_autograd" in found
    f = found["eval_with_autograd"]
    assert f.changes == {"eval_mode": "inference_mode"} and f.metric == "eval"
    assert f.notebooks == ("05_no_grad_detach_item",)


def test_a_balanced_cpu_run_gets_no_advice(quick):
    r = fastlab.run(quick.replace(loader="device", batch_size=32, opt_impl="fused", device="cpu"), progress=False)
    assert findings_for(r) == [], adv_fn(r).text()
    assert "nothing to advise" in adv_fn(r).text()


def test_following_the_advice_on_the_smoke_naive_rung_is_measured():
    base = config_for("smoke", device="cpu")  # the CPU ladder, also on a machine with a GPU
    naive = base.replace(**ladder(base)[0].changes)
    r = fastlab.run(naive, label="naive", progress=False)
    if not findings_for(r) and os.getloadavg()[0] > (os.cpu_count() or 1):
        # Other processes slow the two-thread compute far more than the one-thread PIL loading, so on a
        # saturated machine the naive rung's data wait can fall under the threshold; unloaded it is ~40%.
        pytest.skip(f"machine saturated (load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores): the naive rung "
                    f"measured data wait {r.data_wait_fraction():.0%}, under {DATA_WAIT_SHARE:.0%}")
    advice = fastlab.advise(r, verify=True)
    assert advice, f"nothing fired on the naive rung: data wait {r.data_wait_fraction():.0%}\n{advice.text()}"
    assert advice[0].key == "data_bound" and advice[0].changes["loader"] == "device"
    v = advice.verification
    assert v is not None and v.finding == advice[0]
    # The mechanism, not the direction: a loaded machine can make the change read slower (it once read 0.19x), so
    # the test checks that the words follow the numbers, whichever way they came out.
    c = v.comparison
    assert c.direction in ("better", "noise", "worse"), v.text()
    assert c.noise == is_noise(c.base, c.other)
    if not c.noise:
        assert c.better == (c.other.median > c.base.median)
    assert c.base.n == naive.windows and c.other.n == naive.windows
    assert "SYNTHETIC" in v.text()
    assert v.text() in advice.text()


def test_a_panel_shows_advice_after_a_run(quick):
    pytest.importorskip("ipywidgets")
    from fastlab.widgets import Panel

    panel = Panel(quick.replace(loader="device", eval_mode="autograd", device="cpu"), {"eval_mode": None})
    assert panel.advice.value == ""
    panel.run_button.click()
    panel.wait(120)
    assert len(panel.results) == 1
    assert panel.advice.value == advice_html(panel.results[0])  # every panel shows the advice by default
    assert "05_no_grad_detach_item" in panel.advice.value and "validation records a graph" in panel.advice.value
    quiet = Panel(quick.replace(device="cpu"), {"eval_mode": None}, advice=False)
    quiet.run_button.click()
    quiet.wait(120)
    assert quiet.advice.value == ""


# ----------------------------------------------------------------- synthetic GPU results


def gpu_result(cc="9.0", gpu_gb=80.0, step_s=0.030, wait=0.02, opt_share=0.03, peak_mb=40_000.0, util=(),
               status="ok", error=None, **config_changes) -> RunResult:
    """A plausible CUDA result: 5 timed windows at `step_s` per step, the given data-wait and optimiser shares."""
    balanced = dict(loader="device", amp="bf16", channels_last=True, cudnn_benchmark=True, optimizer="adamw",
                    opt_impl="fused", log_every=10, device="cuda")
    cfg = config_for("gpu").replace(**{**balanced, **config_changes})
    images = cfg.batch_size * cfg.grad_accum_steps
    total = cfg.warmup_steps + cfg.steps
    wins = [images / step_s * f for f in (0.98, 1.0, 1.01, 0.99, 1.02)] if status == "ok" else []
    env = {"device_type": "cuda", "device_name": "NVIDIA Test GPU", "compute_capability": cc,
           "gpu_memory_gb": gpu_gb, "cpu_count": 16, "torch": torch.__version__}
    return RunResult(config=cfg.to_dict(), label="gpu run", status=status, error=error, steps_done=total,
                     images_per_step=images, window_throughput=wins, step_seconds=[step_s] * total,
                     data_wait_seconds=[step_s * wait] * total, peak_memory_mb=peak_mb,
                     memory_kind="cuda_max_allocated", env=env,
                     dataset={"name": "cifar10", "synthetic": False, "train_images": 50_000, "eval_images": 10_000},
                     gpu_util=[(i * 0.05, u) for i, u in enumerate(util)],
                     optimizer_step_seconds=[step_s * opt_share] * 3, sampled_step_seconds=[step_s] * 3)


def test_a_balanced_gpu_result_gets_no_advice():
    assert findings_for(gpu_result(util=[95.0] * 40)) == []


def test_fp32_on_tensor_cores_fires_first_with_bf16_and_channels_last():
    f = findings_for(gpu_result(amp="off", channels_last=False))
    assert keys(f)[0] == "fp32_on_tensor_cores"
    assert f[0].changes == {"amp": "bf16", "channels_last": True}
    assert f[0].notebooks == ("02_mixed_precision", "03_cudnn_benchmark_and_channels_last")
    # Volta/Turing: tensor cores but no bf16, so fp16 (with GradScaler)
    assert findings_for(gpu_result(cc="7.5", amp="off"))[0].changes == {"amp": "fp16"}
    # Pascal: no tensor cores, no precision advice
    assert "fp32_on_tensor_cores" not in keys(findings_for(gpu_result(cc="6.1", amp="off")))


def test_gpu_rules_never_fire_on_a_cpu_result():
    r = gpu_result(amp="off", channels_last=False, cudnn_benchmark=False, log_every=1, peak_mb=100.0)
    assert {"fp32_on_tensor_cores", "host_sync_every_step", "memory_headroom"} <= set(keys(findings_for(r)))
    r.env = {"device_type": "cpu", "device_name": "CPU (16 cores)", "cpu_count": 16}
    assert findings_for(r) == []


def test_a_sync_every_step_on_cuda_is_named():
    f = {x.key: x for x in findings_for(gpu_result(log_every=1))}
    assert f["host_sync_every_step"].changes == {"log_every": 10}
    assert "host_sync_every_step" not in keys(findings_for(gpu_result(log_every=1, log_loss="tensor")))


def test_short_gpu_steps_are_overhead_bound_and_offer_cuda_graphs():
    f = findings_for(gpu_result(step_s=SHORT_STEP_S / 3, batch_size=128, peak_mb=4_000.0))
    assert keys(f)[0] == "overhead_bound"
    assert f[0].changes == {"batch_size": 512} and {"compile": "reduce-overhead"} in f[0].alternatives
    # a slow step is not overhead-bound, even at the same batch
    assert "overhead_bound" not in keys(findings_for(gpu_result(step_s=SHORT_STEP_S * 3, batch_size=128)))
    # no room to grow the batch: CUDA graphs become the change
    near_full = findings_for(gpu_result(step_s=SHORT_STEP_S / 3, peak_mb=0.8 * 80 * 1024))
    assert near_full[0].changes == {"compile": "reduce-overhead"}


def test_utilisation_swings_count_as_data_bound_evidence_only_with_some_wait():
    swinging = [95.0, 10.0] * 20
    wait = DATA_WAIT_SHARE * 0.7  # under the wait threshold on its own
    f = findings_for(gpu_result(loader="dataloader", wait=wait, util=swinging))
    assert keys(f)[0] == "data_bound"
    assert f[0].changes["loader"] == "device"
    assert any("utilisation" in e.what and e.value == pytest.approx(0.5) for e in f[0].evidence)
    assert "data_bound" not in keys(findings_for(gpu_result(loader="dataloader", wait=wait, util=[95.0] * 40)))
    assert "data_bound" not in keys(findings_for(gpu_result(loader="dataloader", wait=0.0, util=swinging)))


def test_memory_headroom_and_the_limit():
    roomy = {x.key: x for x in findings_for(gpu_result(peak_mb=0.1 * 80 * 1024, batch_size=256))}
    assert roomy["memory_headroom"].changes == {"batch_size": 512}
    ev = roomy["memory_headroom"].evidence[0]
    assert ev.value == pytest.approx(0.1) and f"{MEMORY_HEADROOM_SHARE:.0%}" in ev.rule
    tight = findings_for(gpu_result(peak_mb=0.95 * 80 * 1024, batch_size=256))
    assert keys(tight)[0] == "memory_near_limit" and f"{MEMORY_LIMIT_SHARE:.0%}" in tight[0].evidence[0].rule
    # already bf16: accumulate gradients instead, keeping the images per optimiser step
    assert tight[0].changes == {"batch_size": 128, "grad_accum_steps": 2}
    fp32 = findings_for(gpu_result(peak_mb=0.95 * 80 * 1024, amp="off"))
    assert {x.key: x for x in fp32}["memory_near_limit"].changes == {"amp": "bf16"}
    oom = findings_for(gpu_result(status="failed", error="out of memory at batch_size=512 (CUDA out of memory)"))
    assert keys(oom)[0] == "out_of_memory"
    middle = findings_for(gpu_result(peak_mb=0.6 * 80 * 1024))
    assert not {"memory_headroom", "memory_near_limit"} & set(keys(middle))


def test_a_large_optimiser_share_asks_for_the_fused_update():
    f = findings_for(gpu_result(opt_share=0.4, opt_impl="for-loop"))
    assert keys(f)[0] == "optimizer_bound" and f[0].changes == {"opt_impl": "fused"}
    assert f[0].evidence[0].value == pytest.approx(0.4) and f"{OPTIMIZER_SHARE:.0%}" in f[0].evidence[0].rule
    assert "optimizer_bound" not in keys(findings_for(gpu_result(opt_share=0.4, opt_impl="fused")))
    assert "optimizer_bound" not in keys(findings_for(gpu_result(opt_share=OPTIMIZER_SHARE / 2, opt_impl="for-loop")))


def test_ranking_puts_the_data_wall_before_everything_it_hides():
    r = gpu_result(loader="dataloader", wait=0.5, amp="off", opt_share=0.3, opt_impl="for-loop", log_every=1,
                   eval_mode="autograd", peak_mb=4_000.0)
    assert keys(findings_for(r)) == ["data_bound", "optimizer_bound", "fp32_on_tensor_cores",
                                     "host_sync_every_step", "memory_headroom", "eval_with_autograd"]


# ----------------------------------------------------------------- verify, with a stand-in runner


def fake_runner(throughputs: dict[str, list[float]]):
    """Returns results whose windows are given per label prefix ('baseline' or the change), recording calls."""
    calls = []

    def runner(cfg, *, label, dataset=None, model=None, progress=False):
        calls.append((label, cfg))
        r = RunResult(config=cfg.to_dict(), label=label, window_throughput=throughputs[label.split(" ")[0]],
                      env={"device_type": "cpu"}, dataset={"synthetic": True, "eval_images": 64},
                      eval_seconds=0.5)
        return r

    runner.calls = calls
    return runner


def cpu_naive_result():
    r = gpu_result(loader="dataloader", wait=0.5)
    r.env = {"device_type": "cpu", "device_name": "CPU", "cpu_count": 2}
    r.config["device"] = "cpu"
    return r


@pytest.mark.parametrize("after, direction", [([200, 210, 205], "better"), ([101, 99, 100], "noise"),
                                              ([50, 52, 51], "worse")])
def test_verify_words_follow_the_spread(after, direction):
    runner = fake_runner({"baseline": [98, 100, 103], "loader=device": after})
    v = verify(cpu_naive_result(), runner=runner, repeats=2)
    assert v.comparison.direction == direction and v.sentence == v.comparison.words
    labels = [label for label, _ in runner.calls]
    assert labels[0].startswith("baseline") and labels[1].startswith("loader=device") and len(labels) == 4
    assert runner.calls[1][1].loader == "device" and runner.calls[0][1].loader == "dataloader"
    assert v.comparison.base.n == 6 and ("noise" in v.sentence) == (direction == "noise")
    assert v.fixed is None and f"training images/s: {v.sentence}" in v.text()


def test_verify_reports_a_failed_run_instead_of_a_ratio():
    runner = fake_runner({"baseline": [98, 100, 103], "loader=device": []})
    v = verify(cpu_naive_result(), runner=runner)
    assert v.comparison.direction == "not_comparable" and v.comparison.side == "other"
    assert "no timed window" in v.sentence and v.sentence in v.text()


def test_verify_an_eval_finding_with_one_pass_is_inconclusive():
    r = cpu_naive_result()
    r.config["eval_mode"] = "autograd"
    runner = fake_runner({"baseline": [100], "eval_mode=inference_mode": [100]})
    v = verify(r, "eval_with_autograd", runner=runner)
    # one evaluation pass a side cannot tell drift from an effect: "could not tell", whatever the two rates
    assert v.comparison.single_pair and v.comparison.noise and "cannot tell" in v.sentence
    assert v.metric == "held-out images/s" and any("repeats=3" in n for n in v.notes)


def test_verify_rejects_bad_arguments_by_name():
    r = cpu_naive_result()
    with pytest.raises(ValueError, match="repeats=0"):
        verify(r, repeats=0)
    with pytest.raises(ValueError, match="finding='fast'.*data_bound"):
        verify(r, "fast")
    with pytest.raises(ValueError, match="finding=9"):
        verify(r, 9)
    with pytest.raises(TypeError, match="RunResult"):
        fastlab.advise({"config": {}})
    with pytest.raises(ValueError, match="verify=True"):
        fastlab.advise(r, repeats=3)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="measured on cuda"):
            verify(gpu_result(loader="dataloader", wait=0.5, device="auto"))


def test_advise_and_verify_are_package_functions_and_the_module_is_not_shadowed():
    import fastlab.advisor

    assert adv_fn is fastlab.advise and fastlab.verify is verify and fastlab.advisor.advise is adv_fn


# ----------------------------------------------------------------- the command line


def test_cli_advise_prints_findings_for_every_run(tmp_path, capsys):
    from fastlab.__main__ import main

    path = save_results(tmp_path / "results.json",
                        [gpu_result(amp="off"), gpu_result(loader="dataloader", wait=0.5)])
    assert main(["advise", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.count("gpu run: ") == 2 and out.count("on NVIDIA Test GPU") == 2
    assert "fp32 on a GPU with tensor cores" in out and "data-bound" in out and "rule: >= 15%" in out
    assert main(["advise", str(tmp_path / "missing.json")]) == 2
    assert "no results file" in capsys.readouterr().err


# ----------------------------------------------------------------- a run that diverged


def diverged_result(**config_changes) -> RunResult:
    """The issue's case: the cpu ladder's top rung, compiled under bf16, NaN from step 1."""
    cfg = config_for("cpu", device="cpu").replace(**{"loader": "device", "amp": "bf16", "compile": "default",
                                                     **config_changes})
    r = RunResult(config=cfg.to_dict(), label="all on (+compile)", status="diverged",
                  error="the training loss became nan at step 1", window_throughput=[780.0, 790.0, 785.0],
                  step_seconds=[0.08] * 28, data_wait_seconds=[0.0] * 28, images_per_step=cfg.batch_size,
                  losses=[(0, 2.3), (1, float("nan"))], env={"device_type": "cpu", "device_name": "CPU", "cpu_count": 2},
                  dataset={"synthetic": True})
    r.diverged_step, r.last_finite_loss = 1, 2.3
    return r


def test_a_diverged_run_is_named_first_with_what_to_try():
    f = findings_for(diverged_result())
    assert keys(f)[0] == "diverged"
    top = f[0]
    assert top.changes == {"compile": "off"} and {"amp": "off"} in top.alternatives
    assert any(a.get("lr") == pytest.approx(0.1 * diverged_result().config["lr"]) for a in top.alternatives)
    assert top.notebooks[0] == "07_compile_and_export" and "02_mixed_precision" in top.notebooks
    shown = [e.shown() for e in top.evidence]
    assert any("step 1" in s for s in shown) and any("2.3" in s for s in shown)
    assert "not credited" in top.bottleneck
    # fp16 first asks for bf16 where bf16 is native (this CPU result), fp32 on a GPU without it
    assert findings_for(diverged_result(amp="fp16", compile="off"))[0].changes == {"amp": "bf16"}
    old_gpu = gpu_result(amp="fp16", cc="7.5")
    old_gpu.status, old_gpu.error = "diverged", "GradScaler's scale collapsed"
    assert findings_for(old_gpu)[0].changes == {"amp": "off"}


def test_verify_a_divergence_fix_checks_the_rerun_learns_and_credits_no_speed():
    def runner(losses, status="ok"):
        calls = []

        def run_(cfg, *, label, dataset=None, model=None, progress=False):
            calls.append(cfg)
            return RunResult(config=cfg.to_dict(), label=label, status=status, window_throughput=[500.0, 510.0],
                             losses=losses, steps_done=28, eval_accuracy=0.8, env={"device_type": "cpu"},
                             dataset={"synthetic": True})

        run_.calls = calls
        return run_

    fixed = runner([(0, 2.3), (27, 0.9)])
    v = verify(diverged_result(), runner=fixed, repeats=2)
    assert v.fixed is True and v.sentence.startswith("no longer diverges") and v.metric == "training loss"
    assert [c.compile for c in fixed.calls] == ["off", "off"] and not v.baseline  # no baseline: nothing to compare
    # no speed is credited against a diverged run: the comparison says so, and the reruns' speed is only reported
    assert not v.comparison.comparable and "not credited" in v.text() and v.comparison.other.n == 4
    still = verify(diverged_result(), runner=runner([(0, 2.3)], status="diverged"))
    assert still.fixed is False and still.sentence.startswith("still diverges")
    nan = verify(diverged_result(), runner=runner([(0, float("nan"))]))
    assert nan.fixed is False and "no finite loss" in nan.sentence
    failed = verify(diverged_result(), runner=runner([(0, 2.3)], status="failed"))
    assert failed.fixed is None and "no verdict" in failed.sentence


def test_a_change_that_makes_a_run_diverge_is_not_a_gain():
    def runner(cfg, *, label, dataset=None, model=None, progress=False):
        diverged = label.startswith("loader")
        return RunResult(config=cfg.to_dict(), label=label, status="diverged" if diverged else "ok",
                         error="the training loss became nan at step 3" if diverged else None,
                         window_throughput=[900.0] * 3 if diverged else [100.0] * 3, env={"device_type": "cpu"},
                         dataset={"synthetic": True})

    v = verify(cpu_naive_result(), runner=runner)
    assert (v.comparison.status, v.comparison.side) == ("diverged", "other") and "not credited" in v.sentence


def test_cli_advise_names_a_diverged_rung_first(tmp_path, capsys):
    from fastlab.__main__ import main

    healthy = cpu_naive_result()
    healthy.label = "naive"
    path = save_results(tmp_path / "results.json", [healthy, diverged_result()])
    assert main(["advise", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("DIVERGED (speed not credited): all on (+compile)")
    first_run = out.split("\n\n")[1]
    assert first_run.startswith("all on (+compile)") and "1. diverged" in first_run
    assert out.index("all on (+compile):") < out.index("naive:")


def test_watched_runs_are_read_by_the_same_rules_but_not_rerun():
    r = RunResult(config={"watched": True, "warmup_steps": 0, "loader": "iterable", "batch_size": 32},
                  label="my loop", window_throughput=[100.0] * 3, step_seconds=[0.1] * 10,
                  data_wait_seconds=[0.05] * 10, images_per_step=32, env={"device_type": "cuda", "cpu_count": 8,
                                                                          "compute_capability": "9.0"},
                  extras={"watched": True})
    f = {x.key: x for x in findings_for(r)}
    # data-bound, said for a loader that is not a DataLoader; no knob-based GPU advice from unknown knobs
    assert set(f) == {"data_bound"} and f["data_bound"].changes == {} and "DataLoader" in f["data_bound"].technique
    with pytest.raises(ValueError, match="cannot re-run it"):
        verify(r)
