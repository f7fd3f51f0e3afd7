"""Notebook 08: the thread a run executes in can change its speed on a CPU (a second OpenMP team whose workers
sleep and wake between small ops), measured; why fastlab.run runs every run in a fresh process."""

from __future__ import annotations

import resource
import threading
from typing import Any

import torch

from .. import budget
from ..comparisons import comparison
from ..config import TrainConfig
from ..harness import TrainingRun
from ..isolation import exclusive_run
from ..results import RunResult
from ..train import admitted
from ..verdicts import turns

THREADS = "08_profiling:threads"
WHERE = ("main", "thread")  # the calling thread (a notebook cell's own), a new threading.Thread


def _switches() -> int:
    """Voluntary context switches of the whole process so far: each is a thread going to sleep."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw


def _execute(cfg: TrainConfig, label: str, where: str, progress: bool) -> RunResult:
    """One run, in this thread or in a plain new one; the rest is identical (fastlab.run's own loop)."""
    box: dict[str, Any] = {}
    training = TrainingRun(cfg, label, None, None, progress, None, None)
    if (refused := admitted(training, THREADS)) is not None:  # the notebook's budget: refused, or cut short
        return refused

    def work() -> None:
        box["threads"] = torch.get_num_threads()
        box["result"] = training.execute()

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
    result.comparison = THREADS
    result.extras.update(where=where, torch_threads=box["threads"],
                         switches_per_step=(after - before) / max(result.steps_done, 1))
    return result


def warm_this_thread() -> None:
    """A few torch ops in this thread, as a notebook cell runs: they start its OpenMP team, which stays alive."""
    a = torch.randn(256, 256)
    for _ in range(20):
        a = torch.tanh(a @ a)


@comparison(THREADS, arms=2)  # sized by time; a part of 08's budget
def thread_effect(base: TrainConfig, progress: bool = True, repeats: int = 2) -> list[RunResult]:
    """The same config run in this thread and in a new thread, alternately (`repeats` of each, fewer where the
    notebook's budget caps them), after this thread has run torch ops. In a notebook, call it from a cell: that is
    the kernel's main thread."""
    repeats = min(repeats, budget.repeats_cap() or repeats)
    warm_this_thread()
    results = []
    for i, k in turns(2, repeats):  # this thread, a new one, then the other way round...
        where = WHERE[k]
        results.append(_execute(base, f"{'this' if where == 'main' else 'new'} thread {i + 1}", where, progress))
        if results[-1].status == "interrupted":
            break
    return results


def split_by_thread(results: list[RunResult]) -> tuple[list[RunResult], list[RunResult]]:
    """The runs that finished a timed window: (in this thread, in a new one)."""
    main, other = ([r for r in results if r.extras.get("where") == w and r.window_throughput] for w in WHERE)
    return main, other
