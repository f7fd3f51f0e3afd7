"""Exercise 10's check against the edits a learner makes (issue 49): the worked solution, correct edits written other
ways, and wrong edits a learner would make, each with the verdict it must get. The check reads the technique by its
effect on the loop it watched (fastlab.loop_facts): where each evaluation forward ran, inside a `with w.paused()`
block (off the clock), between the steps on the clock, or inside a step; a pause around something else counts for
nothing. Each case runs its loop for real, briefly, under smoke (tests/exercise_case_tools.py), on the notebook's
own small model."""

from __future__ import annotations

import pytest
import torch
from exercise_case_tools import DEVICE, batches, judged
from torch import nn
from torch.nn import functional as F

import fastlab

device = DEVICE
x_val, y_val = batches[0]  # stands in for a held-out batch, as the notebook's does


def small_model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
                         nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)).to(device)


def given_10(w):
    torch.manual_seed(0)
    model = small_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step, (x, y) in enumerate(w(batches)):
        with w.step(len(x)) as s:
            x, y = x.to(device), y.to(device)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss
        if step % 2 == 1:  # a look at the held-out batch, between steps
            with torch.no_grad():
                held_out = F.cross_entropy(model(x_val.to(device)), y_val.to(device))  # noqa: F841


def solution_10(w):
    torch.manual_seed(0)
    model = small_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step, (x, y) in enumerate(w(batches)):
        with w.step(len(x)) as s:
            x, y = x.to(device), y.to(device)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss
        if step % 2 == 1:
            with w.paused(), torch.no_grad():  # not training: kept off the clock
                held_out = F.cross_entropy(model(x_val.to(device)), y_val.to(device))  # noqa: F841


def paused_with_accuracy_10(w):  # right, written another way: the pause records the held-out accuracy
    torch.manual_seed(0)
    model = small_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step, (x, y) in enumerate(w(batches)):
        with w.step(len(x)) as s:
            x, y = x.to(device), y.to(device)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss
        if step % 2 == 1:
            with w.paused() as p:
                with torch.no_grad():
                    logits = model(x_val.to(device))
                p.accuracy = (logits.argmax(1) == y_val.to(device)).float().mean().item()


def paused_around_the_if_10(w):  # right, written another way: every step pauses, the evaluation inside
    torch.manual_seed(0)
    model = small_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step, (x, y) in enumerate(w(batches)):
        with w.step(len(x)) as s:
            x, y = x.to(device), y.to(device)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss
        with w.paused():
            if step % 2 == 1:
                with torch.no_grad():
                    held_out = F.cross_entropy(model(x_val.to(device)), y_val.to(device))  # noqa: F841


def final_evaluation_paused_10(w):  # a pause around a last evaluation after the loop: the loop's own stay timed
    torch.manual_seed(0)
    model = small_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step, (x, y) in enumerate(w(batches)):
        with w.step(len(x)) as s:
            x, y = x.to(device), y.to(device)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss
        if step % 2 == 1:
            with torch.no_grad():
                held_out = F.cross_entropy(model(x_val.to(device)), y_val.to(device))  # noqa: F841
    with w.paused(), torch.no_grad():
        held_out = F.cross_entropy(model(x_val.to(device)), y_val.to(device))  # noqa: F841


def pause_around_the_copy_only_10(w):  # the pause holds the copy to the device; the forward runs after it
    torch.manual_seed(0)
    model = small_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step, (x, y) in enumerate(w(batches)):
        with w.step(len(x)) as s:
            x, y = x.to(device), y.to(device)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss
        if step % 2 == 1:
            with w.paused():
                xv, yv = x_val.to(device), y_val.to(device)
            with torch.no_grad():
                held_out = F.cross_entropy(model(xv), yv)  # noqa: F841


def paused_called_not_entered_10(w):  # w.paused() called as a statement: a context manager never entered
    torch.manual_seed(0)
    model = small_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step, (x, y) in enumerate(w(batches)):
        with w.step(len(x)) as s:
            x, y = x.to(device), y.to(device)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss
        if step % 2 == 1:
            w.paused()
            with torch.no_grad():
                held_out = F.cross_entropy(model(x_val.to(device)), y_val.to(device))  # noqa: F841


def evaluation_moved_into_the_step_10(w):  # inside the step: timed as training
    torch.manual_seed(0)
    model = small_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step, (x, y) in enumerate(w(batches)):
        with w.step(len(x)) as s:
            x, y = x.to(device), y.to(device)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss
            if step % 2 == 1:
                with torch.no_grad():
                    held_out = F.cross_entropy(model(x_val.to(device)), y_val.to(device))  # noqa: F841


def evaluation_removed_10(w):  # nothing left to pause: whether a pause would hold it cannot be seen
    torch.manual_seed(0)
    model = small_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for x, y in w(batches):
        with w.step(len(x)) as s:
            x, y = x.to(device), y.to(device)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def comment_only_10(w):
    torch.manual_seed(0)
    model = small_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step, (x, y) in enumerate(w(batches)):
        with w.step(len(x)) as s:
            x, y = x.to(device), y.to(device)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss
        if step % 2 == 1:  # TODO: w.paused()
            with torch.no_grad():
                held_out = F.cross_entropy(model(x_val.to(device)), y_val.to(device))  # noqa: F841


CASES_10 = [  # (the learner's loop, the verdict, words the check must say)
    (solution_10, True, "all 3 evaluation forwards ran inside w.paused() (3 block(s)), off the clock"),
    (paused_with_accuracy_10, True, "all 3 evaluation forwards ran inside w.paused()"),
    (paused_around_the_if_10, True, "all 3 evaluation forwards ran inside w.paused() (6 block(s))"),
    (final_evaluation_paused_10, False, "3 of 4 evaluation forwards ran on the clock between the steps (1 inside "
                                        "w.paused()): put `with w.paused():` around the evaluation inside the loop"),
    (pause_around_the_copy_only_10, False, "3 of 3 evaluation forwards ran on the clock between the steps (0 inside "
                                           "w.paused())"),
    (paused_called_not_entered_10, False, "3 of 3 evaluation forwards ran on the clock"),
    (evaluation_moved_into_the_step_10, False, "3 of 3 evaluation forwards ran inside a `with w.step(...)` block, "
                                               "timed as training"),
    (evaluation_removed_10, None, "no evaluation forward"),
    (comment_only_10, "unchanged", "The technique's line is missing"),
]


@pytest.mark.parametrize("mine, expected, words", CASES_10, ids=[c[0].__name__ for c in CASES_10])
def test_the_pause_check_reads_where_every_evaluation_ran(mine, expected, words, capsys):
    shown, said = judged(given_10, mine, "paused", capsys, len(batches))
    assert shown == expected and words in said, said


def test_a_training_step_inside_a_pause_is_still_refused():
    w = fastlab.watch("step inside a pause", facts=True)
    with pytest.raises(RuntimeError, match=r"inside a `with w.paused\(\)` block"), w.paused():
        with w.step(len(x_val)):
            pass
