"""Export (torch.export, ONNX, onnxruntime), TorchScript warning capture, and the notebook-07 lesson logic."""

import time
import warnings

import pytest
import torch

import fastlab
from fastlab import export
from fastlab.lessons import compile_export as ce
from fastlab.measure import Spread
from fastlab.models import build_model
from fastlab.results import RunResult

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    cfg = fastlab.config_for("smoke").replace(steps=4, warmup_steps=1, windows=2, train_images=128, eval_images=64)
    net = build_model(cfg.model)
    fastlab.run(cfg, model=net, progress=False)  # trains net in place
    x, y = ce.held_out_batch(cfg)
    exported = export.export_model(net, x, tmp_path_factory.mktemp("export"))
    return net.eval(), x, exported


def test_onnx_gives_the_same_top1_as_eager_on_the_held_out_batch(trained):
    net, x, exported = trained
    assert all(p.stat().st_size > 0 for p in exported.files.values())
    with torch.no_grad():
        eager = net(x)
    onnx_logits = export.onnx_runner(export.onnx_session(exported.files["onnx"]))(x)
    assert torch.equal(onnx_logits.argmax(1), eager.argmax(1))
    assert (onnx_logits - eager).abs().max().item() < 1e-4
    # the batch dimension was exported dynamic: a different batch size runs too
    assert export.onnx_runner(export.onnx_session(exported.files["onnx"]))(x[:5]).shape == (5, 10)


def test_compare_runtimes_reports_parity_and_latency_for_each_runtime(trained):
    net, x, exported = trained
    rows = export.compare_runtimes(net, x, exported, repeats=3, warmup=1)
    assert [r.name for r in rows] == ["eager PyTorch", "torch.export program", "onnxruntime"]
    assert rows[0].parity.max_abs_diff == 0.0
    for r in rows:
        assert r.parity.top1_agreement == 1.0 and r.latency.n == 3 and r.latency.low > 0


def test_parity_counts_disagreeing_rows():
    ref = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 0.0], [0.0, 3.0]])
    other = ref.clone()
    other[1] = torch.tensor([1.5, 1.0])  # top-1 flips on one row of four
    p = export.parity(ref, other)
    assert p.top1_agreement == 0.75 and p.max_abs_diff == pytest.approx(1.5)
    with pytest.raises(ValueError, match="shapes differ"):
        export.parity(ref, other[:2])


def test_latency_excludes_warmup_and_checks_arguments():
    calls = []

    def fn(x):
        calls.append(1)
        if len(calls) == 1:
            time.sleep(0.2)  # the first call is slow, like a first run that allocates or compiles

    spread = export.latency_ms(fn, torch.zeros(1), repeats=4, warmup=1)
    assert len(calls) == 5 and spread.n == 4 and spread.high < 150
    with pytest.raises(ValueError, match="repeats"):
        export.latency_ms(fn, torch.zeros(1), repeats=0)


def test_latency_verdict_says_lower_or_noise():
    base = Spread(10.0, 9.0, 11.0, 5)
    lower = export.latency_verdict(base, Spread(5.0, 4.5, 5.5, 5))
    assert lower.better and not lower.higher_is_better and str(lower).startswith("0.50x the latency (lower); 5.00 vs")
    higher = export.latency_verdict(base, Spread(20.0, 19.0, 21.0, 5))
    assert higher.direction == "worse" and "(higher)" in str(higher)
    same = export.latency_verdict(base, Spread(10.5, 9.5, 11.5, 5))
    assert same.noise and "the latency: noise" in str(same)


def test_export_rejects_a_bad_example():
    net = build_model("tiny")
    with pytest.raises(ValueError, match="4-d image batch"):
        export.export_model(net, torch.zeros(3, 32, 32), "unused")
    with pytest.raises(ValueError, match="at least 2 images"):
        export.export_model(net, torch.zeros(1, 3, 32, 32), "unused")


def test_torchscript_warnings_are_captured_once_each(monkeypatch):
    def noisy_script(model):
        for _ in range(3):
            warnings.warn("script is old", FutureWarning, stacklevel=2)
        return model

    def failing_trace(model, example):
        raise RuntimeError("cannot trace this\nmore detail")

    monkeypatch.setattr(torch.jit, "script", noisy_script)
    monkeypatch.setattr(torch.jit, "trace", failing_trace)
    found = export.torchscript_warnings(build_model("tiny"), torch.zeros(2, 3, 32, 32))
    assert found["torch.jit.script"] == ["FutureWarning: script is old"]
    assert found["torch.jit.trace"] == ["error: RuntimeError: cannot trace this"]


# ------------------------------------------------------------------ notebook 07 lesson logic


def test_recompile_is_counted_on_a_ragged_last_batch_and_not_with_drop_last(smoke):
    ragged = ce.recompile_demo(smoke, "ragged last batch", backend="eager", epochs=2, full_batches=2)
    fixed = ce.recompile_demo(smoke, "fix: drop_last", backend="eager", epochs=2, full_batches=2)
    assert ragged.recompiles == 1 and len(ragged.batch_sizes) == 2 and ragged.reasons
    assert fixed.recompiles == 0 and fixed.batch_sizes == [smoke.batch_size]
    padded = ce.recompile_demo(smoke, "fix: pad to full batch", backend="eager", epochs=1, full_batches=2)
    assert padded.recompiles == 0 and padded.images_trained == ragged.images_trained // 2
    with pytest.raises(ValueError, match="variant="):
        ce.recompile_demo(smoke, "fix: hope")
    with pytest.raises(ValueError, match="backend="):
        ce.recompile_demo(smoke, "fix: drop_last", backend="tensorrt")


def _result(label, compile_mode, throughput, warmup_seconds):
    return RunResult(config={"compile": compile_mode, "warmup_steps": 3}, label=label, images_per_step=10,
                     window_throughput=throughput, warmup_seconds=warmup_seconds)


def test_break_even_is_the_compile_cost_over_the_saving_and_none_within_noise():
    eager = _result("eager", "off", [100.0, 100.0, 100.0], 1.0)  # 100 ms per step
    fast = _result("compile default", "default", [200.0, 200.0, 200.0], 6.0)  # 50 ms per step, 5 s of compile
    assert ce.break_even_steps(eager, fast) == pytest.approx(100)
    same = _result("compile default", "default", [95.0, 100.0, 105.0], 6.0)
    assert ce.break_even_steps(eager, same) is None
    slow = _result("compile default", "default", [50.0, 50.0, 50.0], 6.0)
    assert ce.break_even_steps(eager, slow) is None


def test_modes_plan_runs_one_compile_in_smoke_and_all_elsewhere(smoke):
    to_run, skipped = ce.modes_plan(smoke)
    assert to_run == ["off", "default"] and set(skipped) == {"max-autotune", "reduce-overhead"}
    cpu = fastlab.config_for("cpu", device="cpu")
    assert ce.modes_plan(cpu)[0] == list(ce.COMPILE_MODES)


def test_modes_trains_each_planned_mode_with_its_compile_setting(smoke, monkeypatch):
    seen = []

    def fake_run(cfg, label, **kwargs):
        seen.append((cfg.compile, label, cfg.replace(compile="off") == smoke))
        return RunResult(config=cfg.to_dict(), label=label)

    monkeypatch.setattr(ce, "run", fake_run)
    ce.modes.__wrapped__(smoke, progress=False)
    assert seen == [("off", "eager", True), ("default", "compile default", True)]


def test_export_comparison_and_the_c14_verdict(trained, tmp_path):
    net, x, _ = trained
    cmp = ce.export_comparison(net, x, str(tmp_path), repeats=3, warmup=1)
    assert [r.name for r in cmp.runtimes] == ["eager PyTorch", "torch.export program", "onnxruntime"]
    assert set(cmp.sizes_kib) == {"state_dict", "torch.export", "onnx"} and set(cmp.memory_mb) == {r.name for r in cmp.runtimes}
    ce.plot_export([cmp])
    deprecated = {"torch.jit.script": ["FutureWarning: torch.jit.script is deprecated."], "torch.jit.trace": []}
    finding = ce.judge_export(cmp, deprecated)
    assert finding.verdict == "holds only when the route is ONNX (through torch.export)"
    assert ce.judge_export(cmp, {"torch.jit.script": [], "torch.jit.trace": []}).verdict == "holds"
    packed = ce.as_result(cmp, fastlab.config_for("smoke"), "batch")
    assert packed.extras["export"] is cmp and packed.images_per_step == cmp.batch_size
