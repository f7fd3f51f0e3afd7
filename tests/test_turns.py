"""One interleaving: every A/B schedule in fastlab takes its order from fastlab.verdicts.turns."""

from __future__ import annotations

import ast
from pathlib import Path

import fastlab
from fastlab.verdicts import turns

PACKAGE = Path(fastlab.__file__).parent


def test_turns_alternate_the_order_each_round():
    assert list(turns(2, 3)) == [(0, 0), (0, 1), (1, 1), (1, 0), (2, 0), (2, 1)]
    assert [i for _, i in turns(3, 2)] == [0, 1, 2, 2, 1, 0]


def test_no_schedule_of_its_own_outside_turns():
    """An order flipped by hand (`reversed(...)` chosen by a round's parity) is a second interleaving function."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and isinstance(node.right, ast.Constant) \
                    and node.right.value == 2 and path.name != "verdicts.py":
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not found, found


def test_fastlab_verify_runs_its_sides_in_turns():
    from fastlab.advisor import verify
    from tests.test_advise import cpu_naive_result

    order: list[str] = []

    def runner(cfg, label, **kwargs):
        order.append(label.split(" #")[0])
        r = fastlab.RunResult(config=cfg.to_dict(), label=label, window_throughput=[100.0, 101.0, 99.0],
                              eval_accuracy=0.5, env={"device_type": "cpu"})
        return r

    verify(cpu_naive_result(), runner=runner, repeats=3)
    assert order[0] == order[3] == order[4] and order[1] == order[2] == order[5] and order[0] != order[1]
