"""Benchmark (not a test): does a panel's run time like the same run started from a notebook cell?

Both go to a fresh process with the same spec (tests/test_widgets.py checks that), so they should. Measured
here: in one Python process (a kernel), the same config run from a panel's Run button and from the main thread
after torch ops there, alternating (which one goes first alternates too, so drift falls on both), `--pairs` of
each; printed: each arm's medians, the ratio of each pair and the noise rule's word. `--sessions` repeats that
in fresh Python processes, because what one process shows need not hold in the next.

Seen on a 2-core Xeon (2026-12-02, smoke config): about one session in three leaned one way on every pair,
either way (0.84x to 1.17x); CI once read 1.2-1.5x on all nine pairs. The cause was memory layout: children forked
from one server lay out alike, and the panel's label is longer than "cell". Two main-thread runs differing only
by their label's length (`--against label`, FASTLAB_LAYOUT=fixed) leaned in 9 of 17 sessions (0.78x to 1.26x);
with each child's layout shifted at random (fastlab.isolation._shift_layout, the default) in 2 of 10, and the
sessions' median ratios stayed within 0.91x-1.10x, about the noise of a six-pair median.

    python tests/benchmark_panel_vs_cell.py [--profile smoke] [--pairs 6] [--sessions 3] [--against panel|label]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys

import torch


def one_session(profile: str, pairs: int, against: str) -> None:
    import fastlab
    from fastlab.measure import Spread
    from fastlab.verdicts import is_noise
    from fastlab.widgets import Panel

    cfg = fastlab.config_for(profile)
    a = torch.randn(256, 256)  # what any notebook cell that touches a tensor does to the main thread
    for _ in range(30):
        a = torch.tanh(a @ a)
    panel = Panel(cfg, {"channels_last": None}, pairing="none", advice=False, key="panel-vs-cell")
    longer = "cell" + "x" * random.randrange(1, 200)  # one length for the whole session

    def from_panel() -> float:
        if against == "label":  # the main thread too, only the label longer
            return fastlab.run(cfg, label=longer, progress=False).throughput.median
        panel.run_button.click()
        panel.wait(600)
        return panel.results[-1].throughput.median

    cell, from_panels = [], []
    for i in range(pairs):
        if i % 2:
            from_panels.append(from_panel())
        cell.append(fastlab.run(cfg, label="cell", progress=False).throughput.median)
        if not i % 2:
            from_panels.append(from_panel())
    ratios = [p / c for c, p in zip(cell, from_panels)]
    same = is_noise(Spread.of(cell), Spread.of(from_panels)) or min(ratios) <= 1.0 <= max(ratios)
    print(f"cell {statistics.median(cell):,.0f} images/s {[round(c) for c in cell]}; "
          f"{against} {statistics.median(from_panels):,.0f} images/s {[round(p) for p in from_panels]}; "
          f"{against}/cell {statistics.median(from_panels) / statistics.median(cell):.2f}x "
          f"(pairs {[round(r, 2) for r in ratios]}): {'noise' if same else 'they differ'}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="smoke")
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument("--against", choices=("panel", "label"), default="panel",
                        help="label: a main-thread run whose label is longer, instead of a panel's run")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a session, run by the others
    args = parser.parse_args()
    if args.one:
        return one_session(args.profile, args.pairs, args.against)
    for n in range(args.sessions):
        print(f"session {n + 1} of {args.sessions}: ", end="", flush=True)
        subprocess.run([sys.executable, __file__, "--one", "--profile", args.profile, "--pairs", str(args.pairs),
                        "--against", args.against],
                       check=True, env={**os.environ, "MPLBACKEND": "Agg"})


if __name__ == "__main__":
    main()
