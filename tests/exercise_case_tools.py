"""What every exercise's case table (tests/test_exercise_cases*.py) shares: the smoke model's config, CPU batches
laid out as the notebooks give them (NCHW, contiguous: no technique in the data), and `judged`, which runs the
exercise's real check on a learner's loop and returns its verdict and its words."""

from __future__ import annotations

import torch

from fastlab import exercise
from fastlab.config import config_for
from fastlab.data import make_synthetic

CFG = config_for("smoke")
DEVICE = torch.device("cpu")
_images, _labels = make_synthetic(6 * CFG.batch_size)
X_ALL = torch.from_numpy(_images).permute(0, 3, 1, 2).contiguous().float() / 255  # NCHW: no technique in the data
Y_ALL = torch.from_numpy(_labels)
batches = list(zip(X_ALL.split(CFG.batch_size), Y_ALL.split(CFG.batch_size)))  # 6 batches
few = batches[:3]  # where the first step shows the technique (fp16 on a CPU without native support is slow)


def judged(given, mine, technique: str, capsys, steps: int) -> tuple[bool | str | None, str]:
    """The check's verdict on `mine` (True: the technique is in it, False: missing or wrong, None: the check could
    not see; "unchanged": nothing measured) and everything it printed. One run a side, `steps` steps each."""
    result = exercise.check(given, mine, technique=technique, repeats=1, warmup_steps=1,
                            window_steps=max(1, steps - 1))
    said = capsys.readouterr().out
    return ("unchanged" if result is None else result.technique[1]), said
