"""Exercise 01's check (technique "workers") against the edits a learner makes: the worked solution, correct edits
written other ways, and wrong edits a learner would make, each with the verdict it must get (issue 49). The check
reads where the batches the loop trained on were made (fastlab.loop_facts.made_in: a DataLoader worker hands its
batch over in shared memory), never the loader's settings alone, so each case runs its loop for real, briefly."""

from __future__ import annotations

import pytest
import torch
from exercise_case_tools import CFG, DEVICE, judged
from torch.nn import functional as F
from torch.utils.data import DataLoader

from fastlab.data import CifarLikeDataset, make_dataloader, make_synthetic
from fastlab.models import build_model

STEPS = 6
_images, _labels = make_synthetic(STEPS * CFG.batch_size)
train_set = CifarLikeDataset(_images, _labels, train=True)  # decode + augment per image, as notebook 01's


def given_01(w):
    torch.manual_seed(0)
    model = build_model(CFG.model).to(DEVICE)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    loader = DataLoader(train_set, batch_size=CFG.batch_size, shuffle=True, drop_last=True)
    for x, y in w(loader):
        with w.step(len(x)) as s:
            x, y = x.to(DEVICE), y.to(DEVICE)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def solution_01(w):
    torch.manual_seed(0)
    model = build_model(CFG.model).to(DEVICE)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    loader = DataLoader(train_set, batch_size=CFG.batch_size, shuffle=True, drop_last=True,
                        num_workers=2, pin_memory=DEVICE.type == "cuda", persistent_workers=True)
    for x, y in w(loader):
        with w.step(len(x)) as s:
            x, y = x.to(DEVICE, non_blocking=True), y.to(DEVICE, non_blocking=True)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def copied_in_a_generator_01(w):  # right, written another way: a generator around the workers' loader copies
    torch.manual_seed(0)
    model = build_model(CFG.model).to(DEVICE)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    loader = DataLoader(train_set, batch_size=CFG.batch_size, shuffle=True, drop_last=True, num_workers=2,
                        pin_memory=DEVICE.type == "cuda")
    on_device = ((x.to(DEVICE, non_blocking=True), y.to(DEVICE, non_blocking=True)) for x, y in loader)
    for x, y in w(on_device):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def prefetching_workers_01(w):  # right, written another way: workers four batches ahead, not persistent
    torch.manual_seed(0)
    model = build_model(CFG.model).to(DEVICE)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    loader = DataLoader(train_set, batch_size=CFG.batch_size, shuffle=True, drop_last=True, num_workers=2,
                        prefetch_factor=4)
    for x, y in w(loader):
        with w.step(len(x)) as s:
            x, y = x.to(DEVICE), y.to(DEVICE)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def library_loader_01(w):  # right, written another way: fastlab's own make_dataloader, given workers
    torch.manual_seed(0)
    model = build_model(CFG.model).to(DEVICE)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    loader = make_dataloader(_images, _labels, batch_size=CFG.batch_size, train=True, num_workers=2,
                             pin_memory=DEVICE.type == "cuda", persistent_workers=True)
    for x, y in w(loader):
        with w.step(len(x)) as s:
            x, y = x.to(DEVICE, non_blocking=True), y.to(DEVICE, non_blocking=True)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def new_loader_not_iterated_01(w):  # the workers' loader built, the old one still iterated
    torch.manual_seed(0)
    model = build_model(CFG.model).to(DEVICE)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    loader = DataLoader(train_set, batch_size=CFG.batch_size, shuffle=True, drop_last=True)
    fast_loader = DataLoader(train_set, batch_size=CFG.batch_size, shuffle=True, drop_last=True,  # noqa: F841
                             num_workers=2, persistent_workers=True)
    for x, y in w(loader):
        with w.step(len(x)) as s:
            x, y = x.to(DEVICE, non_blocking=True), y.to(DEVICE, non_blocking=True)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def described_but_not_iterated_01(w):  # the watch told of the workers' loader, the old one iterated (callback style)
    torch.manual_seed(0)
    model = build_model(CFG.model).to(DEVICE)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    loader = DataLoader(train_set, batch_size=CFG.batch_size, shuffle=True, drop_last=True)
    fast_loader = DataLoader(train_set, batch_size=CFG.batch_size, shuffle=True, drop_last=True, num_workers=2,
                             persistent_workers=True)
    w.describe(fast_loader)
    for x, y in loader:
        w.batch_ready()
        with w.step(len(x)) as s:
            x, y = x.to(DEVICE), y.to(DEVICE)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def copies_only_01(w):  # pinned, non-blocking copies, but no worker process
    torch.manual_seed(0)
    model = build_model(CFG.model).to(DEVICE)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    loader = DataLoader(train_set, batch_size=CFG.batch_size, shuffle=True, drop_last=True,
                        pin_memory=DEVICE.type == "cuda")
    for x, y in w(loader):
        with w.step(len(x)) as s:
            x, y = x.to(DEVICE, non_blocking=True), y.to(DEVICE, non_blocking=True)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def comment_only_01(w):
    torch.manual_seed(0)
    model = build_model(CFG.model).to(DEVICE)
    opt = torch.optim.Adam(model.parameters(), lr=CFG.lr)
    loader = DataLoader(train_set, batch_size=CFG.batch_size, shuffle=True, drop_last=True)  # num_workers=2?
    for x, y in w(loader):
        with w.step(len(x)) as s:
            x, y = x.to(DEVICE), y.to(DEVICE)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


CASES_01 = [  # (the learner's loop, the verdict, words the check must say)
    (solution_01, True, "was made in a DataLoader worker process (it arrived in shared memory)"),
    (copied_in_a_generator_01, True, "was made in a DataLoader worker process"),
    (prefetching_workers_01, True, "by DataLoader(num_workers=2, pin_memory=False)"),
    (library_loader_01, True, "was made in a DataLoader worker process"),
    (new_loader_not_iterated_01, False, "was made in the loop's own process, by DataLoader(num_workers=0"),
    (described_but_not_iterated_01, False, "though the DataLoader the watch was given has num_workers=2: iterate"),
    (copies_only_01, False, "give the DataLoader the loop iterates num_workers=2"),
    (comment_only_01, "unchanged", "The technique's line is missing"),
]


@pytest.mark.parametrize("mine, expected, words", CASES_01, ids=[c[0].__name__ for c in CASES_01])
def test_the_workers_check_reads_where_the_loops_batches_were_made(mine, expected, words, capsys):
    shown, said = judged(given_01, mine, "workers", capsys, STEPS)
    assert shown == expected and words in said, said
