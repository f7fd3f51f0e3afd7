"""Exercise 08's check against the edits a learner makes: the worked solution, correct edits written other ways, and
wrong edits a learner would make, each with the verdict it must get (issue 49). The check reads at the end of every
step whether torch.profiler was recording (fastlab.watch), so each case runs its loop for real, briefly, under smoke
(tests/exercise_case_tools.py): six steps, enough for a schedule that skips one, warms up on one and records three."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
from exercise_case_tools import CFG, batches, judged
from torch.nn import functional as F
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from fastlab.models import build_model

TRACES = Path(tempfile.gettempdir()) / "fastlab-exercise-08"  # where the traces go, as the notebook's trace_dir

# ---------------------------------------------------------------- 08: the profiler's schedule


def given_08(w):
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for x, y in w(batches):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def solution_08(w):
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    prof = profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=3, repeat=1),
                   on_trace_ready=lambda p: p.export_chrome_trace(f"{TRACES}/trace.json"))
    prof.start()
    for x, y in w(batches):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss
            prof.step()
    prof.stop()


def with_block_stepped_after_08(w):  # right, written another way: `with profile(...)`, prof.step() after the step
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    with profile(schedule=schedule(wait=1, warmup=1, active=3)) as prof:
        for x, y in w(batches):
            with w.step(len(x)) as s:
                loss = F.cross_entropy(model(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                s.loss = loss
            prof.step()


def labelled_tensorboard_08(w):  # right, written another way: two-step cycles, labelled ranges, a TensorBoard trace
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    handler = torch.profiler.tensorboard_trace_handler(str(TRACES))
    with profile(schedule=schedule(wait=1, warmup=1, active=2, repeat=2), on_trace_ready=handler) as prof:
        for x, y in w(batches):
            with w.step(len(x)) as s:
                with record_function("forward"):
                    loss = F.cross_entropy(model(x), y)
                opt.zero_grad(set_to_none=True)
                with record_function("backward"):
                    loss.backward()
                opt.step()
                s.loss = loss
                prof.step()


def stepped_never_started_08(w):  # torch's profile.step() moves the schedule, and so starts it: it records
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    prof = profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=3, repeat=1))
    for x, y in w(batches):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss
            prof.step()


def built_never_started_08(w):
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    prof = profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=3, repeat=1),  # noqa: F841
                   on_trace_ready=lambda p: p.export_chrome_trace(f"{TRACES}/trace.json"))
    for x, y in w(batches):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def started_never_stepped_08(w):
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    prof = profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=3, repeat=1),
                   on_trace_ready=lambda p: p.export_chrome_trace(f"{TRACES}/trace.json"))
    prof.start()
    for x, y in w(batches):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss
    prof.stop()


def no_schedule_08(w):
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for x, y in w(batches):
            with w.step(len(x)) as s:
                loss = F.cross_entropy(model(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                s.loss = loss
                prof.step()


def recording_from_the_start_never_stepped_08(w):
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    with profile(schedule=schedule(wait=0, warmup=0, active=3)):
        for x, y in w(batches):
            with w.step(len(x)) as s:
                loss = F.cross_entropy(model(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                s.loss = loss


def record_function_alone_08(w):
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for x, y in w(batches):
        with w.step(len(x)) as s, record_function("train_step"):
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


def comment_only_08(w):
    torch.manual_seed(0)
    model = build_model(CFG.model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)  # profile(schedule=...) goes before the loop
    for x, y in w(batches):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            s.loss = loss


CASES_08 = [  # (the learner's loop, the verdict, words the check must say)
    (solution_08, True, "torch.profiler recording at the end of steps 2, 3, 4 of 6 and not the others"),
    (with_block_stepped_after_08, True, "recording at the end of steps 3, 4, 5 of 6"),
    (labelled_tensorboard_08, True, "its schedule moved with prof.step()"),
    (stepped_never_started_08, True, "recording at the end of steps 2, 3, 4 of 6"),
    (built_never_started_08, False, "torch.profiler recorded none of 6 steps"),
    (started_never_stepped_08, False, "the schedule stays in its wait steps until prof.step() moves it"),
    (no_schedule_08, False, "torch.profiler recording through every one of 6 steps: no schedule skipped"),
    (recording_from_the_start_never_stepped_08, False, "or prof.step() never moved it"),
    (record_function_alone_08, False, "record_function only labels a range"),
    (comment_only_08, "unchanged", "The technique's line is missing"),
]


@pytest.mark.parametrize("mine, expected, words", CASES_08, ids=[c[0].__name__ for c in CASES_08])
def test_the_profiler_check_reads_which_steps_the_profiler_recorded(mine, expected, words, capsys):
    TRACES.mkdir(exist_ok=True)
    shown, said = judged(given_08, mine, "profiler", capsys, len(batches))
    assert shown == expected and words in said, said
