"""fastlab.loop_facts: what a watched loop's first step did, each fact from a small loop on the CPU."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

import fastlab
from fastlab.loop_facts import FirstStepFacts, layout


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 8, 10))


X, Y = torch.randn(4, 3, 8, 8), torch.zeros(4, dtype=torch.long)


def one_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor = X, **autocast) -> None:
    with torch.autocast("cpu", **autocast) if autocast else torch.autocast("cpu", enabled=False):
        loss = F.cross_entropy(model(x), Y)
    opt.zero_grad()
    loss.backward()
    opt.step()


def test_a_plain_step_reads_as_plain():
    model = net()
    with FirstStepFacts("cpu") as seen:
        one_step(model, torch.optim.Adam(model.parameters()))
    f = seen.facts
    assert (f["model"], f["autocast"], f["input_layout"], f["weights_layout"]) == ("Sequential", None, "contiguous",
                                                                                   "contiguous")
    assert (f["optimizer"], f["fused"], f["scheduled"], f["eval_forwards"], f["recomputed"]) == ("Adam", False, False,
                                                                                                0, 0)


def test_each_technique_shows_in_its_fact():
    model = net().to(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, fused=True)
    torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)
    with FirstStepFacts("cpu") as seen:
        one_step(model, opt, X.contiguous(memory_format=torch.channels_last), dtype=torch.bfloat16)
        model.eval()
        with torch.no_grad():
            model(X)
        model(X)  # an evaluation forward that records a graph
    f = seen.facts
    assert (f["autocast"], f["input_layout"], f["weights_layout"]) == ("bfloat16", "channels_last", "channels_last")
    assert (f["optimizer"], f["fused"], f["lr"], f["scheduled"]) == ("AdamW", True, 0.01, True)
    assert (f["eval_forwards"], f["eval_with_grad"]) == (2, 1)


def test_checkpointed_blocks_are_counted_as_recomputed_in_backward():
    block, head = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU()), nn.Linear(4 * 8 * 8, 10)
    opt = torch.optim.SGD([*block.parameters(), *head.parameters()], lr=0.1)
    with FirstStepFacts("cpu") as seen:
        h = checkpoint(block, X, use_reentrant=False)
        F.cross_entropy(head(h.flatten(1)), Y).backward()
        opt.step()
    assert seen.facts["recomputed"] >= 1  # the block (and its layers) ran again in backward
    assert seen.facts["model"] == "Sequential"  # the first outermost call, not a recomputation


def test_the_hooks_are_gone_after_the_step_and_other_threads_are_not_recorded():
    import threading

    model = net()
    with FirstStepFacts("cpu") as seen:
        worker = threading.Thread(target=lambda: model(X))
        worker.start()
        worker.join()
    model(X)
    assert seen.facts["model"] is None  # neither the other thread's forward nor one after the step
    assert not torch.nn.modules.module._global_forward_pre_hooks


def test_a_watch_with_facts_records_its_first_step_its_profiled_steps_and_pauses():
    model = net()
    opt = torch.optim.Adam(model.parameters())
    w = fastlab.watch("facts", warmup_steps=1, window_steps=2, facts=True)
    for x, y in w([(X, Y)] * 6):
        with w.step(len(x)) as s:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            s.loss = loss
        with w.paused():
            pass
    facts = w.result().extras["watch"]["facts"]
    assert facts["model"] == "Sequential" and facts["optimizer"] == "Adam" and facts["images_per_step"] == 4
    assert facts["paused_blocks"] == 6 and facts["profiled"] is False and facts["loader"] == "iterable"
    assert "facts" not in fastlab.watch("plain").result().extras["watch"]  # only when asked


def test_layout_names_the_three_layouts():
    x = torch.randn(2, 3, 4, 4)
    assert [layout(x), layout(x.contiguous(memory_format=torch.channels_last)), layout(x[:, :, ::2]),
            layout(torch.randn(3))] == ["contiguous", "channels_last", "strided", None]


def test_an_exercise_weighs_peak_memory_run_by_run_lower_is_better():
    from fastlab.exercise import peak_memory
    from fastlab.measure import Spread
    from fastlab.results import RunResult
    from fastlab.verdicts import verdict
    from fastlab.watch import LoopComparison

    def side(*peaks: float) -> list[RunResult]:
        return [RunResult(config={}, label="x", peak_memory_mb=p) for p in peaks]

    def judged(before: list[RunResult], after: list[RunResult]) -> str:
        return peak_memory(LoopComparison(before, after, verdict(Spread.of([]), Spread.of([])))).direction

    assert judged(side(100.0, 101.0), side(60.0, 61.0)) == "better"
    assert judged(side(100.0, 101.0), side(140.0, 141.0)) == "worse"
    assert judged(side(100.0, 120.0), side(110.0, 130.0)) == "noise"  # the runs' peaks overlap


def test_an_exercise_weighs_the_final_loss_and_reads_the_learning_rate():
    from fastlab.exercise import final_loss
    from fastlab.measure import Spread
    from fastlab.results import RunResult
    from fastlab.technique_readings import batch_size_reading
    from fastlab.verdicts import verdict
    from fastlab.watch import LoopComparison

    def side(*finals: float) -> list[RunResult]:
        return [RunResult(config={}, label="x", losses=[(0, 2.3), (9, f)]) for f in finals]

    def compared(before: list[RunResult], after: list[RunResult]) -> LoopComparison:
        return LoopComparison(before, after, verdict(Spread.of([]), Spread.of([])))

    assert final_loss(compared(side(1.50, 1.52), side(1.10, 1.12))).direction == "better"
    assert final_loss(compared(side(1.50, 1.60), side(1.55, 1.65))).direction == "noise"
    # the learning rate against the batch is the batch_size technique's reading (its words, printed by check)
    shown, said = batch_size_reading({"images_per_step": 64, "lrs": [1.414e-3], "steps": 1},
                                     {"images_per_step": 32, "lrs": [1e-3]})
    assert shown and "the learning rate 0.00141, 1.41x the given 0.001: the square-root rule's 1.41x" in said
    assert batch_size_reading({"images_per_step": 64, "lrs": []}, {"images_per_step": 32, "lrs": [1e-3]})[0] is None


def test_an_exercise_check_refuses_a_technique_it_does_not_know():
    import pytest

    from fastlab import exercise

    def loop(w):
        return None

    with pytest.raises(ValueError, match=r"check\(technique='warp'\) is not allowed: one of workers, autocast"):
        exercise.check(loop, loop, technique="warp")


def test_the_activations_saved_for_backward_are_counted_exactly_and_no_grad_and_checkpointing_lower_them():
    # a CPU's resident set hides a small model's activations (issue 39 item 5); autograd's saves do not
    block = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU())
    head = nn.Linear(16 * 8 * 8, 10)

    def saved(checkpointed: bool) -> float:
        with FirstStepFacts("cpu") as seen:
            h = checkpoint(block, X, use_reentrant=False) if checkpointed else block(X)
            F.cross_entropy(head(h.flatten(1)), Y).backward()
        return seen.facts["saved_mb"]

    plain, checkpointed = saved(False), saved(True)
    mib = 4 * 16 * 8 * 8 * 4 / 2**20  # one 16-channel activation of the batch, fp32
    assert plain >= 2 * mib and checkpointed < 0.6 * plain  # the ReLUs' saves inside the block are checkpoint's
    assert saved(False) == plain  # exact: the same step saves the same bytes
    # backward frees a pass's saves; at real sizes (mmap'd blocks) the next pass reuses their addresses
    big_x, big_head = torch.randn(64, 3, 32, 32), nn.Linear(16 * 32 * 32, 10)

    def passes(n: int) -> float:
        with FirstStepFacts("cpu") as seen:
            for _ in range(n):
                F.cross_entropy(big_head(block(big_x).flatten(1)), Y.repeat(16)).backward()
        return seen.facts["saved_mb"]

    once, twice = passes(1), passes(2)  # big_x is one storage saved by both passes; the targets are new each time
    assert abs(twice - (2 * once - big_x.nbytes / 2**20)) < 1e-9, (once, twice)  # a reused address: counted again
    model = nn.Sequential(block, nn.Flatten(), head).eval()
    for grad, expected in ((True, plain), (False, 0.0)):
        with FirstStepFacts("cpu") as seen, torch.set_grad_enabled(grad):
            model(X)
        assert (seen.facts["saved_mb"] > 0) == (expected > 0)  # evaluation under no_grad saves nothing


def test_an_exercise_weighs_the_saved_activations_by_the_one_comparison():
    from fastlab.exercise import saved_activations
    from fastlab.watch import LoopComparison

    def runs(mb: float) -> list[fastlab.RunResult]:
        return [fastlab.RunResult(config={}, extras={"watch": {"facts": {"saved_mb": mb}}}) for _ in range(2)]

    nan = fastlab.Spread.of([])
    c = saved_activations(LoopComparison(runs(8.0), runs(2.0), fastlab.verdict(nan, nan)))
    assert c.direction == "better" and abs(c.ratio - 0.25) < 1e-9


def test_a_recomputation_in_autograd_s_own_thread_counts_as_a_gpu_backward_runs_it():
    import threading

    block, head = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU()), nn.Linear(4 * 8 * 8, 10)
    with FirstStepFacts("cpu") as seen:
        h = checkpoint(block, X, use_reentrant=False)
        loss = F.cross_entropy(head(h.flatten(1)), Y)
        worker = threading.Thread(target=loss.backward)  # on a GPU, backward's nodes run in autograd's device thread
        worker.start()
        worker.join()
    f = seen.facts
    assert (f["pieces"], f["pieces_recomputed"], f["pieces_saved"]) == (["Sequential", "Linear"], [True, False],
                                                                         [False, True])
