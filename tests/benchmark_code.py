"""Benchmark (not a test): the script fastlab.code writes against fastlab.run of the same configuration.

Three configurations of the profile: naive (the ladder's first rung), the cpu profile's best rung (the ladder up to
device-resident data, without bf16: README's cpu table measured that rung fastest and bf16 a trap there) and naive
plus channels_last. Each repeat runs, for each configuration in turn, the script in a fresh interpreter and then
fastlab.run in this process (interleaved: the machine drifts). Prints each side's median images/s over repeats and
the ratio, judged by fastlab's noise rule (fastlab.verdicts.verdict). The two should agree within noise; where they do not,
the difference is the harness (its per-step bookkeeping, the run thread) or the process a run starts in.

    python tests/benchmark_code.py [--profile cpu] [--repeats 3]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import fastlab
from fastlab.bench import ladder
from fastlab.measure import Spread
from fastlab.verdicts import verdict


def configs(base: fastlab.TrainConfig) -> dict[str, fastlab.TrainConfig]:
    rungs = {r.name: r.changes for r in ladder(base)}
    best: dict = {}
    for name in ("naive", "workers", "cudnn", "channels_last", "fused_adamw", "device_loader"):  # amp left out
        best.update(rungs[name])
    naive = base.replace(**rungs["naive"])
    return {"naive": naive, "cpu best": base.replace(**best), "naive + channels_last": naive.replace(channels_last=True)}


def script_throughput(cfg: fastlab.TrainConfig, folder: Path) -> float:
    """Median images/s the script prints, run by this Python in a fresh process, outside the repository."""
    path = folder / "run.py"
    path.write_text(fastlab.code(cfg))
    out = subprocess.run([sys.executable, "-I", str(path)], cwd=folder, capture_output=True, text=True, timeout=1800)
    found = re.search(r"^([\d.]+) images/s: median", out.stdout, re.M)
    if out.returncode or not found:
        raise RuntimeError(f"the script failed (exit {out.returncode}): {out.stderr[-2000:]}")
    return float(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", default=None)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    base = fastlab.config_for(args.profile, max_seconds=0.0)
    chosen = configs(base)
    scripts: dict[str, list[float]] = {k: [] for k in chosen}
    runs: dict[str, list[float]] = {k: [] for k in chosen}
    with tempfile.TemporaryDirectory(prefix="fastlab-code-bench-") as tmp:
        for i in range(args.repeats):
            for name, cfg in chosen.items():
                scripts[name].append(script_throughput(cfg, Path(tmp)))
                result = fastlab.run(cfg, progress=False)
                runs[name].append(result.throughput.median)
                print(f"  repeat {i + 1}, {name}: script {scripts[name][-1]:,.0f} images/s, "
                      f"fastlab.run {runs[name][-1]:,.0f} images/s ({result.status})")
    print(f"profile {base.profile}, model {base.model}, {base.steps} timed steps, device {result.env['device_name']}, "
          f"dataset {result.dataset.get('name')}; medians over {args.repeats} repeats (each a median over windows)")
    for name in chosen:
        s, r = Spread.of(scripts[name]), Spread.of(runs[name])
        print(f"{name}: script / fastlab.run = {s.median / r.median:.2f}; {verdict(r, s)}")


if __name__ == "__main__":
    main()
