"""Each run in a fresh process (fastlab.isolation), interleaved arms and the one noise rule (fastlab.measure)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import fastlab
from fastlab import isolation, train
from fastlab.measure import Spread, median_interval
from fastlab.preflight import sampled_indices
from fastlab.results import RunResult
from fastlab.verdicts import is_noise, verdict

sys.path.insert(0, os.path.dirname(__file__))
import isolation_probe  # noqa: E402  (a module the run's child can import)

ROOT = Path(__file__).resolve().parents[1]


def probe_lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_run_goes_to_a_fresh_process_whether_started_from_the_main_thread_or_a_panel_thread(quick):
    # The mechanism behind "a cell and a panel time alike": neither runs the training in its own thread. (Speed is
    # never asserted in a test: a loaded machine would fail it.)
    torch.ones(64, 64) @ torch.ones(64, 64)  # the main thread has run torch ops, as a notebook's has
    from_cell = fastlab.run(quick, progress=False)
    box = {}
    panel = threading.Thread(target=lambda: box.setdefault("r", fastlab.run(quick, progress=False)))
    panel.start()
    panel.join()
    for r in (from_cell, box["r"]):
        assert r.ok and r.extras["isolation"] == "process"
        assert r.extras["run_pid"] != os.getpid()
    assert from_cell.extras["run_pid"] != box["r"].extras["run_pid"]
    assert from_cell.env == {**box["r"].env, "date": from_cell.env["date"]}


def test_a_global_a_run_sets_does_not_reach_the_next_run_or_the_caller(quick, tmp_path, monkeypatch):
    probe = tmp_path / "probe.jsonl"
    monkeypatch.setenv("FASTLAB_PROBE_FILE", str(probe))
    before = isolation_probe.globals_now()
    for _ in range(2):
        r = fastlab.run(quick, model=isolation_probe.meddling_net, progress=False)
        assert r.ok and r.extras["isolation"] == "process"
    seen = probe_lines(probe)
    assert len({s["pid"] for s in seen}) == 2, "each run should build its model in a process of its own"
    first_seen_by_run = {s["pid"]: s for s in reversed(seen)}  # the first report of each process
    for s in first_seen_by_run.values():
        assert (s["cudnn_benchmark"], s["matmul_precision"], s["threads"]) == (
            before["cudnn_benchmark"], before["matmul_precision"], before["threads"])
        # DataLoader workers start in the run as they would in the caller (fork on Linux), not through a
        # forkserver of the child's own, which imports torch again for every worker
        assert s["worker_start_method"] == before["worker_start_method"]
    assert isolation_probe.globals_now() == before


def test_the_in_process_path_is_taken_and_named_for_what_a_child_cannot_import(quick, monkeypatch):
    r = fastlab.run(quick, model=lambda: isolation_probe.TinyNet(), progress=False)
    assert r.ok and r.extras["isolation"].startswith("in-process (fresh thread): the model or dataset cannot be sent")

    class NotebookNet(isolation_probe.TinyNet):  # as if defined in a notebook cell
        pass

    NotebookNet.__module__, NotebookNet.__qualname__ = "__main__", "NotebookNet"
    monkeypatch.setattr(sys.modules["__main__"], "NotebookNet", NotebookNet, raising=False)
    r = fastlab.run(quick, model=NotebookNet, progress=False)
    assert r.ok and "defined in __main__" in r.extras["isolation"]


def test_a_child_killed_mid_run_is_a_failed_result_with_the_reason_and_the_next_run_works(quick):
    cfg = quick.replace(steps=20, windows=2)
    r = fastlab.run(cfg, model=isolation_probe.dies_at_forward, progress=False)
    assert r.status == "failed"
    assert "killed by SIGKILL from outside fastlab" in r.error and "ended without a result" in r.error
    assert "out-of-memory killer: this machine's" not in r.error  # the OOM killer's count did not rise
    assert 1 <= r.steps_done < cfg.warmup_steps + cfg.steps
    again = fastlab.run(quick, progress=False)
    assert again.ok and again.extras["isolation"] == "process"


def test_an_error_in_the_child_is_raised_in_the_caller_with_its_words(quick):
    with pytest.raises(ValueError, match="a clear message from the reader's own model"):
        fastlab.run(quick, model=isolation_probe.refusing_net, progress=False)


def test_a_stop_set_in_the_caller_ends_the_child_run_interrupted_with_its_steps(quick):
    stop = threading.Event()
    cfg = quick.replace(steps=400, windows=2, max_seconds=0.0)

    def on_step(done: int, total: int) -> None:
        if done == 3:
            stop.set()

    r = fastlab.run(cfg, progress=False, stop=stop, on_step=on_step)
    assert r.status == "interrupted" and r.extras["isolation"] == "process"
    assert 3 <= r.steps_done < 400


def test_each_child_starts_at_a_random_memory_layout(monkeypatch, quick):
    """Children of one forkserver map their arrays alike (a bias that leaned a whole session one way, the same in
    every repeat); each child first maps a random number of pages and takes random heap blocks, and a run records
    both."""
    monkeypatch.setenv("FASTLAB_LAYOUT", "fixed")
    fixed = [isolation.call(isolation_probe.where_a_large_array_lands) for _ in range(4)]
    assert len(set(fixed)) <= 2  # without the shift, children's large arrays land at one address (seen: all four)
    monkeypatch.delenv("FASTLAB_LAYOUT")
    shifted = [isolation.call(isolation_probe.where_a_large_array_lands) for _ in range(4)]
    assert len({address % (2 << 20) for address in shifted}) >= 3  # against 2 MB huge-page boundaries too
    a, b = (fastlab.run(quick, label=f"run {i}", progress=False) for i in range(2))
    for r in (a, b):
        shift = r.extras["layout_shift"]
        assert 0 <= shift["pages"] < 512 and 0 <= shift["heap_bytes"] < 1 << 16 and shift["heap_bytes"] % 64 == 0


# ------------------------------------------------------------------ interleaving and the noise rule


def fake_result(label: str, windows: list[float]) -> RunResult:
    return RunResult(config={}, label=label, window_throughput=list(windows), images_per_step=32)


class DriftingMachine:
    """A mocked fastlab.run: each arm's speed is its own factor times the machine's speed at that moment, which
    drops by half between the first two runs and the last two (a drift injected between runs)."""

    def __init__(self, factors: dict[str, float]) -> None:
        self.factors, self.calls = factors, []

    def __call__(self, cfg, label, progress=True, comparison=None):
        machine = 100.0 if len(self.calls) < 2 else 50.0
        self.calls.append(label)
        speed = machine * self.factors[label]
        return fake_result(label, [speed * f for f in (0.99, 1.0, 1.01, 1.0, 0.995)])


def test_interleaved_arms_read_noise_under_drift_and_faster_when_every_repeat_shows_it(monkeypatch, smoke):
    same = DriftingMachine({"baseline": 1.0, "batch_size=64": 1.0})
    monkeypatch.setattr(train, "run", same)
    a, b = train.compare(smoke, progress=False, repeats=2, batch_size=64)
    assert same.calls == ["baseline", "batch_size=64", "batch_size=64", "baseline"]  # A B, B A
    assert is_noise(a.throughput, b.throughput) and verdict(a.throughput, b.throughput).noise
    # run one after the other, the same drift reads as a 2x effect: what interleaving prevents
    assert not is_noise(Spread.of(a.repeat_windows[0]), Spread.of(b.repeat_windows[1]))

    better = DriftingMachine({"baseline": 1.0, "batch_size=64": 1.2})
    monkeypatch.setattr(train, "run", better)
    a, b = train.compare(smoke, progress=False, repeats=2, batch_size=64)
    assert not is_noise(a.throughput, b.throughput)
    assert "(faster)" in str(verdict(a.throughput, b.throughput))


def test_a_difference_only_some_repeats_show_is_noise():
    a = Spread.of([100, 101, 99, 50, 51, 49], [[100, 101, 99], [50, 51, 49]])
    b = Spread.of([120, 121, 119, 50, 51, 49], [[120, 121, 119], [50, 51, 49]])
    assert is_noise(a, b)
    c = Spread.of([120, 121, 119, 40, 41, 39], [[120, 121, 119], [40, 41, 39]])  # opposite ways
    assert is_noise(a, c)


def test_the_noise_interval_does_not_widen_with_the_number_of_windows():
    rng = random.Random(7)
    widths, ranges = {}, {}
    for n in (5, 200):
        values = [rng.lognormvariate(0, 0.1) * 100 for _ in range(n)]
        lo, hi = Spread.of(values).interval
        widths[n], ranges[n] = hi - lo, max(values) - min(values)
    assert ranges[200] > 1.5 * ranges[5]  # min-max, the old rule's interval, widens with the windows
    assert widths[200] <= widths[5]
    assert widths[200] > 0


def test_the_interval_of_the_median_is_the_order_statistics_of_the_sign_test():
    assert median_interval([3, 1, 2]) == (1, 3)  # under 9 values: [min, max]
    assert median_interval(list(range(20))) == (5, 14)  # P(Binomial(20, 1/2) <= 5) = 2.1% per side
    assert median_interval(list(range(9))) == (1, 7)


def test_the_isolation_module_refuses_nothing_silently():
    assert isolation.describe_exit(-9, killed_here=True) == "killed by SIGKILL"  # its caller says why
    assert isolation.describe_exit(3) == "exit code 3"


def _when_hanging(probe, then) -> threading.Thread:
    """A thread that calls `then` once the child reports it hangs (within a minute)."""

    def wait() -> None:
        for _ in range(600):
            if probe_lines(probe):
                return then()
            threading.Event().wait(0.1)

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    return thread


def test_a_child_deaf_to_its_stop_is_killed_after_the_stated_grace(quick, tmp_path, monkeypatch):
    probe = tmp_path / "probe.jsonl"
    monkeypatch.setenv("FASTLAB_PROBE_FILE", str(probe))
    monkeypatch.setattr(isolation, "STOP_GRACE_SECONDS", 1.0)
    stop = threading.Event()
    _when_hanging(probe, stop.set)
    r = fastlab.run(quick, model=isolation_probe.hangs_at_forward, progress=False, stop=stop)
    assert r.status == "failed" and "killed here as it sent nothing for 1 s after a stop" in r.error
    assert fastlab.run(quick, progress=False).ok  # the next run starts a new child


def test_a_second_ctrl_c_kills_the_child(quick, tmp_path, monkeypatch):
    import _thread

    probe = tmp_path / "probe.jsonl"
    monkeypatch.setenv("FASTLAB_PROBE_FILE", str(probe))
    monkeypatch.setattr(isolation, "STOP_GRACE_SECONDS", 600.0)  # only the second Ctrl-C can end it

    def twice() -> None:
        _thread.interrupt_main()  # a Ctrl-C: the child is asked to stop
        threading.Event().wait(0.5)
        _thread.interrupt_main()

    _when_hanging(probe, twice)
    r = fastlab.run(quick, model=isolation_probe.hangs_at_forward, progress=False)
    assert r.status == "failed" and "killed here on a second Ctrl-C" in r.error


def test_a_step_past_the_time_budget_is_ended_mid_step_keeping_the_steps_streamed(quick, tmp_path, monkeypatch):
    """The run's budget holds inside a step: its process (and its DataLoader worker) ends at the budget plus the
    stated grace, not when the step would have finished; the result is time_limited with the finished steps."""
    import time

    import psutil

    probe = tmp_path / "probe.jsonl"
    monkeypatch.setenv("FASTLAB_PROBE_FILE", str(probe))
    monkeypatch.setattr(isolation, "BUDGET_GRACE_SECONDS", 1.0)
    cfg = quick.replace(warmup_steps=1, steps=4, windows=1, max_seconds=1.0, num_workers=1)
    seen: dict = {}

    def note_the_processes() -> None:  # while the third step sleeps: the run's process and its worker
        line = probe_lines(probe)[0]
        seen["at"] = time.monotonic()
        seen["processes"] = [psutil.Process(line["run_pid"]), *psutil.Process(line["run_pid"]).children(True)]

    _when_hanging(probe, note_the_processes)
    r = fastlab.run(cfg, model=isolation_probe.sleeps_at_third_step, progress=False)
    ended = time.monotonic()
    assert r.status == "time_limited" and r.stopped_by == "max_seconds" and r.extras["isolation"] == "process"
    assert r.error.startswith("stopped at its 1 s budget during step 3"), r.error
    # ended within the budget and its grace (the third step alone would have slept 20 s), with a margin for a busy box
    assert ended - seen["at"] < 1.0 + 1.0 + 6.0
    assert r.steps_done == 2 and len(r.step_seconds) == 2 and len(r.data_wait_seconds) == 2
    assert [step for step, _ in r.losses] == [0, 1] and all(loss > 0 for _, loss in r.losses)
    assert r.dataset.get("synthetic") and r.peak_memory_mb > 0 and not r.window_throughput
    assert len(seen["processes"]) >= 2  # the run's process and its DataLoader worker: none goes on running
    _, alive = psutil.wait_procs(seen["processes"], timeout=5)
    assert all(p.status() == psutil.STATUS_ZOMBIE for p in alive), alive


# ---------------------------------------------------------------- a hung loader, and a caller that is killed

def _runs_under(pid: int) -> list:
    """The processes under `pid` that are a run's or its workers: every descendant but multiprocessing's own servers
    (the forkserver and the resource tracker, which serve the caller for its whole life; a run forked from the
    forkserver carries its command line, so the server is told apart as the caller's direct child)."""
    import psutil

    servers = {p.pid for p in psutil.Process(pid).children()
               if any(s in " ".join(p.cmdline()) for s in ("forkserver", "resource_tracker"))}
    return [p for p in psutil.Process(pid).children(recursive=True) if p.pid not in servers]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_hung_loader_ends_the_run_failed_keeping_its_steps_and_leaving_no_process(quick, monkeypatch, workers):
    monkeypatch.setattr(isolation, "DATA_WAIT_FLOOR_SECONDS", 4.0)
    before = {p.pid for p in _runs_under(os.getpid())}
    cfg = quick.replace(loader="dataloader", num_workers=workers, steps=20, windows=4, max_seconds=0.0)
    # each loading process: the harness's sample of the items (fastlab.preflight), four batches, then it blocks
    per_process = len(sampled_indices(512)) + 4 * cfg.batch_size
    t = time.monotonic()
    r = fastlab.run(cfg, dataset=(isolation_probe.HangsAfter(after=per_process), isolation_probe.HangsAfter()),
                    progress=False)
    assert time.monotonic() - t < 120  # bounded: without the bound it waits for the hour the Dataset sleeps
    assert r.status == "failed" and "its loader sent no batch for" in r.error, r.error
    where = "on its DataLoader's 2 worker processes" if workers else "in the run's own process (num_workers=0"
    assert where in r.error and "the loader hung" in r.error
    assert 3 <= r.steps_done < cfg.warmup_steps + cfg.steps and len(r.step_seconds) == r.steps_done  # kept
    time.sleep(1.0)
    assert {p.pid for p in _runs_under(os.getpid())} - before == set()  # the run's process and its workers are gone


def _run_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name == "fastlab-run"]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_hung_loader_in_a_run_in_this_process_is_given_up_on_keeping_its_steps(quick, monkeypatch, workers):
    """A run in a fresh thread of the caller's process (FASTLAB_ISOLATION=thread, or a model defined in a notebook
    cell) cannot be killed: its caller gives up on it at the same bound, ends the workers it started, and says what it
    could not end. The thread, once its item returns, stops at its next batch."""
    monkeypatch.setattr(isolation, "DATA_WAIT_FLOOR_SECONDS", 4.0)
    monkeypatch.setenv("FASTLAB_ISOLATION", "thread")
    isolation_probe.RELEASE.clear()
    # a DataLoader with workers iterated in this (the main) thread first, as a notebook's cell may have: torch then
    # holds a SIGCHLD handler here that raises in this thread when a worker it knows of is killed
    next(iter(torch.utils.data.DataLoader(isolation_probe.HangsAfter(items=4), batch_size=2, num_workers=1)))
    before = {p.pid for p in _runs_under(os.getpid())}
    cfg = quick.replace(loader="dataloader", num_workers=workers, steps=20, windows=10, max_seconds=0.0)
    per_process = len(sampled_indices(512)) + 4 * cfg.batch_size  # the sample, four batches, then it blocks
    dataset = (isolation_probe.HangsAfter(after=per_process, anywhere=True), isolation_probe.HangsAfter())
    t = time.monotonic()
    r = fastlab.run(cfg, dataset=dataset, progress=False)
    assert time.monotonic() - t < 120, r.error  # bounded: without the bound it waits for the hour the item blocks
    assert r.status == "failed" and "its loader sent no batch for" in r.error, r.error
    assert r.extras["isolation"].startswith("in-process (fresh thread): FASTLAB_ISOLATION=thread")
    if workers:
        assert "on its DataLoader's 2 worker processes" in r.error and "its DataLoader workers were ended" in r.error
    else:
        assert "in the run's own process (num_workers=0" in r.error and "cannot be ended from here" in r.error
    assert 3 <= r.steps_done < cfg.warmup_steps + cfg.steps and len(r.step_seconds) == r.steps_done  # kept
    assert len(r.window_seconds) >= 1 and r.timed_seconds > 0
    isolation_probe.RELEASE.set()  # the blocked item returns: the given-up thread ends at its next batch
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _run_threads():
        time.sleep(0.2)
    assert not _run_threads()
    assert {p.pid for p in _runs_under(os.getpid())} - before == set()  # no worker left


def test_a_run_in_this_process_blocked_on_its_loader_is_held_to_its_time_budget(quick, monkeypatch):
    """max_seconds holds while the loader blocks, in a run in the caller's process as in a run's own process."""
    monkeypatch.setenv("FASTLAB_ISOLATION", "thread")
    isolation_probe.RELEASE.clear()
    cfg = quick.replace(loader="dataloader", num_workers=0, steps=20, windows=4, max_seconds=2.0)
    after = len(sampled_indices(512)) + (cfg.warmup_steps + 2) * cfg.batch_size  # two timed steps, then it blocks
    t = time.monotonic()
    try:
        r = fastlab.run(cfg, dataset=(isolation_probe.HangsAfter(after=after, anywhere=True),
                                      isolation_probe.HangsAfter()), progress=False)
    finally:
        isolation_probe.RELEASE.set()
    assert time.monotonic() - t < 60  # the 120 s hung-loader floor is not what ended it
    assert r.status == "time_limited" and r.stopped_by == "max_seconds", (r.status, r.error)
    assert "stopped at its 2 s budget" in r.error and "waiting for a batch, was given up on" in r.error, r.error
    assert r.steps_done == cfg.warmup_steps + 2


def test_a_held_out_evaluation_that_hangs_ends_the_run_failed_keeping_its_steps(quick, monkeypatch):
    """The held-out evaluation runs inside the watch's paused block: a held-out Dataset that hangs there is bounded
    as a hung loader is, and named as the evaluation."""
    monkeypatch.setattr(isolation, "DATA_WAIT_FLOOR_SECONDS", 4.0)
    before = {p.pid for p in _runs_under(os.getpid())}
    cfg = quick.replace(loader="dataloader", num_workers=0, max_seconds=0.0)
    held_out = isolation_probe.HangsAfter(after=len(sampled_indices(512)))  # the run's sample, then it blocks
    t = time.monotonic()
    r = fastlab.run(cfg, dataset=(isolation_probe.HangsAfter(), held_out), progress=False)
    assert time.monotonic() - t < 120 and r.status == "failed", (r.status, r.error)
    assert "its held-out evaluation (a paused block: `with w.paused()`) did not end in" in r.error, r.error
    assert r.steps_done == cfg.warmup_steps + cfg.steps and r.eval_accuracy is None  # every step kept
    time.sleep(1.0)
    assert {p.pid for p in _runs_under(os.getpid())} - before == set()


def test_a_caller_killed_by_sigterm_leaves_no_run_or_worker_behind():
    import psutil

    script = ("import sys; sys.path.insert(0, 'tests'); import isolation_probe; isolation_probe.hung_run_main()")
    caller = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline, run = time.monotonic() + 120, []
        while time.monotonic() < deadline:  # the run's process and its two workers are up, waiting on a hung item
            with contextlib.suppress(psutil.Error):
                run = _runs_under(caller.pid)
            if len(run) >= 3:
                break
            time.sleep(0.5)
        assert len(run) >= 3, [p.cmdline() for p in run]
        caller.send_signal(signal.SIGTERM)
        caller.wait(timeout=30)
        gone, alive = psutil.wait_procs(run, timeout=20)
        assert alive == [], [p.cmdline() for p in alive]
    finally:
        for p in psutil.Process(caller.pid).children(recursive=True) if caller.poll() is None else []:
            p.kill()
        caller.kill()


def test_a_dataset_hung_from_its_first_item_is_bounded_too(quick, monkeypatch):
    """The run's process reads a sample of the reader's items before any timing (fastlab.preflight): a Dataset that
    hangs from the start is bounded there as well, and said to be."""
    monkeypatch.setattr(isolation, "DATA_WAIT_FLOOR_SECONDS", 4.0)
    cfg = quick.replace(loader="dataloader", num_workers=0, max_seconds=0.0)
    t = time.monotonic()
    r = fastlab.run(cfg, dataset=(isolation_probe.HangsAfter(after=0), isolation_probe.HangsAfter()), progress=False)
    assert time.monotonic() - t < 120 and r.status == "failed" and r.steps_done == 0
    assert "or for the items of the Dataset the run checks first" in r.error, r.error
