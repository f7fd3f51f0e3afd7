"""Exercise 11's check against the edits a learner makes: the worked solution, correct edits written other ways, and
wrong edits a learner would make, each with the verdict it must get (issue 49). The check reads the process group,
the module each step called and the collectives backward ran (fastlab.loop_facts), so each case runs its loop for
real, briefly, under smoke (tests/exercise_case_tools.py), in a gloo group of one process on the CPU."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from exercise_case_tools import CFG, DEVICE, few, judged
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel

from fastlab.lessons import technique_code as tc
from fastlab.models import build_model

# ---------------------------------------------------------------- 11: DistributedDataParallel


def given_11(w):
    port = tc.free_port()  # noqa: F841
    torch.manual_seed(0)
    model = build_model(CFG.model).to(DEVICE)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for x, y in w(few):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def solution_11(w):
    port = tc.free_port()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    torch.manual_seed(0)
    model = DistributedDataParallel(build_model(CFG.model).to(DEVICE), device_ids=None)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for x, y in w(few):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss
    dist.destroy_process_group()


def hash_store_optimiser_first_11(w):  # right, written another way: an in-memory store, the optimiser built first
    port = tc.free_port()  # noqa: F841
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        net = build_model(CFG.model).to(DEVICE)
        opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)  # the wrapper trains these same tensors
        model = DistributedDataParallel(net)
        for x, y in w(few):
            with w.step(len(x)) as s:
                loss = F.cross_entropy(model(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                s.loss = loss
    finally:
        dist.destroy_process_group()


def bucket_views_11(w):  # right, written another way: gradients as bucket views
    port = tc.free_port()
    dist.init_process_group(backend="gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    torch.manual_seed(0)
    model = build_model(CFG.model).to(DEVICE)
    model = DistributedDataParallel(model, gradient_as_bucket_view=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for x, y in w(few):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss
    dist.destroy_process_group()


def group_only_11(w):
    port = tc.free_port()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    torch.manual_seed(0)
    model = build_model(CFG.model).to(DEVICE)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for x, y in w(few):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss
    dist.destroy_process_group()


def module_called_11(w):
    port = tc.free_port()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    torch.manual_seed(0)
    model = DistributedDataParallel(build_model(CFG.model).to(DEVICE))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for x, y in w(few):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model.module(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss
    dist.destroy_process_group()


def no_sync_every_step_11(w):
    port = tc.free_port()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    torch.manual_seed(0)
    model = DistributedDataParallel(build_model(CFG.model).to(DEVICE))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for x, y in w(few):
        with w.step(len(x)) as s:
            with model.no_sync():
                loss = F.cross_entropy(model(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
            opt.step()
            s.loss = loss
    dist.destroy_process_group()


def synced_on_the_first_step_only_11(w):
    port = tc.free_port()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    torch.manual_seed(0)
    model = DistributedDataParallel(build_model(CFG.model).to(DEVICE))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    first = True
    for x, y in w(few):
        with w.step(len(x)) as s:
            loss = F.cross_entropy((model if first else model.module)(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss
        first = False
    dist.destroy_process_group()


def group_left_open_11(w):
    port = tc.free_port()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    torch.manual_seed(0)
    model = DistributedDataParallel(build_model(CFG.model).to(DEVICE))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for x, y in w(few):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def comment_only_11(w):
    port = tc.free_port()  # noqa: F841
    torch.manual_seed(0)
    model = build_model(CFG.model).to(DEVICE)  # DistributedDataParallel(model) here
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for x, y in w(few):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


CASES_11 = [  # (the learner's loop, the verdict, words the check must say)
    (solution_11, True, "a process group (gloo, 1 process), the model called through DistributedDataParallel at "
                        "every one of 3 steps"),
    (hash_store_optimiser_first_11, True, "its gradients all-reduced in backward"),
    (bucket_views_11, True, "its gradients all-reduced in backward"),
    (group_only_11, False, "but the model called is TinyNet: no gradient is all-reduced in backward"),
    (module_called_11, False, "model = DistributedDataParallel(model), and call the wrapper, not its .module"),
    (no_sync_every_step_11, False, "but its forward ran under model.no_sync(), so its backward all-reduced nothing"),
    (synced_on_the_first_step_only_11, False, "at 2 of the 2 later steps the model called was TinyNet"),
    (group_left_open_11, False, "the process group was left open after the loop: call dist.destroy_process_group()"),
    (comment_only_11, "unchanged", "The technique's line is missing"),
]


@pytest.mark.parametrize("mine, expected, words", CASES_11, ids=[c[0].__name__ for c in CASES_11])
def test_the_ddp_check_reads_the_all_reduce_in_backward(mine, expected, words, capsys):
    try:
        shown, said = judged(given_11, mine, "ddp", capsys, len(few))
    finally:
        if dist.is_initialized():  # a loop that left its group open: the next case could not start one
            dist.destroy_process_group()
    assert shown == expected and words in said, said
