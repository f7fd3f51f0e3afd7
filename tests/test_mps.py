"""Apple GPUs (PyTorch's mps device), with torch.backends.mps mocked: there is no Mac here.

What is shown: device="auto" picks mps when there is no CUDA, the profile choice, the synchronise and memory
calls a run on mps makes, and which knobs are no-ops (with reasons) on mps, on a CPU and on an older GPU.
"""

import pytest
import torch

from fastlab import measure
from fastlab.config import PROFILES, TrainConfig, active_profile, config_for, no_op_reasons

MPS = torch.device("mps")


@pytest.fixture
def mac(monkeypatch):
    """An Apple-silicon machine as torch sees it: no CUDA, an available mps backend, 300 MiB allocated."""
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(torch.mps, "synchronize", lambda: calls.append("synchronize"))
    memory = {"current": 300 * 2**20, "driver": 512 * 2**20}
    monkeypatch.setattr(torch.mps, "current_allocated_memory", lambda: memory["current"])
    monkeypatch.setattr(torch.mps, "driver_allocated_memory", lambda: memory["driver"])
    monkeypatch.delenv("FASTLAB_PROFILE", raising=False)
    return calls, memory


def test_auto_picks_mps_when_there_is_no_cuda(mac):
    assert measure.resolve_device("auto") == MPS
    assert measure.resolve_device("mps") == MPS
    assert measure.resolve_device("cpu") == torch.device("cpu")


def test_cuda_wins_over_mps_and_without_either_it_is_the_cpu(monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert measure.resolve_device("auto").type == "cuda"
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert measure.resolve_device("auto").type == "cpu"
    with pytest.raises(ValueError, match="MPS is not available"):
        measure.resolve_device("mps")


def test_the_mps_profile_is_the_default_on_a_mac_and_sized_between_cpu_and_gpu(mac):
    assert active_profile() == "mps"
    cfg = config_for()
    assert cfg.profile == "mps" and cfg.device == "auto"
    # images a run's timed steps see
    sizes = {p: PROFILES[p].settings["steps"] * PROFILES[p].settings["batch_size"] for p in ("cpu", "mps", "gpu")}
    assert sizes["cpu"] < sizes["mps"] < sizes["gpu"]
    assert cfg.model != "resnet18" and cfg.max_seconds > 0  # a laptop GPU: the compact net, a time budget


def test_clock_reads_synchronise_through_torch_mps(mac):
    calls, _ = mac
    measure.now(MPS)
    assert calls == ["synchronize"]


def test_memory_on_mps_reads_torch_mps_and_says_what_it_is(mac):
    _, memory = mac
    meter = measure.MemoryMeter(MPS)
    assert meter.kind == "mps_allocated_peak_of_samples"
    assert meter.current_mb() == 300 and meter.driver_mb() == 512
    memory.update(current=900 * 2**20, driver=1024 * 2**20)
    assert meter.sample() == 900
    memory.update(current=100 * 2**20)
    meter.sample()
    assert meter.peak() == 900 and meter.driver_peak_mb == 1024  # peaks are the largest samples
    meter.reset()
    assert meter.peak() == 100
    assert measure.device_name(MPS).startswith("Apple GPU (mps")


def test_no_ops_on_mps_with_reasons(mac):
    on = TrainConfig(pin_memory=True, cudnn_benchmark=True, tf32=not TrainConfig().tf32, opt_impl="fused",
                     compile="reduce-overhead")
    reasons = no_op_reasons(on, MPS)
    assert set(reasons) == {"pin_memory", "cudnn_benchmark", "tf32", "compile"}  # fused optimisers exist on mps
    assert "shares memory with the CPU" in reasons["pin_memory"]
    assert "CUDA graphs" in reasons["compile"] and "NVIDIA" in reasons["cudnn_benchmark"]
    assert no_op_reasons(TrainConfig(), MPS) == {}  # the defaults are stock PyTorch: nothing to report


def test_fused_optimisers_where_this_torch_has_none(monkeypatch):
    monkeypatch.setattr("fastlab.config.fused_optimizer_devices", lambda: ("cuda",))
    assert "no fused optimiser kernels" in no_op_reasons(TrainConfig(opt_impl="fused"), MPS)["opt_impl"]


def test_no_ops_on_a_cpu_and_on_a_gpu_without_the_capability():
    on = TrainConfig(pin_memory=True, non_blocking=True, cudnn_benchmark=True, compile="max-autotune")
    assert set(no_op_reasons(on, "cpu")) == {"pin_memory", "non_blocking", "cudnn_benchmark", "compile"}
    flipped_tf32 = TrainConfig(tf32=not TrainConfig().tf32, pin_memory=True, compile="reduce-overhead")
    t4 = no_op_reasons(flipped_tf32, "cuda", capability=(7, 5))
    assert set(t4) == {"tf32"} and "this one is 7.5" in t4["tf32"]
    assert no_op_reasons(flipped_tf32, "cuda", capability=(9, 0)) == {}
    assert set(no_op_reasons(TrainConfig(matmul_precision="high"), "cuda", capability=(7, 0))) == {"matmul_precision"}


def test_no_ops_of_the_copy_knobs_follow_the_loader_and_pinning():
    pageable = TrainConfig(non_blocking=True)  # on a GPU: a copy from pageable memory is synchronous all the same
    assert "pageable" in no_op_reasons(pageable, "cuda", capability=(9, 0))["non_blocking"]
    assert no_op_reasons(pageable.replace(pin_memory=True), "cuda", capability=(9, 0)) == {}
    on_device = TrainConfig(loader="device", pin_memory=True, non_blocking=True)  # no host copy left to speed up
    for where in ("cpu", "cuda"):
        reasons = no_op_reasons(on_device, where, capability=(9, 0))
        assert set(reasons) == {"pin_memory", "non_blocking"}
        assert all("device loader" in why for why in reasons.values())


def test_the_config_as_it_runs_here_sets_what_cannot_act_to_its_stock_value(monkeypatch):
    from fastlab.config import as_run_here

    monkeypatch.setattr("fastlab.config.fused_optimizer_devices", lambda: ("cuda",))
    runs, no_ops, notes = as_run_here(TrainConfig(opt_impl="fused", amp="bf16", pin_memory=True), MPS)
    assert (runs.opt_impl, runs.amp, runs.pin_memory) == ("default", "off", True)  # pin_memory fails nowhere
    assert {"opt_impl", "amp", "pin_memory"} <= set(no_ops) and notes == []



AVX2 = {"sse4_2", "avx", "avx2", "fma"}
AVX512_BF16 = AVX2 | {"avx512f", "avx512dq", "avx512bw", "avx512vl", "avx512_bf16"}


@pytest.mark.parametrize("flags, high, medium", [
    (AVX2, True, True),  # neither TF32 (AMX-FP16) nor oneDNN bf16 support: both settings do nothing
    (AVX512_BF16, True, False),  # oneDNN bf16 support: 'medium' hands fp32 matmuls to oneDNN in bf16 mode
    (AVX512_BF16 | {"amx_bf16", "amx_fp16"}, False, False),  # AMX-FP16: torch's CPU TF32 matmuls
])
def test_matmul_precision_on_a_cpu_is_a_no_op_where_torch_keeps_fp32_matmuls(monkeypatch, flags, high, medium):
    from fastlab.config import plan_arm

    monkeypatch.setattr("fastlab.config.cpu_flags", lambda: set(flags))
    for precision, idle in (("high", high), ("medium", medium)):
        reasons = no_op_reasons(TrainConfig(matmul_precision=precision), "cpu")
        assert ("matmul_precision" in reasons) == idle, (precision, reasons)
        plan = plan_arm(TrainConfig(), TrainConfig(matmul_precision=precision), "cpu")
        assert (plan.kind == "no-op") == idle
    assert "AMX-FP16" in no_op_reasons(TrainConfig(matmul_precision="high"), "cpu").get("matmul_precision", "AMX-FP16")
    assert "matmul_precision" not in no_op_reasons(TrainConfig(), "cpu")  # "highest": torch's default, nothing to do
