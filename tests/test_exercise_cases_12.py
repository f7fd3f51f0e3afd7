"""Exercise 12's check against the edits a learner makes (issue 49): the worked solution, correct edits written other
ways, and wrong edits a learner would make, each with the verdict it must get. The check reads the technique by its
effect on the step it watched (fastlab.loop_facts): which of the pieces the loop called (its blocks, then its head)
ran again in backward, which kept their activations instead, whether the forward was cut into more than one
segment, and whether every parameter got its gradient (a reentrant checkpoint on an input that does not require grad
silently loses its block's). Each case runs its loop for real, briefly, under smoke (tests/exercise_case_tools.py)."""

from __future__ import annotations

import warnings

import pytest
import torch
from exercise_case_tools import CFG, few, judged
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

from fastlab.lessons import technique_code as tc
from fastlab.models import build_model


def given_12(w):
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    blocks, head = tc.blocks_and_head(model)
    for x, y in w(few):
        with w.step(len(x)) as s:
            h = x
            for block in blocks:
                h = block(h)
            loss = F.cross_entropy(head(h), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def solution_12(w):
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    blocks, head = tc.blocks_and_head(model)
    for x, y in w(few):
        with w.step(len(x)) as s:
            h = x
            for block in blocks:
                h = checkpoint(block, h, use_reentrant=False)  # keep h only; recompute block(h) in backward
            loss = F.cross_entropy(head(h), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def checkpoint_sequential_12(w):  # right, written another way: one segment a block (the last block runs plain)
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    blocks, head = tc.blocks_and_head(model)
    for x, y in w(few):
        with w.step(len(x)) as s:
            h = checkpoint_sequential(blocks, len(blocks), x, use_reentrant=False)
            loss = F.cross_entropy(head(h), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


class Checkpointed(nn.Module):
    """A block whose own forward checkpoints it: the technique inside the module, not around the call."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.block, h, use_reentrant=False)


def wrapped_blocks_12(w):  # right, written another way: each block wrapped in a module that checkpoints it
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    blocks, head = tc.blocks_and_head(model)
    blocks = [Checkpointed(block) for block in blocks]
    for x, y in w(few):
        with w.step(len(x)) as s:
            h = x
            for block in blocks:
                h = block(h)
            loss = F.cross_entropy(head(h), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def reentrant_on_an_input_that_requires_grad_12(w):  # right, written another way: reentrant, its input made to need grad
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    blocks, head = tc.blocks_and_head(model)
    for x, y in w(few):
        with w.step(len(x)) as s:
            h = x.detach().requires_grad_()
            for block in blocks:
                h = checkpoint(block, h, use_reentrant=True)
            loss = F.cross_entropy(head(h), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def use_reentrant_left_out_12(w):  # the default is reentrant: x needs no grad, so no block gets a gradient
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    blocks, head = tc.blocks_and_head(model)
    for x, y in w(few):
        with w.step(len(x)) as s:
            h = x
            for block in blocks:
                h = checkpoint(block, h)
            loss = F.cross_entropy(head(h), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def every_other_block_reentrant_12(w):  # the first block's gradients lost; the later checkpoints do recompute
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    blocks, head = tc.blocks_and_head(model)
    for x, y in w(few):
        with w.step(len(x)) as s:
            h = x
            for i, block in enumerate(blocks):
                h = checkpoint(block, h, use_reentrant=True) if i % 2 == 0 else block(h)
            loss = F.cross_entropy(head(h), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def first_block_only_12(w):
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    blocks, head = tc.blocks_and_head(model)
    for x, y in w(few):
        with w.step(len(x)) as s:
            h = checkpoint(blocks[0], x, use_reentrant=False)
            for block in blocks[1:]:
                h = block(h)
            loss = F.cross_entropy(head(h), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def whole_model_one_segment_12(w):  # one segment: backward recomputes all of it at once
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for x, y in w(few):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(checkpoint(model, x, use_reentrant=False), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def result_not_used_12(w):  # the checkpoint's output thrown away: the block runs again, plainly
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    blocks, head = tc.blocks_and_head(model)
    for x, y in w(few):
        with w.step(len(x)) as s:
            h = x
            for block in blocks:
                checkpoint(block, h, use_reentrant=False)
                h = block(h)
            loss = F.cross_entropy(head(h), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def comment_only_12(w):
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    blocks, head = tc.blocks_and_head(model)
    for x, y in w(few):
        with w.step(len(x)) as s:
            h = x
            for block in blocks:
                h = block(h)  # checkpoint(block, h, use_reentrant=False)
            loss = F.cross_entropy(head(h), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


CASES_12 = [  # (the learner's loop, the verdict, words the check must say)
    (solution_12, True, "11 of 15 pieces ran again in backward; the rest (4) keep no activations of their own; every "
                        "parameter got a gradient"),
    (checkpoint_sequential_12, True, "11 of 15 pieces ran again in backward"),
    (wrapped_blocks_12, True, "11 of 15 pieces ran again in backward"),
    (reentrant_on_an_input_that_requires_grad_12, True, "14 of 15 pieces ran again in backward"),
    (use_reentrant_left_out_12, False, "9 of 11 parameter tensors got no gradient: #1 Conv2d, #2 BatchNorm2d, #3 "
                                       "GELU... ran without a graph and never again in backward: a checkpoint(..., "
                                       "use_reentrant=True), the default where use_reentrant is not given"),
    (every_other_block_reentrant_12, False, "1 of 11 parameter tensors got no gradient: #1 Conv2d ran without a graph"),
    (first_block_only_12, False, "1 of 15 pieces ran again in backward; not checkpointed, their activations kept: "
                                 "#2 BatchNorm2d, #3 GELU, #4 MaxPool2d...: checkpoint every block"),
    (whole_model_one_segment_12, False, "one checkpointed segment holding the whole forward (#1 TinyNet)"),
    (result_not_used_12, False, "no piece's forward ran again in backward (29 pieces called)"),
    (comment_only_12, "unchanged", "The technique's line is missing"),
]


@pytest.mark.parametrize("mine, expected, words", CASES_12, ids=[c[0].__name__ for c in CASES_12])
def test_the_checkpoint_check_reads_every_piece_and_every_gradient(mine, expected, words, capsys):
    with warnings.catch_warnings():  # a reentrant checkpoint warns of what the check says in the learner's terms
        warnings.simplefilter("ignore", UserWarning)
        shown, said = judged(given_12, mine, "checkpoint", capsys, len(few))
    assert shown == expected and words in said, said
