import sys

import pytest
import torch

import fastlab
from fastlab.lessons import threads as T
from fastlab.results import RunResult


def fake(where, speed, switches=1.0):
    return RunResult(config={}, label=where, window_throughput=[0.97 * speed, speed, 1.03 * speed],
                     extras={"where": where, "torch_threads": 2, "switches_per_step": switches})


def test_the_demo_runs_both_ways_alternately_and_records_what_it_measured(quick):
    results = T.thread_effect(quick, progress=False, repeats=1)
    assert [r.extras["where"] for r in results] == ["main", "thread"]
    assert all(r.status == "ok" and r.comparison == T.THREADS for r in results)
    assert all(r.extras["torch_threads"] == torch.get_num_threads() for r in results)
    assert all(r.extras["switches_per_step"] >= 0 for r in results)
    assert fastlab.runs_verdict(*T.split_by_thread(results), interleaved=True).comparable


def test_the_two_threads_take_turns(quick, monkeypatch):
    monkeypatch.setattr(T, "warm_this_thread", lambda: None)
    monkeypatch.setattr(T, "_execute", lambda cfg, label, where, progress: fake(where, 100.0))
    assert [r.label for r in T.thread_effect(quick, progress=False, repeats=3)] == [
        "main", "thread", "thread", "main", "main", "thread"]


def test_the_verdict_comes_from_the_numbers():
    """Notebook 08 prints this verdict: the new thread's runs against this thread's, paired in turns."""
    slower = [fake("main", 3000, 1), fake("thread", 2200, 140), fake("main", 3100, 1), fake("thread", 2300, 150)]
    v = fastlab.runs_verdict(*T.split_by_thread(slower), interleaved=True)
    assert v.direction == "worse" and f"{v.ratio:.2f}" == "0.74"
    same = [fake("main", 3000), fake("thread", 3030), fake("main", 2990), fake("thread", 2980)]
    assert fastlab.runs_verdict(*T.split_by_thread(same), interleaved=True).noise
    assert not fastlab.runs_verdict(*T.split_by_thread(same[:1]), interleaved=True).comparable


@pytest.mark.skipif(not sys.platform.startswith("linux") or "OpenMP" not in torch.__config__.parallel_info()
                    or torch.get_num_threads() < 2, reason="the mechanism shown is libgomp's, with 2+ threads")
def test_in_a_second_team_the_openmp_workers_sleep_between_operations(quick):
    """The mechanism: once this thread has its own OpenMP team, a run in a new thread makes libgomp manage more
    threads than cores, and its workers stop spin-waiting: they sleep (a voluntary context switch) and are woken
    again, over and over in every step. In this thread they spin and rarely sleep."""
    results = T.thread_effect(quick.replace(steps=8, windows=2), progress=False, repeats=1)
    main, other = (r.extras["switches_per_step"] for r in results)
    assert other > 3 * main + 1, (main, other)
