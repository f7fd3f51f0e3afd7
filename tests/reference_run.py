"""Measure the bundled reference results on a real GPU, in one sitting.

    PYTHONPATH=. python tests/reference_run.py --out fastlab/reference --budget-s 540

Runs the bench ladders (ResNet-18, compact) and then REPEATED_ON_A_GPU under the gpu profile, saving after each
result, so a run cut short by its budget keeps every finished result.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

from fastlab.bench import ladder, run_ladder
from fastlab.comparisons import NamedComparison
from fastlab.config import config_for
from fastlab.lessons import (
    all_together,
    batch_size,
    compile_export,
    data_loading,
    ddp,
    hygiene,
    kernels,
    mixed_precision,
    optimizers,
    own_model,
    profiling_lesson,
)
from fastlab.measure import device_name, resolve_device
from fastlab.results import RunResult, save_results

# The comparisons whose GPU results a notebook reads back, in reading order (threads.thread_effect is CPU only).
REPEATED_ON_A_GPU: dict[str, NamedComparison] = {c.name: c for c in (
    data_loading.compare_num_workers, data_loading.compare_pipeline, data_loading.compare_slow_storage,
    mixed_precision.compare_precision, mixed_precision.compare_batch_size,
    kernels.compare_cudnn_benchmark, kernels.compare_channels_last, kernels.compare_tf32,
    batch_size.sizes, batch_size.time_to_accuracy_by_batch, batch_size.lr_scaling,
    hygiene.eval_modes, hygiene.log_loss, hygiene.log_every,
    optimizers.c12_time_to_accuracy, optimizers.opt_impls,
    compile_export.modes, profiling_lesson.naive_vs_tuned, all_together.run_all_together,
    own_model.first_steps_demo, ddp.scaling,
)}


def run_comparisons(path: Path, seconds: float, profile: str = "gpu", only: str = "",
                    kept_device: str = "cuda", results: list[RunResult] | None = None) -> list[RunResult]:
    """REPEATED_ON_A_GPU under `profile`, in reading order, saved to `path` after each, none started after `seconds`;
    a result measured off `kept_device` is not kept (DDP on one GPU falls back to CPU ranks: no GPU reference)."""
    start = time.monotonic()
    results = [] if results is None else results
    device = resolve_device("auto")

    def left() -> float:
        return seconds - (time.monotonic() - start)

    def keep(new: list[RunResult], what: str) -> None:
        mine = [r for r in new if r.env.get("device_type") == kept_device]
        if len(mine) < len(new):
            print(f"{what}: {len(new) - len(mine)} result(s) measured off the {kept_device} device were not kept",
                  flush=True)
        results.extend(mine)
        save_results(path, results, meta={"kind": "reference", "device": device_name(device), "profile": profile})
        print(f"[{time.monotonic() - start:6.0f} s] {what}: {len(results)} results saved to {path}", flush=True)

    for name, compared in REPEATED_ON_A_GPU.items():
        if only and not re.search(only, name):
            continue
        if left() <= 0:
            print(f"budget spent: {name} and the comparisons after it were not run", flush=True)
            break
        try:
            base = config_for(profile, max_seconds=max(left(), 1.0))
            keep(compared(base, progress=False), name)
        except Exception as e:  # one broken comparison must not lose the others' results
            print(f"{name}: failed ({type(e).__name__}: {e})", flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="fastlab/reference", help="folder for <device>.json")
    parser.add_argument("--budget-s", type=float, default=540.0, help="stop starting new work after this many seconds")
    parser.add_argument("--only", default="", help="regex: run only the comparisons whose name matches")
    parser.add_argument("--no-ladder", action="store_true", help="skip the bench ladders")
    args = parser.parse_args(argv)
    device = resolve_device("auto")
    if device.type != "cuda":
        print("fastlab reference_run: no CUDA GPU here; reference results are measured on a real GPU only.",
              file=sys.stderr)
        return 2
    path = Path(args.out) / f"{re.sub(r'[^a-z0-9]+', '-', device_name(device).lower()).strip('-')}.json"
    start = time.monotonic()
    results: list[RunResult] = []

    def left() -> float:
        return args.budget_s - (time.monotonic() - start)

    if not args.no_ladder:
        for model in ("resnet18", "compact"):
            if left() <= 0:
                break
            base = config_for("gpu", model=model)

            def rung_done(r: RunResult, model: str = model) -> None:
                r.comparison = f"bench:ladder:{model}"
                results.append(r)
                save_results(path, results, meta={"kind": "reference", "device": device_name(device)})
                print(f"[{time.monotonic() - start:6.0f} s] ladder {model}: {r.rung}", flush=True)

            try:  # each run gets what is left of the budget as its max_seconds
                run_ladder(base, ladder(base), progress=False, on_result=rung_done, max_seconds=left, repeats=1)
            except Exception as e:  # a broken rung must not lose the rungs already saved
                print(f"ladder {model}: stopped ({type(e).__name__}: {e})", flush=True)
    run_comparisons(path, left(), only=args.only, results=results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
