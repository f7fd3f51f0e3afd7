import dataclasses

import pytest

from fastlab import TrainConfig, active_profile, config_for
from fastlab.__main__ import add_config_flags
from fastlab.config import PROFILES, comparison_repeats, field_names


@pytest.mark.parametrize("field, value, allowed", [
    ("batch_size", 0, ">= 1"),
    ("num_workers", -1, ">= 0"),
    ("amp", "fp8", "'off', 'fp16', 'bf16'"),
    ("model", "vgg16", "'tiny', 'compact', 'resnet18'"),
    ("dataset", "imagenet", "'auto', 'cifar10', 'synthetic'"),
    ("compile", "fast", "'reduce-overhead'"),
    ("scheduler", "step", "'cosine'"),
    ("optimizer", "lamb", "'adamw'"),
    ("lr", 0, "> 0"),
    ("lr", -1.0, ">= 0"),
    ("steps", 2.5, "integer"),
    ("pin_memory", "yes", "True or False"),
    ("device", "tpu", "'cuda:N'"),
    ("batch_size", True, "integer"),
])
def test_bad_values_name_the_field_the_value_and_what_is_allowed(field, value, allowed):
    with pytest.raises(ValueError) as err:
        TrainConfig(**{field: value})
    text = str(err.value)
    assert f"TrainConfig.{field}={value!r}" in text
    assert allowed in text


def test_worker_options_need_workers():
    with pytest.raises(ValueError, match=r"prefetch_factor=4 .*num_workers=0"):
        TrainConfig(num_workers=0, prefetch_factor=4)
    with pytest.raises(ValueError, match="persistent_workers"):
        TrainConfig(num_workers=0, persistent_workers=True)
    with pytest.raises(ValueError, match="device loader"):
        TrainConfig(loader="device", num_workers=2)
    assert TrainConfig(num_workers=2, prefetch_factor=4, persistent_workers=True).prefetch_factor == 4


def test_windows_cannot_exceed_steps():
    with pytest.raises(ValueError, match="windows"):
        TrainConfig(steps=3, windows=5)


def test_replace_validates_and_rejects_unknown_fields():
    cfg = TrainConfig()
    assert cfg.replace(amp="bf16").amp == "bf16"
    with pytest.raises(ValueError, match="unknown TrainConfig field.*'batchsize'.*batch_size"):
        cfg.replace(batchsize=64)
    with pytest.raises(ValueError, match="TrainConfig.amp='fp8'"):
        cfg.replace(amp="fp8")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.amp = "bf16"


def test_round_trip_and_diff():
    cfg = TrainConfig(amp="bf16", batch_size=64)
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="unknown TrainConfig field"):
        TrainConfig.from_dict({**cfg.to_dict(), "speed": "max"})
    assert TrainConfig().diff(cfg) == {"amp": "bf16", "batch_size": 64}


def test_profiles(monkeypatch):
    smoke = config_for("smoke")
    assert (smoke.model, smoke.dataset, smoke.profile) == ("tiny", "synthetic", "smoke")
    assert config_for("gpu").model == "resnet18"
    assert config_for("cpu", amp="bf16").amp == "bf16"
    monkeypatch.setenv("FASTLAB_PROFILE", "cpu")
    assert active_profile() == "cpu"
    monkeypatch.setenv("FASTLAB_PROFILE", "huge")
    with pytest.raises(ValueError, match="FASTLAB_PROFILE='huge'"):
        active_profile()
    monkeypatch.delenv("FASTLAB_PROFILE")
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert active_profile() == "cpu"
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    assert active_profile() == "gpu"


def test_smoke_never_uses_the_network_and_fastlab_data_picks_the_set(monkeypatch):
    monkeypatch.setenv("FASTLAB_DATA", "cifar10")
    assert config_for("smoke").dataset == "synthetic"
    assert config_for("cpu").dataset == "cifar10"
    monkeypatch.setenv("FASTLAB_DATA", "mnist")
    with pytest.raises(ValueError, match="TrainConfig.dataset='mnist'"):
        config_for("cpu")


def test_every_field_is_a_cli_flag():
    import argparse

    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    flags = {a.dest for a in parser._actions}
    assert field_names() - {"profile"} <= flags
    args = parser.parse_args(["--amp", "bf16", "--batch-size", "8", "--pin-memory", "true", "--prefetch-factor", "none"])
    assert (args.amp, args.batch_size, args.pin_memory, args.prefetch_factor) == ("bf16", 8, True, None)
    with pytest.raises(SystemExit):
        parser.parse_args(["--amp", "fp8"])


@pytest.mark.parametrize("changes, named", [(dict(grad_accum_steps=4), "grad_accum_steps=4"),
                                            (dict(set_to_none=False), "set_to_none=False")])
def test_cuda_graphs_with_gradients_kept_across_replays_are_refused_on_cuda(monkeypatch, changes, named):
    import torch

    from fastlab.code import code

    for mode in ("reduce-overhead", "max-autotune"):
        TrainConfig(compile=mode, **changes)  # no CUDA here: torch.compile adds no CUDA graphs, nothing to refuse
        TrainConfig(compile=mode, device="cpu", **changes)
        with pytest.raises(ValueError, match=f"TrainConfig.compile='{mode}' is not allowed: a mode without CUDA "
                                             f"graphs .* with {named} on a CUDA GPU"):
            TrainConfig(compile=mode, device="cuda:1", **changes)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    base = TrainConfig(compile="reduce-overhead")
    for refused in (lambda: base.replace(**changes), lambda: code(TrainConfig(compile="max-autotune").replace(**changes))):
        with pytest.raises(ValueError, match="without CUDA graphs"):  # the run and the printed script alike
            refused()
    assert TrainConfig(compile="max-autotune-no-cudagraphs", **changes).compile == "max-autotune-no-cudagraphs"


@pytest.mark.parametrize("profile", list(PROFILES) + ["custom"])
def test_every_profile_judges_on_at_least_two_interleaved_repeats(profile, monkeypatch):
    monkeypatch.delenv("FASTLAB_REPEATS", raising=False)
    cfg = config_for(profile) if profile != "custom" else TrainConfig()
    assert comparison_repeats(cfg) >= 2
