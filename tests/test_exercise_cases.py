"""Exercises 02, 03 and 06's checks against the edits a learner makes: the worked solution, correct edits written
other ways, and wrong edits a learner would make, each with the verdict it must get (issue 49). A check reads the
technique by its effect on the loop it watched (fastlab.loop_facts), so each case runs its loop for real, briefly,
under smoke (tests/exercise_case_tools.py)."""

from __future__ import annotations

import math

import pytest
import torch
from exercise_case_tools import CFG, DEVICE, batches, few, judged
from torch.nn import functional as F

from fastlab import exercise
from fastlab.models import build_model

# ---------------------------------------------------------------- 06: AdamW with a cosine schedule


def given_06(w):
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr, weight_decay=5e-4)
    for x, y in w(batches):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def solution_06(w):
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.AdamW(model.parameters(), lr=CFG.lr, weight_decay=1e-2, fused=True)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=len(batches))
    for x, y in w(batches):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            s.loss = loss


def lambda_cosine_06(w):  # right, written another way: the cosine as a LambdaLR, AdamW unfused
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.AdamW(model.parameters(), lr=CFG.lr, weight_decay=0.05)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 0.5 * (1 + math.cos(math.pi * k / len(batches))))
    for x, y in w(batches):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            s.loss = loss


def stepped_after_the_block_06(w):  # right, written another way: stepped outside the timed block, eta_min set
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.AdamW(model.parameters(), lr=CFG.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=len(batches), eta_min=CFG.lr / 100)
    for x, y in w(batches):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss
        sched.step()


def never_stepped_06(w):
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.AdamW(model.parameters(), lr=CFG.lr, weight_decay=1e-2)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=len(batches))  # noqa: F841
    for x, y in w(batches):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def stepped_per_epoch_06(w):
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.AdamW(model.parameters(), lr=CFG.lr, weight_decay=1e-2)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=len(batches))
    for x, y in w(batches):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss
    sched.step()


def t_max_in_epochs_06(w):
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.AdamW(model.parameters(), lr=CFG.lr, weight_decay=1e-2)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=2)  # 2 epochs, stepped every batch
    for x, y in w(batches):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            s.loss = loss


def t_max_far_too_long_06(w):
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.AdamW(model.parameters(), lr=CFG.lr, weight_decay=1e-2)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=100 * len(batches))
    for x, y in w(batches):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            s.loss = loss


def no_weight_decay_06(w):
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.AdamW(model.parameters(), lr=CFG.lr, weight_decay=0)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=len(batches))
    for x, y in w(batches):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            s.loss = loss


def adam_kept_06(w):
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr, weight_decay=1e-2)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=len(batches))
    for x, y in w(batches):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            s.loss = loss


def step_decay_06(w):
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.AdamW(model.parameters(), lr=CFG.lr, weight_decay=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    for x, y in w(batches):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            s.loss = loss


def warm_up_first_06(w):  # a warm-up, then the cosine: the check cannot match it and says so
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.AdamW(model.parameters(), lr=CFG.lr, weight_decay=1e-2)
    warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=2)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=len(batches) - 2)
    sched = torch.optim.lr_scheduler.SequentialLR(opt, [warm, cosine], milestones=[2])
    for x, y in w(batches):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            s.loss = loss


def comment_only_06(w):
    torch.manual_seed(0)
    model = build_model(CFG.model)
    # AdamW and a cosine schedule go here
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr, weight_decay=5e-4)
    for x, y in w(batches):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


CASES_06 = [  # (the learner's loop, the verdict, words the check must say)
    (solution_06, True, "a cosine to 0 over 6 steps"),
    (lambda_cosine_06, True, "a cosine to 0 over 6 steps"),
    (stepped_after_the_block_06, True, "stepped each of 6 steps"),
    (never_stepped_06, False, "a scheduler was built but it did not move; call sched.step() once per optimiser step"),
    (stepped_per_epoch_06, False, "a scheduler was built but it did not move"),
    (t_max_in_epochs_06, False, "reaches its minimum after 2 steps and rises again, in a loop of 6 optimiser steps"),
    (t_max_far_too_long_06, False, "spans 600 steps"),
    (no_weight_decay_06, False, "with weight_decay=0 AdamW decays nothing"),
    (adam_kept_06, False, "Adam(weight_decay=0.01): swap it for torch.optim.AdamW"),
    (step_decay_06, False, "does not follow a cosine"),
    (warm_up_first_06, None, "a warm-up?"),
    (comment_only_06, "unchanged", "The technique's line is missing"),
]


@pytest.mark.parametrize("mine, expected, words", CASES_06, ids=[c[0].__name__ for c in CASES_06])
def test_the_schedule_check_reads_the_learning_rate_over_the_steps(mine, expected, words, capsys):
    shown, said = judged(given_06, mine, "adamw_schedule", capsys, len(batches))
    assert shown == expected and words in said, said


# ---------------------------------------------------------------- 02: autocast, and a GradScaler for fp16


def given_02(w):
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    for x, y in w(few):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def solution_bf16_02(w):
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    scaler = torch.amp.GradScaler("cpu", enabled=False)  # bf16 has fp32's range: no scaling
    for x, y in w(few):
        with w.step(len(x)) as s:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            s.loss = loss


def fp16_with_a_scaler_02(w):  # right, written another way: fp16, so a GradScaler
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    scaler = torch.amp.GradScaler("cpu")
    for x, y in w(few):
        with w.step(len(x)) as s:
            with torch.autocast("cpu", dtype=torch.float16):
                loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            s.loss = loss


class Autocasting(torch.nn.Module):
    """A wrapper whose forward enters autocast: the technique inside the model, not around the call."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.inner(x)


def inside_a_wrapper_02(w):  # right, written another way: autocast entered inside the model's forward
    torch.manual_seed(0)
    model = Autocasting(build_model(CFG.model))
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    for x, y in w(few):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x).float(), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def fp16_without_a_scaler_02(w):
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    for x, y in w(few):
        with w.step(len(x)) as s:
            with torch.autocast("cpu", dtype=torch.float16):
                loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def fp16_scaler_disabled_02(w):
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    for x, y in w(few):
        with w.step(len(x)) as s:
            with torch.autocast("cpu", dtype=torch.float16):
                loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            s.loss = loss


def scaled_but_stepped_by_hand_02(w):
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    scaler = torch.amp.GradScaler("cpu")
    for x, y in w(few):
        with w.step(len(x)) as s:
            with torch.autocast("cpu", dtype=torch.float16):
                loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            opt.step()
            s.loss = loss


def around_backward_and_step_02(w):
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    for x, y in w(few):
        with w.step(len(x)) as s:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            s.loss = loss


def around_the_loss_only_02(w):
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    for x, y in w(few):
        with w.step(len(x)) as s:
            logits = model(x)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(logits, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def autocast_disabled_02(w):
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    for x, y in w(few):
        with w.step(len(x)) as s:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):
                loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def comment_only_02(w):
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    for x, y in w(few):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)  # TODO: autocast
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


@torch.autocast("cpu", dtype=torch.bfloat16)
def decorated_loop_02(w):  # the whole loop under autocast: backward and the step too
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    for x, y in w(few):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


CASES_02 = [
    (solution_bf16_02, True, "the forward under autocast to bfloat16, backward and the optimiser step outside it"),
    (fp16_with_a_scaler_02, True, "the loss scaled by a GradScaler and unscaled before the step"),
    (inside_a_wrapper_02, True, "the forward under autocast to bfloat16"),
    (fp16_without_a_scaler_02, False, "with no GradScaler: fp16 gradients underflow to zero unscaled"),
    (fp16_scaler_disabled_02, False, "with no GradScaler"),
    (scaled_but_stepped_by_hand_02, False, "the optimiser stepped on the scaled gradients: call scaler.step(opt)"),
    (around_backward_and_step_02, False, "and backward inside it too: end the `with torch.autocast(...)` block"),
    (around_the_loss_only_02, False, "the forward in float32: no autocast reached the model's modules"),
    (autocast_disabled_02, False, "the forward in float32"),
    (decorated_loop_02, False, "and backward inside it too"),
    (comment_only_02, "unchanged", "The technique's line is missing"),
]


@pytest.mark.parametrize("mine, expected, words", CASES_02, ids=[c[0].__name__ for c in CASES_02])
def test_the_autocast_check_reads_where_autocast_ran_and_whether_fp16_was_scaled(mine, expected, words, capsys):
    shown, said = judged(given_02, mine, "autocast", capsys, len(few))
    assert shown == expected and words in said, said


# ---------------------------------------------------------------- 03: channels_last

CL = torch.channels_last


def given_03(w):
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    for x, y in w(few):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def solution_03(w):
    torch.manual_seed(0)
    model = build_model(CFG.model).to(DEVICE, memory_format=torch.channels_last)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    for x, y in w(few):
        with w.step(len(x)) as s:
            x = x.contiguous(memory_format=torch.channels_last)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def with_to_03(w):  # right, written another way: .to(memory_format=...) on both
    torch.manual_seed(0)
    model = build_model(CFG.model)
    model.to(memory_format=CL)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    for x, y in w(few):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x.to(memory_format=CL)), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def batches_converted_first_03(w):  # right, written another way: the batches converted once, the model after opt
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    model.to(memory_format=CL)  # in place: the optimiser holds the same parameters
    ready = [(x.contiguous(memory_format=CL), y) for x, y in few]
    for x, y in w(ready):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def model_only_03(w):
    torch.manual_seed(0)
    model = build_model(CFG.model).to(DEVICE, memory_format=torch.channels_last)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    for x, y in w(few):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def input_only_03(w):
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    for x, y in w(few):
        with w.step(len(x)) as s:
            x = x.contiguous(memory_format=torch.channels_last)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def result_thrown_away_03(w):
    torch.manual_seed(0)
    model = build_model(CFG.model).to(DEVICE, memory_format=torch.channels_last)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    for x, y in w(few):
        with w.step(len(x)) as s:
            x.contiguous(memory_format=torch.channels_last)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def contiguous_format_asked_03(w):
    torch.manual_seed(0)
    model = build_model(CFG.model).to(DEVICE, memory_format=torch.contiguous_format)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    for x, y in w(few):
        with w.step(len(x)) as s:
            x = x.contiguous(memory_format=torch.contiguous_format)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def comment_only_03(w):
    torch.manual_seed(0)
    model = build_model(CFG.model)  # channels_last?
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    for x, y in w(few):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


CASES_03 = [
    (solution_03, True, "convolutions got channels_last input"),
    (with_to_03, True, "convolutions got channels_last input"),
    (batches_converted_first_03, True, "convolutions got channels_last input"),
    (model_only_03, False, "x = x.contiguous(memory_format=torch.channels_last), and use the x it returns"),
    (input_only_03, False, "model = model.to(device, memory_format=torch.channels_last)"),
    (result_thrown_away_03, False, "the batch reaching the first convolution is NCHW"),
    (contiguous_format_asked_03, False, "model = model.to(device, memory_format=torch.channels_last)"),
    (comment_only_03, "unchanged", "The technique's line is missing"),
]


@pytest.mark.parametrize("mine, expected, words", CASES_03, ids=[c[0].__name__ for c in CASES_03])
def test_the_channels_last_check_reads_the_layout_reaching_every_convolution(mine, expected, words, capsys):
    shown, said = judged(given_03, mine, "channels_last", capsys, len(few))
    assert shown == expected and words in said, said


def test_a_decorator_is_an_edit_and_a_comment_is_not():
    assert not exercise.unchanged(given_02, decorated_loop_02) and exercise.unchanged(given_02, comment_only_02)
