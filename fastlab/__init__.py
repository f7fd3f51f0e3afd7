"""fastlab: measure what makes PyTorch training fast.

Core API: TrainConfig and config_for (the knobs), run / compare / sweep (the harness),
RunResult with save_results / load_results (what was measured). The notebook widgets live in
fastlab.widgets, which alone imports ipywidgets.
"""

import sys as _sys

from . import cpu_kind  # noqa: F401  (first: FASTLAB_CPU_KIND caps torch's kernels before torch is imported)

if _sys.argv[:1] == ["-m"]:  # `python -m fastlab ...`: a Ctrl-C while torch loads ends in one line, not a traceback
    try:
        import torch  # noqa: F401
    except KeyboardInterrupt:
        print("fastlab: interrupted (Ctrl-C) while starting — nothing was run", file=_sys.stderr)
        raise SystemExit(130) from None

from .advisor import advise, verify  # fastlab.advise(result), fastlab.verify(result)
from .code import code, code_diff
from .config import PROFILES, TrainConfig, active_profile, config_for
from .data import DatasetError, ImageSet, load_images
from .measure import Spread, environment
from .outcomes import (
    TimeToAccuracy,
    accuracy_spread,
    describe_accuracy,
    outcome_verdict,
    run_seeds,
    time_to_accuracy,
)
from .results import RunResult, load_reference, load_results, reference_for, reference_summary, save_results
from .train import active_run, compare, interleave, run, sweep
from .verdicts import Comparison, is_noise, runs_verdict, verdict  # is B better than A: a typed answer
from .version import __version__
from .watch import compare_loops as compare_loops  # two versions of your loop, in turns
from .watch import watch as watch  # fastlab.watch(...): measure a loop you wrote

__all__ = [
    "PROFILES", "TrainConfig", "active_profile", "config_for", "DatasetError", "ImageSet", "load_images",
    "Spread", "environment", "is_noise", "verdict", "runs_verdict", "Comparison", "RunResult", "load_reference", "load_results",
    "save_results", "reference_for", "reference_summary", "compare", "interleave", "run", "sweep", "__version__",
    "active_run", "run_seeds", "accuracy_spread", "describe_accuracy", "outcome_verdict", "time_to_accuracy",
    "TimeToAccuracy", "watch", "compare_loops", "code", "code_diff", "advise", "verify",
]
