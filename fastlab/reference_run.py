"""Measure the bundled reference results on a real GPU, in one sitting.

    PYTHONPATH=. python -m fastlab.reference_run --out fastlab/reference --budget-s 540

Runs the bench ladder (ResNet-18 and the compact net) and then every registered notebook comparison
under the gpu profile, saving after each one (atomically), so a run cut short by its budget still
leaves every finished result on disk with its environment fingerprint and date.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

from .bench import ladder, run_ladder
from .comparisons import all_comparisons, run_comparison
from .config import config_for
from .measure import device_name, resolve_device
from .results import RunResult, save_results


def device_slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="fastlab/reference", help="folder for <device>.json")
    parser.add_argument("--budget-s", type=float, default=540.0, help="stop starting new work after this many seconds")
    parser.add_argument("--only", default="", help="regex: run only the comparisons whose name matches")
    parser.add_argument("--no-ladder", action="store_true", help="skip the bench ladders")
    args = parser.parse_args(argv)
    device = resolve_device("auto")
    if device.type != "cuda":
        print("fastlab.reference_run: no CUDA GPU here; reference results are measured on a real GPU only.",
              file=sys.stderr)
        return 2
    path = Path(args.out) / f"{device_slug(device_name(device))}.json"
    start = time.monotonic()
    results: list[RunResult] = []

    def save(what: str) -> None:
        save_results(path, results, meta={"kind": "reference", "device": device_name(device)})
        print(f"[{time.monotonic() - start:6.0f} s] {what}: {len(results)} results saved to {path}", flush=True)

    if not args.no_ladder:
        for model in ("resnet18", "compact"):
            if time.monotonic() - start > args.budget_s:
                break
            base = config_for("gpu", model=model)
            for r in run_ladder(base, ladder(base), progress=False):
                r.extras["comparison"] = f"bench:ladder:{model}"
                results.append(r)
            save(f"ladder {model}")
    for name in all_comparisons():
        if args.only and not re.search(args.only, name):
            continue
        if time.monotonic() - start > args.budget_s:
            print(f"budget spent: {name} and the comparisons after it were not run", flush=True)
            break
        try:
            results += run_comparison(name, config_for("gpu"), progress=False)
        except Exception as e:  # one broken comparison must not lose the others' results
            print(f"{name}: failed ({type(e).__name__}: {e})", flush=True)
            continue
        save(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
