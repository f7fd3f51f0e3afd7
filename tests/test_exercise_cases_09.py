"""Exercise 09's check (technique "fused_in_memory") against the edits a learner makes: the worked solution, correct
edits written other ways, and wrong edits a learner would make, each with the verdict it must get (issue 49). The
check reads fused=True in every parameter group of the optimiser that stepped, and how the loop's first batch was
made as the watch fetched it (a DataLoader collates it with one torch.stack over its images; a batch indexed from
tensors in memory needs none), so each case runs its loop for real, briefly."""

from __future__ import annotations

import pytest
import torch
from exercise_case_tools import DEVICE, judged
from torch.nn import functional as F
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

from fastlab.lessons import technique_code as tc
from fastlab.models import build_model

STEPS = 4
data = tc.tiny_dataset(16 * STEPS)  # a Dataset of random CIFAR-shaped images, on the CPU, as notebook 09's


def given_09(w):
    torch.manual_seed(0)
    model = build_model("tiny").to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = DataLoader(data, batch_size=16, shuffle=True)
    for x, y in w(batches):
        with w.step(len(x)) as s:
            x, y = x.to(DEVICE), y.to(DEVICE)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def solution_09(w):
    torch.manual_seed(0)
    model = build_model("tiny").to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    images, labels = (t.to(DEVICE) for t in data.tensors)
    batches = [(images[i], labels[i]) for i in torch.randperm(len(labels)).split(16)]
    for x, y in w(batches):
        with w.step(len(x)) as s:
            x, y = x.to(DEVICE), y.to(DEVICE)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def indexed_as_fetched_09(w):  # right, written another way: a generator indexes each batch as it is fetched
    torch.manual_seed(0)
    model = build_model("tiny").to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    images, labels = data.tensors
    for x, y in w((images[i], labels[i]) for i in torch.randperm(len(labels)).split(16)):
        with w.step(len(x)) as s:
            x, y = x.to(DEVICE), y.to(DEVICE)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def a_batch_sampler_09(w):  # right, written another way: a DataLoader that indexes a whole batch at once, no collate
    torch.manual_seed(0)
    model = build_model("tiny").to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    batches = DataLoader(data, batch_size=None, sampler=BatchSampler(RandomSampler(data), 16, drop_last=False))
    for x, y in w(batches):
        with w.step(len(x)) as s:
            x, y = x.to(DEVICE), y.to(DEVICE)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def data_loader_kept_09(w):
    torch.manual_seed(0)
    model = build_model("tiny").to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    batches = DataLoader(data, batch_size=16, shuffle=True)
    for x, y in w(batches):
        with w.step(len(x)) as s:
            x, y = x.to(DEVICE), y.to(DEVICE)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def data_loader_in_a_generator_09(w):  # the DataLoader still collates, behind a generator
    torch.manual_seed(0)
    model = build_model("tiny").to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    batches = ((x.to(DEVICE), y.to(DEVICE)) for x, y in DataLoader(data, batch_size=16, shuffle=True))
    for x, y in w(batches):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def workers_instead_09(w):  # worker processes collate instead: still a DataLoader
    torch.manual_seed(0)
    model = build_model("tiny").to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    batches = DataLoader(data, batch_size=16, shuffle=True, num_workers=2)
    for x, y in w(batches):
        with w.step(len(x)) as s:
            x, y = x.to(DEVICE), y.to(DEVICE)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def not_fused_09(w):
    torch.manual_seed(0)
    model = build_model("tiny").to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    images, labels = (t.to(DEVICE) for t in data.tensors)
    batches = [(images[i], labels[i]) for i in torch.randperm(len(labels)).split(16)]
    for x, y in w(batches):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def fused_built_old_stepped_09(w):  # a fused AdamW built, the old one still stepped
    torch.manual_seed(0)
    model = build_model("tiny").to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fast = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)  # noqa: F841
    images, labels = (t.to(DEVICE) for t in data.tensors)
    batches = [(images[i], labels[i]) for i in torch.randperm(len(labels)).split(16)]
    for x, y in w(batches):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def adam_fused_09(w):  # fused, but AdamW swapped for Adam: another optimiser, not a faster AdamW
    torch.manual_seed(0)
    model = build_model("tiny").to(DEVICE)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
    images, labels = (t.to(DEVICE) for t in data.tensors)
    batches = [(images[i], labels[i]) for i in torch.randperm(len(labels)).split(16)]
    for x, y in w(batches):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def comment_only_09(w):
    torch.manual_seed(0)
    model = build_model("tiny").to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)  # fused=True?
    batches = DataLoader(data, batch_size=16, shuffle=True)
    for x, y in w(batches):
        with w.step(len(x)) as s:
            x, y = x.to(DEVICE), y.to(DEVICE)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


CASES_09 = [  # (the learner's loop, the verdict, words the check must say)
    (solution_09, True, "AdamW(fused=True) in every parameter group, the first batch indexed from tensors in memory"),
    (indexed_as_fetched_09, True, "the first batch indexed from tensors in memory"),
    (a_batch_sampler_09, True, "the first batch indexed from tensors in memory"),
    (data_loader_kept_09, False, "collated from 16 images one by one (torch.stack) as the watch fetched it"),
    (data_loader_in_a_generator_09, False, "collated from 16 images one by one"),
    (workers_instead_09, False, "made in a DataLoader worker process"),
    (not_fused_09, False, "AdamW(fused=False), the first batch indexed from tensors in memory: pass fused=True to"),
    (fused_built_old_stepped_09, False, "the optimiser that stepped is AdamW(fused=False)"),
    (adam_fused_09, False, "Adam(fused=True): keep torch.optim.AdamW"),
    (comment_only_09, "unchanged", "The technique's line is missing"),
]


@pytest.mark.parametrize("mine, expected, words", CASES_09, ids=[c[0].__name__ for c in CASES_09])
def test_the_fused_in_memory_check_reads_the_optimiser_that_stepped_and_how_batches_were_made(mine, expected,
                                                                                              words, capsys):
    shown, said = judged(given_09, mine, "fused_in_memory", capsys, STEPS)
    assert shown == expected and words in said, said
