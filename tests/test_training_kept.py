"""The one training function (fastlab.training.train) keeps its numbers on every CPU: what the code guarantees
wherever it runs, not one machine's rounding.

The same run twice gives the same numbers bit for bit on the CPU at hand: the script `fastlab.code` prints, run in
another process without fastlab, logs the very losses and held-out accuracy `fastlab.run` records (a seed fixes
data, augmentation and initialisation; the loop that runs is the loop shown, in the same order of operations).
Losses recorded on one CPU are not pinned: an AVX2 CPU rounds a convolution differently from an AVX-512 one, bf16
above all (2.383 against 2.394 after 9 steps), and both are right.
"""

from __future__ import annotations

import math

import pytest
from test_code import logged, run_scripts

import fastlab
from fastlab.config import TrainConfig

BASE = dict(model="compact", device="cpu", dataset="synthetic", batch_size=32, steps=6, warmup_steps=3, windows=2,
            train_images=512, eval_images=128)
CASES = {
    "fp32": {},
    "bf16 + channels_last": dict(amp="bf16", channels_last=True),  # a trap without native bf16: slow, still kept
    "AdamW + cosine": dict(optimizer="adamw", scheduler="cosine"),
    "two workers": dict(num_workers=2),
    "grad accumulation 2": dict(grad_accum_steps=2),
}


@pytest.fixture(scope="module")
def runs() -> dict[str, fastlab.RunResult]:
    return {name: fastlab.run(TrainConfig(**BASE, **changes), label=name, progress=False)
            for name, changes in CASES.items()}


@pytest.mark.parametrize("name", list(CASES))
def test_each_case_trains_every_step_to_a_finite_loss(runs, name):
    r = runs[name]
    assert r.status == "ok", r.error
    assert [step for step, _ in r.losses] == list(range(9))  # 3 warm-up and 6 timed steps, each loss read
    assert all(math.isfinite(loss) for _, loss in r.losses) and r.eval_accuracy is not None


def test_the_printed_scripts_log_what_the_runs_recorded_bit_for_bit(runs, tmp_path):
    names = list(CASES)
    scripts = [fastlab.code(TrainConfig(**BASE, **CASES[name])) for name in names]
    for name, (rc, output) in zip(names, run_scripts(scripts, tmp_path)):
        assert rc == 0, output[-2000:]
        losses, accuracy = logged(output)
        assert losses == [(s, v) for s, v in runs[name].losses if s in dict(losses)], (name, output[-2000:])
        assert accuracy == runs[name].eval_accuracy, name
