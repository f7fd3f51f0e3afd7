"""fastlab.lessons.memory: one training step taken apart, checkpointing, and C4's verdict from the breakdown."""

import pytest
import torch

from fastlab.lessons import memory as m


def test_the_components_match_the_tensors():
    row = m.measure_breakdown("tiny", 8, optimizer="adam")
    params = sum(p.numel() * 4 for p in m.build_model("tiny").parameters()) / 2**20
    assert row.parameters_mb == pytest.approx(params)
    assert row.gradients_mb == pytest.approx(params)
    assert row.optimizer_mb == pytest.approx(2 * params, rel=0.01)  # exp_avg and exp_avg_sq (step counts are scalars)
    assert row.activations_mb > 0 and row.weight_copies_mb == 0
    assert row.total_mb() == pytest.approx(sum(row.component_mb().values()))
    assert "computed from tensor sizes" in row.summary() and row.dtypes["optimiser state"] == "float32"
    sgd = m.measure_breakdown("tiny", 8, optimizer="sgd")
    assert sgd.optimizer_mb == pytest.approx(params, rel=0.01)


def test_activations_grow_with_the_batch_and_nothing_else_does():
    small, big = (m.measure_breakdown("tiny", b) for b in (4, 8))
    assert big.activations_mb == pytest.approx(2 * small.activations_mb, rel=0.05)
    assert big.parameters_mb == small.parameters_mb and big.optimizer_mb == small.optimizer_mb


def test_autocast_halves_activations_keeps_fp32_state_and_adds_weight_copies():
    fp32, bf16 = m.measure_breakdown("tiny", 8), m.measure_breakdown("tiny", 8, amp="bf16")
    assert bf16.activations_mb < 0.7 * fp32.activations_mb
    assert bf16.optimizer_mb == fp32.optimizer_mb and bf16.parameters_mb == fp32.parameters_mb
    assert bf16.weight_copies_mb > 0 and bf16.dtypes["weight copies"] == "bfloat16"


def test_set_to_none_frees_the_gradients_between_steps():
    assert m.measure_breakdown("tiny", 4, set_to_none=True).grads_held_between_steps_mb == 0
    kept = m.measure_breakdown("tiny", 4, set_to_none=False)
    assert kept.grads_held_between_steps_mb == pytest.approx(kept.gradients_mb)


def test_checkpointing_keeps_less_and_recomputes_one_segment():
    plain, ckpt = m.measure_breakdown("tiny", 8), m.measure_breakdown("tiny", 8, checkpointing=True)
    assert ckpt.activations_mb < plain.activations_mb
    assert 0 < ckpt.recompute_mb < plain.activations_mb
    net = m.Segmented(m.build_model("tiny"), 2)
    x = torch.randn(2, 3, 32, 32)
    assert torch.allclose(net(x), net.net(x), atol=1e-6)  # same function, only memory changes
    assert m.time_steps("tiny", 4, checkpointing=True, repeats=2, warmup=1).n == 2


def test_c4_from_the_breakdown_names_what_stays_fp32():
    finding = m.judge_amp_memory(m.amp_pairs("tiny", (2, 16), "bf16"))
    assert finding.verdict.startswith(("holds", "does not hold here"))
    assert "stays fp32: parameters" in finding.evidence and "weight copies" in finding.evidence


@pytest.mark.parametrize("kwargs, field", [(dict(amp="fp8"), "amp"), (dict(optimizer="lamb"), "optimizer"),
                                           (dict(batch_size=0), "batch_size")])
def test_bad_arguments_are_refused(kwargs, field):
    with pytest.raises(ValueError, match=field):
        m.measure_breakdown(**{"model": "tiny", "batch_size": 4, **kwargs})


def test_checkpointing_segments_the_gpu_profiles_resnet_too():
    """12 under the gpu profile: ResNet-18 is checkpointed in the segments asked for, as the workbook nets are."""
    x = torch.randn(2, 3, 32, 32)
    for segments in (2, 4):
        net = m.Segmented(m.build_model("resnet18"), segments).eval()
        assert torch.allclose(net(x), net.net(x), atol=1e-5)  # same function, only memory changes
        assert len(net.kept) == segments  # one kept input per segment
