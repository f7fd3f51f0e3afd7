"""The one training function (fastlab.training.train) keeps its numbers on every CPU: what the code guarantees
wherever it runs, not one machine's rounding.

The same run twice gives the same numbers bit for bit on the CPU at hand (a seed fixes data, augmentation and
initialisation; a change in the order of operations would show), and the script `fastlab.code` prints, run without
fastlab, logs the very losses and held-out accuracy `fastlab.run` records (the loop that runs is the loop shown).
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
def twice() -> dict[str, tuple[fastlab.RunResult, fastlab.RunResult]]:
    """Each case run twice, in turns (fp32, bf16, ..., then again)."""
    configs = {name: TrainConfig(**BASE, **changes) for name, changes in CASES.items()}
    first = {name: fastlab.run(cfg, label=name, progress=False) for name, cfg in configs.items()}
    return {name: (first[name], fastlab.run(cfg, label=name, progress=False)) for name, cfg in configs.items()}


@pytest.mark.parametrize("name", list(CASES))
def test_the_same_run_twice_gives_the_same_numbers(twice, name):
    a, b = twice[name]
    assert a.status == b.status == "ok", (a.error, b.error)
    assert [step for step, _ in a.losses] == [0, 4, 8]  # warm-up and timed steps, the loss read every 4th
    assert all(math.isfinite(loss) for _, loss in a.losses)
    assert a.losses == b.losses and a.eval_accuracy == b.eval_accuracy  # bit for bit, not approximately


def test_the_printed_scripts_log_what_the_runs_recorded(twice, tmp_path):
    names = list(CASES)
    scripts = [fastlab.code(TrainConfig(**BASE, **CASES[name])) for name in names]
    for name, (rc, output) in zip(names, run_scripts(scripts, tmp_path)):
        assert rc == 0, output[-2000:]
        losses, accuracy = logged(output)
        run = twice[name][0]
        assert losses == [(s, v) for s, v in run.losses if s in dict(losses)], (name, output[-2000:])
        assert accuracy == run.eval_accuracy, name
