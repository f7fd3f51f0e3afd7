"""Exercise 04's check (technique "batch_size") against the edits a learner makes: the worked solution, correct edits
written other ways, and wrong edits a learner would make, each with the verdict it must get (issue 49). The check
reads the learning rate of every optimiser step (a warm-up starts low and counts by the rate it reaches) against the
images a step: Adam's square-root rule, so each case runs its loop for real, briefly."""

from __future__ import annotations

import pytest
import torch
from exercise_case_tools import CFG, DEVICE, judged
from torch.nn import functional as F

from fastlab.data import make_synthetic
from fastlab.models import build_model

_images, _labels = make_synthetic(16 * CFG.batch_size)  # 16 batches as given, 4 four times as large
x_all = (torch.from_numpy(_images).permute(0, 3, 1, 2).contiguous().float() / 255).to(DEVICE)  # NCHW: no technique
y_all = torch.from_numpy(_labels).to(DEVICE)
STEPS = 4  # the four-times batch's steps


def given_04(w):
    torch.manual_seed(0)
    batch_size, lr = CFG.batch_size, CFG.lr
    model = build_model(CFG.model).to(DEVICE)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for x, y in w(zip(x_all.split(batch_size), y_all.split(batch_size))):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def solution_04(w):
    torch.manual_seed(0)
    batch_size, lr = 4 * CFG.batch_size, CFG.lr * 4 ** 0.5  # Adam: the square-root rule
    model = build_model(CFG.model).to(DEVICE)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for x, y in w(zip(x_all.split(batch_size), y_all.split(batch_size))):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def twice_the_batch_04(w):  # right, written another way: twice the batch, the rate by the square root of 2
    torch.manual_seed(0)
    batch_size, lr = 2 * CFG.batch_size, CFG.lr * 1.41
    model = build_model(CFG.model).to(DEVICE)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for x, y in w(zip(x_all.split(batch_size), y_all.split(batch_size))):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def warmed_up_04(w):  # right, written another way: a two-step warm-up from a quarter of the scaled rate
    torch.manual_seed(0)
    batch_size, lr = 4 * CFG.batch_size, CFG.lr * 2
    model = build_model(CFG.model).to(DEVICE)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.25, total_iters=2)
    for x, y in w(zip(x_all.split(batch_size), y_all.split(batch_size))):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            warm.step()
            s.loss = loss


def lr_left_alone_04(w):
    torch.manual_seed(0)
    batch_size, lr = 4 * CFG.batch_size, CFG.lr
    model = build_model(CFG.model).to(DEVICE)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for x, y in w(zip(x_all.split(batch_size), y_all.split(batch_size))):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def linear_rule_04(w):  # SGD's linear rule, with Adam
    torch.manual_seed(0)
    batch_size, lr = 4 * CFG.batch_size, CFG.lr * 4
    model = build_model(CFG.model).to(DEVICE)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for x, y in w(zip(x_all.split(batch_size), y_all.split(batch_size))):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def lr_scaled_down_04(w):  # scaled the wrong way
    torch.manual_seed(0)
    batch_size, lr = 4 * CFG.batch_size, CFG.lr / 4 ** 0.5
    model = build_model(CFG.model).to(DEVICE)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for x, y in w(zip(x_all.split(batch_size), y_all.split(batch_size))):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def lr_only_04(w):  # the rate rescaled, the batch left as given
    torch.manual_seed(0)
    batch_size, lr = CFG.batch_size, CFG.lr * 4 ** 0.5
    model = build_model(CFG.model).to(DEVICE)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for x, y in w(zip(x_all.split(batch_size), y_all.split(batch_size))):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def accumulated_04(w):  # four batches' gradients accumulated per optimiser step: the model still sees 32 at a time
    torch.manual_seed(0)
    batch_size, lr = CFG.batch_size, CFG.lr * 4 ** 0.5
    model = build_model(CFG.model).to(DEVICE)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for i, (x, y) in enumerate(w(zip(x_all.split(batch_size), y_all.split(batch_size)))):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            (loss / 4).backward()
            if i % 4 == 3:
                opt.step()
                opt.zero_grad(set_to_none=True)
            s.loss = loss


def warm_up_longer_than_the_loop_04(w):  # still warming up at the last step: the rate it reaches is not seen
    torch.manual_seed(0)
    batch_size, lr = 4 * CFG.batch_size, CFG.lr * 2
    model = build_model(CFG.model).to(DEVICE)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=10)
    for x, y in w(zip(x_all.split(batch_size), y_all.split(batch_size))):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            warm.step()
            s.loss = loss


def comment_only_04(w):
    torch.manual_seed(0)
    batch_size, lr = CFG.batch_size, CFG.lr  # 4x the batch, sqrt(4)x the rate?
    model = build_model(CFG.model).to(DEVICE)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for x, y in w(zip(x_all.split(batch_size), y_all.split(batch_size))):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


CASES_04 = [  # (the learner's loop, the verdict, words the check must say)
    (solution_04, True, "the square-root rule's 2.00x"),
    (twice_the_batch_04, True, "the square-root rule's 1.41x"),
    (warmed_up_04, True, "warmed up from 0.0015 over 2 optimiser steps"),
    (lr_left_alone_04, False, "1.00x the given 0.003 (left as given): for Adam scale it by the square root"),
    (linear_rule_04, False, "(scaled linearly, SGD's rule): for Adam scale it by the square root of the batch's"),
    (lr_scaled_down_04, False, "(lowered): for Adam scale it by the square root"),
    (lr_only_04, False, "the batch did not grow"),
    (accumulated_04, False, "the optimiser stepped 4 times in 16 steps"),
    (warm_up_longer_than_the_loop_04, None, "a warm-up?"),
    (comment_only_04, "unchanged", "The technique's line is missing"),
]


@pytest.mark.parametrize("mine, expected, words", CASES_04, ids=[c[0].__name__ for c in CASES_04])
def test_the_batch_size_check_reads_the_learning_rate_against_the_batch(mine, expected, words, capsys):
    shown, said = judged(given_04, mine, "batch_size", capsys, STEPS)
    assert shown == expected and words in said, said
