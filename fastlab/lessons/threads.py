"""Notebook 08: the thread a run executes in can change its speed on a CPU. A measured demo, and why.

Every thread that calls into torch gets its own OpenMP team, and the main thread's stays alive once used: a run in
another thread makes a second team, and with more threads than cores libgomp stops idle workers spin-waiting, so
they sleep and wake between small ops. Whether that costs depends on the machine and its load, so fastlab.run
runs every run in a fresh process (fastlab.isolation).
"""

from __future__ import annotations

import resource
import statistics
import threading
from typing import Any

import torch

from ..config import TrainConfig
from ..harness import TrainingRun
from ..isolation import exclusive_run
from ..results import RunResult
from ..verdicts import runs_verdict, turns, verdict

THREADS = "08_profiling:threads"
WHERE = {"main": "the calling thread (a notebook cell's own thread)", "thread": "a new threading.Thread"}


def _switches() -> int:
    """Voluntary context switches of the whole process so far: each is a thread going to sleep."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw


def _execute(cfg: TrainConfig, label: str, where: str, progress: bool) -> RunResult:
    """One run, in this thread or in a plain new one; the rest is identical (fastlab.run's own loop)."""
    box: dict[str, Any] = {}

    def work() -> None:
        box["threads"] = torch.get_num_threads()
        box["result"] = TrainingRun(cfg, label, None, None, progress, None, None).execute()

    with exclusive_run(label):  # one run at a time in this process, as fastlab.run does
        before = _switches()
        if where == "main":
            work()
        else:
            thread = threading.Thread(target=work, name="fastlab-thread-demo")
            thread.start()
            thread.join()
        after = _switches()
    result: RunResult = box["result"]
    result.extras.update(where=where, torch_threads=box["threads"],
                         switches_per_step=(after - before) / max(result.steps_done, 1))
    result.extras["comparison"] = THREADS
    return result


def warm_this_thread() -> None:
    """A few torch ops in this thread, as a notebook cell runs: they start its OpenMP team, which stays alive."""
    a = torch.randn(256, 256)
    for _ in range(20):
        a = torch.tanh(a @ a)


def thread_effect(base: TrainConfig, progress: bool = True, repeats: int = 2) -> list[RunResult]:
    """The same config run in this thread and in a new thread, alternately (`repeats` of each), after this
    thread has run torch ops. In a notebook, call it from a cell: that is the kernel's main thread."""
    warm_this_thread()
    results = []
    for i, k in turns(2, repeats):  # this thread, a new one, then the other way round...
        where = ("main", "thread")[k]
        results.append(_execute(base, f"{'this' if where == 'main' else 'new'} thread {i + 1}", where, progress))
        if results[-1].status == "interrupted":
            return results
    return results


def split_by_thread(results: list[RunResult]) -> tuple[list[RunResult], list[RunResult]]:
    main = [r for r in results if r.extras.get("where") == "main" and r.window_throughput]
    other = [r for r in results if r.extras.get("where") == "thread" and r.window_throughput]
    return main, other


def describe_thread_effect(results: list[RunResult]) -> str:
    """The verdict from the measurement: the new thread's speed against this thread's, pair by pair."""
    main, other = split_by_thread(results)
    if not main or not other:
        return "Not enough finished runs to compare the two threads."
    ratios = [verdict(m.throughput, o.throughput).ratio for m, o in zip(main, other)]
    pooled = runs_verdict(main, other, interleaved=True)  # noise unless every pair shows the same difference
    main_all, other_all, ratio = pooled.base, pooled.other, pooled.ratio
    noise = pooled.direction in ("noise", "not_comparable")
    pairs = ", ".join(f"{r:.2f}x" for r in ratios)
    head = (f"In a new thread: {other_all.median:,.0f} images/s; in this thread: {main_all.median:,.0f} "
            f"(median over {len(other)} and {len(main)} runs; pair by pair {pairs}). ")
    if noise:
        said = ("Noise: on this machine, with this config, the thread a run executes in makes no difference "
                   "outside the spread. ")
    else:
        said = (f"The new thread ran at {ratio:.2f}x this thread's speed, outside the noise: "
                   "compare only runs made the same way. ")
    switches = (f"Voluntary context switches per step (threads going to sleep): "
                f"{statistics.median(r.extras['switches_per_step'] for r in other):,.0f} in the new thread, "
                f"{statistics.median(r.extras['switches_per_step'] for r in main):,.0f} in this one. ")
    threads = {r.extras.get("torch_threads") for r in main + other}
    team = (f"torch.get_num_threads() was {threads.pop()} in both, so the team size is not the difference."
            if len(threads) == 1 else f"torch.get_num_threads() differed: {sorted(threads)}.")
    return head + said + switches + team
