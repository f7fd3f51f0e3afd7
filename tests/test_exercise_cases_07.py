"""Exercise 07's check against the edits a learner makes: the worked solution, correct edits written other ways, and
wrong edits a learner would make, each with the verdict it must get (issue 49). The check reads which module served
each request and what torch.export fixed in it (fastlab.loop_facts), so each case serves its requests for real,
briefly, under smoke (tests/exercise_case_tools.py)."""

from __future__ import annotations

import pytest
import torch
from exercise_case_tools import CFG, DEVICE, few, judged

from fastlab.models import build_model

# ---------------------------------------------------------------- 07: serve an exported program


def given_07(w):
    torch.manual_seed(0)
    model = build_model(CFG.model).to(DEVICE).eval()
    with torch.inference_mode():
        for x, _ in w(few):
            with w.step(len(x)):
                model(x).argmax(1)


def solution_07(w):
    torch.manual_seed(0)
    model = build_model(CFG.model).to(DEVICE).eval()
    batch = torch.export.Dim("batch", min=1)
    model = torch.export.export(model, (few[0][0],), dynamic_shapes=({0: batch},)).module()
    with torch.inference_mode():
        for x, _ in w(few):
            with w.step(len(x)):
                model(x).argmax(1)


def dim_auto_by_name_07(w):  # right, written another way: the input named, Dim.AUTO, served under another name
    torch.manual_seed(0)
    model = build_model(CFG.model).to(DEVICE).eval()
    program = torch.export.export(model, (few[0][0],), dynamic_shapes={"x": {0: torch.export.Dim.AUTO}})
    served = program.module()
    with torch.inference_mode():
        for x, _ in w(few):
            with w.step(len(x)):
                served(x).argmax(1)


def exported_from_a_small_example_07(w):  # right, written another way: a two-image example, Dim.DYNAMIC, under no_grad
    torch.manual_seed(0)
    model = build_model(CFG.model).to(DEVICE).eval()
    example = few[0][0][:2]
    model = torch.export.export(model, (example,), dynamic_shapes=({0: torch.export.Dim.DYNAMIC},)).module()
    with torch.no_grad():
        for x, _ in w(few):
            with w.step(len(x)):
                model(x).argmax(1)


def eager_still_called_07(w):
    torch.manual_seed(0)
    model = build_model(CFG.model).to(DEVICE).eval()
    batch = torch.export.Dim("batch", min=1)
    program = torch.export.export(model, (few[0][0],), dynamic_shapes=({0: batch},))  # noqa: F841
    with torch.inference_mode():
        for x, _ in w(few):
            with w.step(len(x)):
                model(x).argmax(1)


def compiled_instead_07(w):
    torch.manual_seed(0)
    model = build_model(CFG.model).to(DEVICE).eval()
    model = torch.compile(model)
    with torch.inference_mode():
        for x, _ in w(few):
            with w.step(len(x)):
                model(x).argmax(1)


def static_batch_07(w):
    torch.manual_seed(0)
    model = build_model(CFG.model).to(DEVICE).eval()
    model = torch.export.export(model, (few[0][0],)).module()
    with torch.inference_mode():
        for x, _ in w(few):
            with w.step(len(x)):
                model(x).argmax(1)


def module_made_per_request_07(w):
    torch.manual_seed(0)
    model = build_model(CFG.model).to(DEVICE).eval()
    batch = torch.export.Dim("batch", min=1)
    program = torch.export.export(model, (few[0][0],), dynamic_shapes=({0: batch},))
    with torch.inference_mode():
        for x, _ in w(few):
            with w.step(len(x)):
                program.module()(x).argmax(1)


def exported_per_request_07(w):
    torch.manual_seed(0)
    model = build_model(CFG.model).to(DEVICE).eval()
    batch = torch.export.Dim("batch", min=1)
    with torch.inference_mode():
        for x, _ in w(few):
            with w.step(len(x)):
                served = torch.export.export(model, (x,), dynamic_shapes=({0: batch},)).module()
                served(x).argmax(1)


def exported_before_eval_07(w):
    torch.manual_seed(0)
    model = build_model(CFG.model).to(DEVICE)
    batch = torch.export.Dim("batch", min=1)
    program = torch.export.export(model, (few[0][0],), dynamic_shapes=({0: batch},))
    model.eval()
    model = program.module()
    with torch.inference_mode():
        for x, _ in w(few):
            with w.step(len(x)):
                model(x).argmax(1)


def comment_only_07(w):
    torch.manual_seed(0)
    model = build_model(CFG.model).to(DEVICE).eval()  # export this
    with torch.inference_mode():
        for x, _ in w(few):
            with w.step(len(x)):
                model(x).argmax(1)


CASES_07 = [  # (the learner's loop, the verdict, words the check must say)
    (solution_07, True, "one exported program served every one of 3 requests, its batch dimension dynamic"),
    (dim_auto_by_name_07, True, "one exported program served every one of 3 requests"),
    (exported_from_a_small_example_07, True, "its batch dimension dynamic"),
    (eager_still_called_07, False, "the requests were served by TinyNet, the eager module: serve program.module()"),
    (compiled_instead_07, False, "served by OptimizedModule (torch.compile compiles, it does not export)"),
    (static_batch_07, False, f"exported for batches of {CFG.batch_size} only"),
    (module_made_per_request_07, False, "a new program module at 2 of the 2 later requests"),
    (exported_per_request_07, False, "a new program module at 2 of the 2 later requests"),
    (exported_before_eval_07, False, "exported from the model in train mode: 3 batch norm(s) or dropout(s)"),
    (comment_only_07, "unchanged", "The technique's line is missing"),
]


@pytest.mark.parametrize("mine, expected, words", CASES_07, ids=[c[0].__name__ for c in CASES_07])
def test_the_export_check_reads_the_program_that_served_every_request(mine, expected, words, capsys):
    shown, said = judged(given_07, mine, "export", capsys, len(few))
    assert shown == expected and words in said, said
