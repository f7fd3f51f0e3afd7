"""fastlab.watch used the way a new user gets it wrong: each case ends in one clear line (an error or a note
fastlab.advise prints) or in the right measurement. Then compare_loops (two versions of a loop, in turns, judged
by fastlab.measure's noise rule) and memory read less often on short CPU steps."""

import importlib
import threading
import time

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import fastlab
from fastlab import RunResult, verdicts
from fastlab.advisor import findings_for

watch_mod = importlib.import_module("fastlab.watch")


def data(n: int = 32) -> TensorDataset:
    gen = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 3, 8, 8, generator=gen), torch.randint(0, 10, (n,), generator=gen))


def others(r: RunResult) -> list[str]:
    """The run's notes but the one every loop that gives no loss gets."""
    return [n for n in r.extras["watch"]["notes"] if not n.startswith("no loss given")]


def one_line(error: BaseException) -> str:
    text = str(error)
    assert "\n" not in text and text.startswith("fastlab.watch"), text
    return text


# ----------------------------------------------------------------- the misuse cases of the issue


def test_the_batch_tensor_instead_of_its_length_is_one_line():
    w = fastlab.watch("tensor", warmup_steps=0)
    for x, _ in w(DataLoader(data(8), batch_size=4)):
        with pytest.raises(TypeError) as e:
            with w.step(x):
                pass
        assert "shape (4, 3, 8, 8)" in one_line(e.value) and "len(x)" in str(e.value)
        with pytest.raises(TypeError, match="len"):
            w.step_done(x)
        with pytest.raises(ValueError, match="integer >= 1"):
            w.step_done(0)
        w.step_done(len(x))  # the right call still works afterwards
    assert w.result().steps_done == 2


def test_the_wrapped_loader_keeps_its_attributes_and_iterates_each_epoch():
    loader = DataLoader(data(32), batch_size=8)
    w = fastlab.watch("attributes", warmup_steps=0, window_steps=2)
    train_loader = w(loader)
    assert len(train_loader.dataset) == 32 and len(train_loader) == 4 and train_loader.batch_size == 8
    for _ in range(2):
        for x, _ in train_loader:
            w.step_done(len(x))
    r = w.result()
    assert r.steps_done == 8 and r.extras["watch"]["epochs"] == [4, 4] and others(r) == []
    assert w(train_loader) is train_loader  # wrapped again by the same watch: the same thing


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_gpu_asked_for_where_there_is_none_names_the_watch_argument():
    with pytest.raises(ValueError) as e:
        fastlab.watch(device="cuda")
    text = one_line(e.value)
    assert text.startswith("fastlab.watch(device='cuda')") and "TrainConfig" not in text and "'cpu'" in text
    with pytest.raises(ValueError, match=r"fastlab.watch\(device='gpu'\) is not allowed: choose"):
        fastlab.watch(device="gpu")


def test_a_step_never_marked_is_said_so():
    w = fastlab.watch("no marker")
    for _batch in w(DataLoader(data(16), batch_size=4)):
        pass  # the step, without w.step / w.step_done
    r = w.result()
    assert r.status == "failed" and "no step was marked" in r.error and "gave 4 batches" in r.error
    text = fastlab.advise(r).text()
    assert "no step was marked" in text and "No bottleneck crossed" not in text
    assert "no step was marked" in fastlab.watch("nothing at all").result().error


def test_a_loader_not_wrapped_has_no_data_wait_rather_than_zero():
    w = fastlab.watch("not wrapped", warmup_steps=0, window_steps=2)
    for x, _ in DataLoader(data(16), batch_size=4):
        w.step_done(len(x))
    r = w.result()
    assert r.window_throughput and r.data_wait_fraction() != r.data_wait_fraction()  # NaN: not measured
    assert "data wait not measured" in r.summary() and "data wait 0%" not in r.summary()
    assert "the loader was not wrapped" in fastlab.advise(r).text()
    assert "data_bound" not in {f.key for f in findings_for(r)}


def test_dict_batches_are_counted_by_their_images():
    loader = [{"x": torch.zeros(16, 3, 8, 8), "y": torch.zeros(16, dtype=torch.long)} for _ in range(4)]
    w = fastlab.watch("dicts", warmup_steps=0, window_steps=2)
    for batch in w(loader):
        w.step_done(len(batch))  # 2 keys
    r = w.result()
    assert r.images_per_step == 16 and "counted 16 images" in r.extras["watch"]["notes"][0]
    w = fastlab.watch("dicts, right", warmup_steps=0, window_steps=2)
    for batch in w(loader):
        w.step_done(len(batch["x"]))
    assert others(w.result()) == []


def test_one_watch_shared_by_two_threads_refuses_the_second():
    w = fastlab.watch("shared", warmup_steps=0, window_steps=2)
    errors = []

    def other_thread():
        try:
            w.step_done(4)
        except RuntimeError as e:
            errors.append(e)

    for i, (x, _) in enumerate(w(DataLoader(data(16), batch_size=4))):
        w.step_done(len(x))
        if i == 1:
            t = threading.Thread(target=other_thread)
            t.start()
            t.join()
    assert len(errors) == 1 and "one watch measures one loop in one thread" in one_line(errors[0])
    r = w.result()
    assert r.steps_done == 4 and min(r.window_throughput) > 0


def test_a_generator_used_up_by_the_first_epoch_is_said_so():
    batches = ((torch.zeros(4, 3, 8, 8), torch.zeros(4)) for _ in range(4))
    w = fastlab.watch("generator", warmup_steps=0, window_steps=2)
    with pytest.warns(UserWarning, match="epoch 2 got no batches: the loader is an iterator"):
        for _ in range(2):
            for x, _ in w(batches):
                w.step_done(len(x))
    r = w.result()
    assert r.extras["watch"]["epochs"] == [4, 0] and "make a new generator each epoch" in fastlab.advise(r).text()


def test_evaluation_inside_the_loop_is_left_out_with_paused():
    w = fastlab.watch("paused", warmup_steps=0, window_steps=100)
    for i, (x, _) in enumerate(w([(torch.zeros(2), 0)] * 4)):
        if i == 2:
            with w.paused():
                time.sleep(0.5)  # an evaluation in the middle of the epoch
        w.step_done(len(x))
    r = w.result()
    assert r.step_seconds[2] < 0.5 and r.extras["watch"]["excluded_seconds"] >= 0.5
    assert r.timed_seconds < 0.5


@pytest.mark.parametrize("how", ["step_done", "with step"])
def test_a_training_step_inside_paused_is_refused_in_one_line(how):
    """Pausing the training step itself used to be read as throughput: the paused time left out after the step was
    counted, so the next steps' times went negative (-41,155 images/s in notebook 10's exercise)."""
    w = fastlab.watch("paused step", warmup_steps=0, window_steps=2)
    batches = iter(w([(torch.zeros(2), 0)] * 4))
    next(batches)
    w.step_done(2)
    with pytest.raises(RuntimeError) as refused, w.paused():
        if how == "step_done":
            w.step_done(2)
        else:
            with w.step(2):
                pass
    assert "inside a `with w.paused()` block" in one_line(refused.value)
    for _ in batches:  # the loop goes on, the pause's time left out
        w.step_done(2)
    r = w.result()
    assert r.steps_done == 4 and all(s >= 0 for s in r.step_seconds)


@pytest.mark.parametrize("pauses", [[0], [1], [0, 1, 2], [3]])
def test_no_watch_result_holds_a_negative_or_non_finite_speed_whatever_it_pauses(pauses):
    """Constructed pauses (an evaluation before a step, between steps, after the last, several): every step time,
    window and speed stays positive and finite."""
    import math

    w = fastlab.watch("pauses", warmup_steps=1, window_steps=1)
    for i, (x, _) in enumerate(w([(torch.zeros(2), 0)] * 4)):
        if i in pauses:
            with w.paused():
                time.sleep(0.05)
        time.sleep(0.002)
        w.step_done(len(x))
    if 3 in pauses:
        with w.paused():
            time.sleep(0.05)
    r = w.result()
    figures = [*r.step_seconds, *r.window_throughput, r.timed_seconds]
    assert r.window_throughput and all(math.isfinite(v) and v > 0 for v in figures), figures


# ----------------------------------------------------------------- compare_loops


def test_compare_loops_runs_the_two_versions_in_turns_under_fresh_watches():
    order, watches = [], []

    def make(name: str, batch: int):
        def loop(w):
            order.append(name)
            watches.append(w)
            for x, _ in w(DataLoader(data(48), batch_size=batch)):
                w.step_done(len(x))
        return loop

    c = fastlab.compare_loops(make("before", 4), make("after", 8), repeats=3, warmup_steps=1, window_steps=2)
    assert order == ["before", "after", "after", "before", "before", "after"]
    assert len(set(map(id, watches))) == 6 and [r.label for r in c.before] == ["before #1", "before #2", "before #3"]
    assert c.speed.base.n == sum(len(r.window_throughput) for r in c.before)
    assert c.speed.comparable and not c.not_compared and c.speed.words in c.text() and c.outcome in c.text()
    with pytest.raises(ValueError, match=r"compare_loops: repeats=0 is not allowed"):
        fastlab.compare_loops(make("a", 4), make("b", 4), repeats=0)
    with pytest.raises(TypeError, match="after must be a function"):
        fastlab.compare_loops(make("a", 4), None)


def watched(label: str, windows: list[float], status: str = "ok", error: str = "") -> RunResult:
    return RunResult(config={"watched": True}, label=label, window_throughput=windows, status=status, error=error,
                     extras={"watched": True, "watch": {"notes": []}})


def test_the_comparison_is_worded_by_the_one_noise_rule(monkeypatch):
    calls = []
    real = verdicts.is_noise  # judge_loops asks fastlab.verdicts, whose rule it is
    monkeypatch.setattr(verdicts, "is_noise", lambda a, b: calls.append((a, b)) or real(a, b))
    clear = watch_mod.judge_loops([watched(f"before #{i}", [100.0, 101.0, 102.0]) for i in (1, 2)],
                                  [watched(f"after #{i}", [200.0, 201.0, 202.0]) for i in (1, 2)])
    assert clear.speed.direction == "better" and "faster" in clear.speed.words and calls
    noisy = watch_mod.judge_loops([watched(f"b #{i}", [100.0, 200.0, 100.0, 200.0, 150.0]) for i in (1, 2)],
                                  [watched(f"a #{i}", [110.0, 190.0, 140.0, 160.0, 150.0]) for i in (1, 2)])
    assert noisy.speed.direction == "noise" and "noise" in noisy.speed.words
    slower = watch_mod.judge_loops([watched(f"b #{i}", [200.0, 201.0, 202.0]) for i in (1, 2)],
                                   [watched(f"a #{i}", [100.0, 101.0, 102.0]) for i in (1, 2)])
    assert slower.speed.direction == "worse" and "(slower)" in slower.speed.words
    # one run each (repeats=1), however far apart: a single pair cannot tell the machine's drift from an effect
    single = watch_mod.judge_loops([watched("b", [200.0, 201.0, 202.0])], [watched("a", [100.0, 101.0, 102.0])])
    assert single.speed.single_pair and single.speed.noise and "cannot tell drift" in single.speed.words
    assert "one run each" in single.text()


def test_a_diverged_or_empty_side_is_not_credited():
    ok = [watched("before #1", [100.0, 101.0])]
    d = watch_mod.judge_loops(ok, [watched("after #1", [900.0], "diverged", "the training loss became nan")])
    assert d.not_compared == "diverged" and "not credited" in d.speed.words and not d.speed.comparable
    assert d.speed.side == "other" and d.outcome == "diverged" and "diverged" in d.text()
    fixed = watch_mod.judge_loops([watched("before #1", [900.0], "diverged", "nan")], ok)
    assert fixed.not_compared == "fixed" and "'before #1' diverged" in fixed.speed.words and fixed.speed.side == "base"
    failed = watch_mod.judge_loops([watched("before #1", [900.0], "diverged", "nan")],
                                   [watched("after #1", [100.0], "failed", "CUDA error")])
    assert failed.not_compared == "failed" and "CUDA error" in failed.speed.words
    empty = watch_mod.judge_loops(ok, [watched("after #1", [], "failed", "no step was marked (...)")])
    assert empty.not_compared == "failed" and "no step was marked" in empty.speed.words
    short = watch_mod.judge_loops(ok, [watched("after #1", [])])  # ran, but too few steps for a timed window
    assert short.not_compared == "failed" and "warmup_steps + window_steps" in short.text()


def test_verify_on_a_watched_run_points_to_compare_loops():
    with pytest.raises(ValueError, match="compare_loops"):
        fastlab.verify(watched("mine", [1.0, 2.0]))


# ----------------------------------------------------------------- memory on short steps


def test_memory_is_read_less_often_on_short_cpu_steps_and_the_leak_rule_reads_the_steps():
    w = fastlab.watch("short steps", warmup_steps=2, window_steps=50)
    for _ in w(range(600)):
        w.step_done(1)  # empty steps: microseconds each
    r = w.result()
    steps = r.extras["watch"]["memory_steps"]
    assert len(r.memory_trace_mb) == len(steps) < 600 // 4 and steps == sorted(steps)
    assert steps[:2 + watch_mod.MEMORY_DENSE_STEPS] == list(range(2 + watch_mod.MEMORY_DENSE_STEPS))
    # a trace sampled every 10th step, rising 1 MiB a step: the rise is counted over steps, not samples
    sampled = list(range(0, 200, 10))
    leak = RunResult(config={"watched": True, "warmup_steps": 0}, label="leak", memory_trace_mb=[100.0 + s for s in
                     sampled], extras={"watched": True, "watch": {"memory_steps": sampled}}, memory_kind="process_rss")
    f = {x.key: x for x in findings_for(leak)}["memory_leak"]
    assert f.evidence[0].value == pytest.approx(190.0) and f.evidence[1].value == pytest.approx(1.0, rel=0.01)


def test_repeats_are_paired_so_a_drift_between_them_is_not_noise():
    # the machine slows and speeds between repeats; within each back-to-back pair "after" is clearly faster
    before = [watched(f"before #{i}", [b, b + 1.0, b + 2.0]) for i, b in enumerate((100.0, 200.0, 150.0), 1)]
    after = [watched(f"after #{i}", [b * 1.1, b * 1.1 + 1, b * 1.1 + 2]) for i, b in enumerate((100.0, 200.0, 150.0), 1)]
    c = watch_mod.judge_loops(before, after)
    assert c.speed.base.low <= c.speed.other.median <= c.speed.base.high  # pooled, it would look like noise
    assert c.speed.better and "3 interleaved repeats" in c.speed.words and "one run each" not in c.text()
