"""Exercise 05's check against the edits a learner makes (issue 49): the worked solution, correct edits written other
ways, and wrong edits a learner would make, each with the verdict it must get. The check reads the technique by its
effect on the loop it watched (fastlab.loop_facts): whether each evaluation forward, in a step or between steps,
recorded a graph, and whether each training step's graph was released two steps later (a running total that keeps
`loss` holds them all). Each case runs its loop for real, briefly, under smoke (tests/exercise_case_tools.py)."""

from __future__ import annotations

import pytest
import torch
from exercise_case_tools import CFG, batches, judged
from torch.nn import functional as F

from fastlab.models import build_model

X_VAL, Y_VAL = batches[0]  # stands in for a held-out batch, as the notebook's does


def given_05(w):
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    total_loss = 0.0
    for step, (x, y) in enumerate(w(batches)):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total_loss += loss  # the running loss
            if step % 2 == 0:  # a validation batch
                model.eval()
                val_loss = F.cross_entropy(model(X_VAL), Y_VAL)  # noqa: F841
                model.train()
            s.loss = loss
    return total_loss


def solution_05(w):
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    total_loss = 0.0
    for step, (x, y) in enumerate(w(batches)):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total_loss += loss.detach()  # the running loss, without the graphs
            if step % 2 == 0:
                model.eval()
                with torch.no_grad():  # nothing recorded for a backward that never comes
                    val_loss = F.cross_entropy(model(X_VAL), Y_VAL)  # noqa: F841
                model.train()
            s.loss = loss
    return total_loss.item()


def inference_mode_05(w):  # right, written another way: inference_mode, and the total rebuilt from detached losses
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    total_loss = torch.zeros(())
    for step, (x, y) in enumerate(w(batches)):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total_loss = total_loss + loss.detach()
            if step % 2 == 0:
                model.eval()
                with torch.inference_mode():
                    val_loss = F.cross_entropy(model(X_VAL), Y_VAL)  # noqa: F841
                model.train()
            s.loss = loss
    return total_loss.item()


def evaluate_helper_05(w):  # right, written another way: a @torch.no_grad() helper, the losses kept detached in a list
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)

    @torch.no_grad()
    def evaluate():
        model.eval()
        out = F.cross_entropy(model(X_VAL), Y_VAL)
        model.train()
        return out

    losses = []
    for step, (x, y) in enumerate(w(batches)):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
            if step % 2 == 0:
                val_loss = evaluate()  # noqa: F841
            s.loss = loss
    return torch.stack(losses).sum().item()


def total_under_no_grad_05(w):  # right, written another way: the running total added under no_grad too
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    total_loss = 0.0
    for step, (x, y) in enumerate(w(batches)):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            with torch.no_grad():
                total_loss += loss
                if step % 2 == 0:
                    model.eval()
                    val_loss = F.cross_entropy(model(X_VAL), Y_VAL)  # noqa: F841
                    model.train()
            s.loss = loss
    return total_loss


def evaluation_after_the_block_05(w):  # right: the evaluation between the steps, outside the first step's block
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    total_loss = 0.0
    for step, (x, y) in enumerate(w(batches)):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total_loss += loss.detach()
            s.loss = loss
        if step % 2 == 0:
            model.eval()
            with torch.no_grad():
                val_loss = F.cross_entropy(model(X_VAL), Y_VAL)  # noqa: F841
            model.train()
    return total_loss


def no_grad_only_05(w):  # the running total still keeps every step's graph
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    total_loss = 0.0
    for step, (x, y) in enumerate(w(batches)):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total_loss += loss
            if step % 2 == 0:
                model.eval()
                with torch.no_grad():
                    val_loss = F.cross_entropy(model(X_VAL), Y_VAL)  # noqa: F841
                model.train()
            s.loss = loss
    return total_loss


def losses_listed_05(w):  # the losses kept in a list, each with its graph
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    losses = []
    for step, (x, y) in enumerate(w(batches)):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss)
            if step % 2 == 0:
                model.eval()
                with torch.no_grad():
                    val_loss = F.cross_entropy(model(X_VAL), Y_VAL)  # noqa: F841
                model.train()
            s.loss = loss
    return sum(losses)


def detach_only_05(w):  # the evaluation still records a graph
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    total_loss = 0.0
    for step, (x, y) in enumerate(w(batches)):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total_loss += loss.detach()
            if step % 2 == 0:
                model.eval()
                val_loss = F.cross_entropy(model(X_VAL), Y_VAL)  # noqa: F841
                model.train()
            s.loss = loss
    return total_loss


def output_detached_05(w):  # detach after the forward: its graph was recorded all the same
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    total_loss = 0.0
    for step, (x, y) in enumerate(w(batches)):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total_loss += loss.detach()
            if step % 2 == 0:
                model.eval()
                val_loss = F.cross_entropy(model(X_VAL).detach(), Y_VAL)  # noqa: F841
                model.train()
            s.loss = loss
    return total_loss


def evaluation_after_the_block_with_grad_05(w):  # moved out of the step, still recording a graph
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    total_loss = 0.0
    for step, (x, y) in enumerate(w(batches)):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total_loss += loss.detach()
            s.loss = loss
        if step % 2 == 0:
            model.eval()
            val_loss = F.cross_entropy(model(X_VAL), Y_VAL)  # noqa: F841
            model.train()
    return total_loss


def evaluation_removed_05(w):  # no evaluation left: whether it would run under no_grad cannot be seen
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    total_loss = 0.0
    for x, y in w(batches):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total_loss += loss.detach()
            s.loss = loss
    return total_loss


def comment_only_05(w):
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    total_loss = 0.0
    for step, (x, y) in enumerate(w(batches)):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total_loss += loss  # detach?
            if step % 2 == 0:
                model.eval()  # no_grad here
                val_loss = F.cross_entropy(model(X_VAL), Y_VAL)  # noqa: F841
                model.train()
            s.loss = loss
    return total_loss


CASES_05 = [  # (the learner's loop, the verdict, words the check must say)
    (solution_05, True, "3 evaluation forwards recorded no graph, and no training step's graph was held"),
    (inference_mode_05, True, "3 evaluation forwards recorded no graph"),
    (evaluate_helper_05, True, "3 evaluation forwards recorded no graph"),
    (total_under_no_grad_05, True, "no training step's graph was held two steps later (4 steps checked)"),
    (evaluation_after_the_block_05, True, "3 evaluation forwards recorded no graph"),
    (no_grad_only_05, False, "the graphs of 4 of 4 training steps were still held two steps later: a running total "
                             "or a list keeps each step's loss with its graph"),
    (losses_listed_05, False, "the graphs of 4 of 4 training steps were still held"),
    (detach_only_05, False, "3 of 3 evaluation forwards recorded a graph; no training step's graph was held two "
                            "steps later (4 steps checked): wrap the evaluation in `with torch.no_grad():`"),
    (output_detached_05, False, "3 of 3 evaluation forwards recorded a graph"),
    (evaluation_after_the_block_with_grad_05, False, "3 of 3 evaluation forwards recorded a graph"),
    (evaluation_removed_05, None, "no evaluation forward"),
    (comment_only_05, "unchanged", "The technique's line is missing"),
]


@pytest.mark.parametrize("mine, expected, words", CASES_05, ids=[c[0].__name__ for c in CASES_05])
def test_the_no_grad_check_reads_every_evaluation_and_whether_each_step_graph_is_released(mine, expected, words,
                                                                                          capsys):
    shown, said = judged(given_05, mine, "no_grad", capsys, len(batches))
    assert shown == expected and words in said, said
