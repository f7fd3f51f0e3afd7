"""The profiler wrapper and the notebook-08 lesson logic."""

import json
from types import SimpleNamespace

import pytest

from fastlab import profiling
from fastlab.lessons import profiling_lesson as pl


def test_profile_run_writes_a_trace_and_a_top_ops_table(quick, tmp_path):
    p = profiling.profile_run(quick, label="naive run", steps=2, trace_dir=tmp_path)
    assert p.trace_path.parent == tmp_path and p.trace_path.name == "naive_run.pt.trace.json"
    events = json.loads(p.trace_path.read_text())["traceEvents"]
    assert any(e.get("name", "").startswith("ProfilerStep") for e in events)
    assert p.top_ops and not any(r.name.startswith("ProfilerStep") for r in p.top_ops)
    values = [r.self_cpu_ms for r in p.top_ops]
    assert values == sorted(values, reverse=True)
    assert len(p.profiled_steps) == 2 and len(p.profile_step_ms) == 2
    assert all(d > 0 for d in p.dataloader_ms)  # the DataLoader fetch shows up inside each recorded step
    data, compute = p.data_vs_compute_ms()
    assert len(data) == len(compute) == 2 and 0 <= p.data_share() <= 1
    assert p.table(3).count("\n") == 3
    with pytest.raises(ValueError, match="n=0"):
        p.table(0)
    with pytest.raises(ValueError, match="steps=0"):
        profiling.profile_run(quick, steps=0)


def _event(name, start, end):
    return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, end=end))


def test_step_split_counts_only_the_fetch_time_inside_each_step():
    events = [_event("ProfilerStep#2", 1000, 2000), _event("ProfilerStep#1", 0, 1000),
              _event("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 100, 400),
              _event("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 900, 1200),
              _event("aten::conv2d", 400, 900)]
    spans, data = profiling._step_split(events)
    assert spans == [1.0, 1.0]  # microseconds in the trace -> ms, steps in time order
    assert data == [pytest.approx(0.4), pytest.approx(0.2)]  # a fetch crossing a step boundary is split


def test_tuned_differs_from_naive_in_the_data_path(smoke):
    naive, tuned = pl.naive_and_tuned(smoke)
    assert naive.loader == "dataloader" and naive.opt_impl == "for-loop" and naive.log_every == 1
    assert tuned.loader == "device" and tuned.batch_size == naive.batch_size
    assert naive.diff(tuned) == pl.tuned_changes(smoke)


def test_safe_name_keeps_trace_files_plain():
    assert profiling.safe_name("tuned: loader=device, log_every=10") == "tuned_loader_device_log_every_10"
    assert profiling.safe_name("///") == "run"
