"""Issue 35: the one training function (fastlab.training.train) trains as the loop it replaced did.

The numbers below were recorded from main at 55be1ff (fastlab.loop.TrainingRun's own step loop) on an AMD EPYC
(AVX-512, avx512_bf16) with torch 2.14.1: the compact net on the CPU, synthetic data, seed 0. On that machine the
new function gave every digit of them. Another CPU may round a convolution differently (bf16 above all), so the
test allows a small tolerance: a changed order of operations (a seed, an augmentation, an update) moves these
numbers far more than that.
"""

from __future__ import annotations

import pytest

import fastlab
from fastlab.config import TrainConfig

BASE = dict(model="compact", device="cpu", dataset="synthetic", batch_size=32, steps=6, warmup_steps=3, windows=2,
            train_images=512, eval_images=128)
# name: (changes, first loss, final loss, held-out accuracy)
RECORDED = {
    "fp32": ({}, 2.7997899055480957, 2.393643379211426, 0.3125),
    "bf16 + channels_last": (dict(amp="bf16", channels_last=True), 2.8004214763641357, 2.3575737476348877, 0.375),
    "AdamW + cosine": (dict(optimizer="adamw", scheduler="cosine"), 2.7997899055480957, 2.269906997680664, 0.15625),
    "two workers": (dict(num_workers=2), 2.6021604537963867, 2.2363955974578857, 0.2265625),
    "grad accumulation 2": (dict(grad_accum_steps=2), 2.721200942993164, 1.566398024559021, 0.3671875),
}


@pytest.mark.parametrize("name", list(RECORDED))
def test_the_training_function_trains_as_the_loop_it_replaced(name):
    changes, first, final, accuracy = RECORDED[name]
    r = fastlab.run(TrainConfig(**BASE, **changes), label=name, progress=False)
    assert r.status == "ok", r.error
    tolerance = 2e-2 if "amp" in changes else 2e-3
    assert r.losses[0] == (0, pytest.approx(first, rel=tolerance))
    assert r.losses[-1] == (8, pytest.approx(final, rel=tolerance))
    assert r.eval_accuracy == pytest.approx(accuracy, abs=2 / 128 + 1e-9)  # at most two held-out images apart
