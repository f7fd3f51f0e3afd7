"""fastlab.distributed: the batch/lr arithmetic, sharding, the cross-rank checks, the launcher's timeout and
error reports, and real torchrun launches of 2 CPU processes under gloo (one that trains, one that crashes)."""

import os
import signal
import sys
import time
import warnings
from pathlib import Path

import psutil
import pytest
import torch

from fastlab import distributed
from fastlab.distributed import (
    DDPJob,
    DDPOptions,
    DistributedRunError,
    _jobs_from_args,
    _launch_error,
    _parse_args,
    combine,
    launch,
    main,
    plan_batches,
    run_ddp,
    run_with_timeout,
    torchrun_command,
    window_throughput,
)
from fastlab.lessons import ddp as lesson
from fastlab.parallel import compare_across_ranks, shard_indices
from fastlab.results import RunResult

# ------------------------------------------------------------------ arithmetic


def test_per_rank_batch_grows_the_global_batch_and_scales_the_lr(smoke):
    cfg = smoke.replace(batch_size=32, grad_accum_steps=2, lr=0.01)
    plan = plan_batches(cfg, 4, DDPOptions(lr_scaling="linear"))
    assert (plan.per_rank_batch, plan.global_batch) == (32, 32 * 2 * 4)
    assert plan.lr == pytest.approx(0.04)
    assert plan_batches(cfg, 4, DDPOptions(lr_scaling="sqrt")).lr == pytest.approx(0.02)
    assert plan_batches(cfg, 4).lr == 0.01  # no scaling unless asked
    assert "global batch 256" in plan.describe()


def test_global_batch_mode_splits_the_batch_and_keeps_the_lr(smoke):
    cfg = smoke.replace(batch_size=48, lr=0.01)
    plan = plan_batches(cfg, 3, DDPOptions(batch="global", lr_scaling="linear"))
    assert (plan.per_rank_batch, plan.global_batch, plan.lr) == (16, 48, 0.01)
    with pytest.raises(ValueError, match=r"TrainConfig.batch_size=48 .*multiple of 5"):
        plan_batches(cfg, 5, DDPOptions(batch="global"))
    with pytest.raises(ValueError, match="world_size=0"):
        plan_batches(cfg, 0)


def test_options_reject_bad_values_naming_the_field():
    with pytest.raises(ValueError, match=r"DDPOptions.batch='huge' .*'per_rank', 'global'"):
        DDPOptions(batch="huge")
    with pytest.raises(ValueError, match=r"DDPOptions.backend='mpi'"):
        DDPOptions(backend="mpi")
    with pytest.raises(ValueError, match=r"DDPOptions.bucket_cap_mb=0"):
        DDPOptions(bucket_cap_mb=0)
    with pytest.raises(ValueError, match=r"DDPOptions.no_sync='yes'"):
        DDPOptions(no_sync="yes")


def test_shards_are_disjoint_equal_and_in_range():
    shards = [shard_indices(103, r, 4) for r in range(4)]
    assert {len(s) for s in shards} == {25}
    flat = [i for s in shards for i in s]
    assert len(set(flat)) == len(flat) == 100 and max(flat) < 103
    with pytest.raises(ValueError, match="rank=4"):
        shard_indices(10, 4, 4)
    with pytest.raises(ValueError, match="raise train_images"):
        shard_indices(3, 0, 4)


def test_compare_across_ranks_finds_a_difference():
    a = torch.arange(6, dtype=torch.float32)
    same = compare_across_ranks([a, a.clone()])
    assert same["identical"] and same["max_abs_diff"] == 0.0 and same["checksums"][0] == same["checksums"][1]
    b = a.clone()
    b[3] += 0.25
    diff = compare_across_ranks([a, a.clone(), b])
    assert not diff["identical"] and diff["max_abs_diff"] == 0.25 and diff["per_rank_max_abs_diff"] == [0, 0, 0.25]


def test_the_slowest_rank_sets_the_throughput():
    # rank 1 is slower in window 0, rank 0 in window 1
    assert window_throughput(64, [5, 3], [[1.0, 2.0], [1.6, 1.5]]) == [64 * 5 / 1.6, 64 * 3 / 2.0]


def _rank_result(rank: int, seconds: list[float], peak: float) -> RunResult:
    cfg = {"warmup_steps": 1, "steps": 4, "windows": 2, "batch_size": 8}
    ddp = {"world_size": 2, "rank": rank, "backend": "gloo", "global_batch": 16, "per_rank_batch": 8}
    return RunResult(config=cfg, label=f"rank {rank}", images_per_step=8, steps_done=5, peak_memory_mb=peak,
                     window_throughput=[8 * 2 / s for s in seconds],
                     window_seconds=seconds, extras={"ddp": ddp}, env={"device_name": "cpu"})


def test_combine_counts_global_images_over_the_slowest_rank():
    whole = combine([_rank_result(0, [1.0, 2.0], 100.0), _rank_result(1, [1.5, 1.0], 120.0)], "x2")
    assert whole.images_per_step == 16
    assert whole.window_throughput == [16 * 2 / 1.5, 16 * 2 / 2.0]
    assert whole.peak_memory_mb == 120.0 and whole.env["world_size"] == 2
    # each rank's own median images/s: rank 0 ran 16 and 8, rank 1 ran 16/1.5 and 16
    assert whole.extras["ddp"]["per_rank_throughput"] == [12.0, pytest.approx((16 / 1.5 + 16) / 2)]


def test_scaling_efficiency_and_noise():
    def result(n: int, windows: list[float]) -> RunResult:
        return RunResult(config={}, window_throughput=windows, extras={"ddp": {"world_size": n}})

    s = lesson.scaling_of(result(1, [100, 90, 110]), result(2, [150, 160, 140]))
    assert s.processes == 2 and s.speedup.median == pytest.approx(1.5) and s.efficiency.median == pytest.approx(0.75)
    assert s.speedup.low == pytest.approx(140 / 110) and s.speedup.high == pytest.approx(160 / 90)
    assert not s.noise
    assert lesson.scaling_of(result(1, [100, 90, 110]), result(2, [105, 95, 115])).noise
    with pytest.raises(ValueError, match="no timed window"):
        lesson.scaling_of(result(1, []), result(2, [1.0]))


# ------------------------------------------------------------------ the launcher


def test_command_uses_this_interpreter_and_a_free_port():
    cmd = torchrun_command(2, ["--out", "x"])
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--standalone" in cmd and "--nproc-per-node=2" in cmd and cmd[-2:] == ["--out", "x"]
    with pytest.raises(ValueError, match="nproc=0"):
        torchrun_command(0, [])


def test_launch_validates_before_starting_anything(smoke, tmp_path):
    with pytest.raises(ValueError, match="crash_rank=2"):
        launch([DDPJob(smoke)], 2, out_dir=tmp_path, crash_rank=2)
    with pytest.raises(ValueError, match="at least one DDPJob"):
        launch([], 2, out_dir=tmp_path)
    assert not (tmp_path / "launch.log").exists()


def test_worker_flags_build_the_job(tmp_path):
    args = _parse_args(["--out", str(tmp_path), "--profile", "smoke", "--steps", "4", "--windows", "2",
                        "--lr-scaling", "linear", "--no-no-sync"])
    (job,) = _jobs_from_args(args)
    assert job.config.profile == "smoke" and (job.config.steps, job.config.windows) == (4, 2)
    assert job.options == DDPOptions(lr_scaling="linear", no_sync=False)


def test_worker_outside_torchrun_says_how_to_start_it(tmp_path, monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(SystemExit, match="start it with torchrun"):
        main(["--out", str(tmp_path)])


def test_timeout_kills_the_whole_process_group(tmp_path):
    # a parent that starts a grandchild, both sleeping: like torchrun and its workers
    pid_file = tmp_path / "child.pid"
    script = ("import subprocess, sys, time; "
              "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
              f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(120)")
    t0 = time.perf_counter()
    code, timed_out, stopped = run_with_timeout([sys.executable, "-c", script], tmp_path / "log", timeout_s=4)
    assert timed_out and not stopped and code != 0
    assert time.perf_counter() - t0 < 20
    child = int(pid_file.read_text())
    time.sleep(0.5)
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


def test_error_names_the_root_cause_rank_not_the_one_that_lost_its_peer(tmp_path):
    (tmp_path / "rank0.error").write_text("Traceback\nRuntimeError: Connection closed by peer")
    (tmp_path / "rank1.error").write_text("Traceback\nRuntimeError: deliberate crash on rank 1 at step 2")
    log = ("Failures:\n[1]:\n  rank      : 0 (local_rank: 0)\n  exitcode  : -15\n"
           "Root Cause (first observed failure):\n[0]:\n  rank      : 1 (local_rank: 1)\n  exitcode  : 1 (pid: 9)\n")
    err = _launch_error(tmp_path, log, 1, False, False, 60, 2)
    assert err.rank == 1 and not err.timed_out
    assert str(err).startswith("rank 1 failed with exit code 1: RuntimeError: deliberate crash on rank 1")
    timed = _launch_error(tmp_path, log, -15, True, False, 60, 2)
    assert timed.timed_out and "timeout_s=60" in str(timed)


@pytest.mark.parametrize(("rank_code", "launches"), [(-6, 2), (-11, 2), (1, 1), (-15, 1)])
def test_only_a_native_crash_is_launched_once_more(monkeypatch, smoke, tmp_path, rank_code, launches):
    calls = []

    def failing(cmd, log_path, timeout_s, **kwargs):
        calls.append(timeout_s)
        log_path.write_text("Root Cause (first observed failure):\n[0]:\n  rank      : 1 (local_rank: 1)\n"
                            f"  exitcode  : {rank_code} (pid: 9)\n")
        return 1, False, False

    monkeypatch.setattr(distributed, "run_with_timeout", failing)
    with warnings.catch_warnings(record=True) as said, pytest.raises(DistributedRunError) as info:
        warnings.simplefilter("always")
        launch([DDPJob(smoke)], 2, out_dir=tmp_path, timeout_s=100)
    assert len(calls) == launches and info.value.rank_exit_code == rank_code
    assert [str(w.message) for w in said if "launching once more" in str(w.message)] == (
        [f"fastlab.distributed: rank 1 failed with exit code {rank_code}: killed by "
         f"{signal.Signals(-rank_code).name}; launching once more"] if launches == 2 else [])
    assert (tmp_path / "launch.first-failure.log").exists() == (launches == 2)

def test_a_rank_killed_by_a_signal_is_named_with_its_native_last_words(tmp_path):
    log = ("[rank 0] job 0: ...\nterminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
           "  what():  [enforce fail at pair.cc:446] op.preamble.length <= op.nbytes. 4 vs 8\n"
           + "torchrun report line\n" * 40 +
           "Root Cause (first observed failure):\n[0]:\n  rank      : 1 (local_rank: 1)\n"
           "  exitcode  : -6 (pid: 9)\n  traceback : Signal 6 (SIGABRT) received by PID 9\n")
    err = _launch_error(tmp_path, log, 1, False, False, 60, 2)
    assert err.rank == 1
    assert "rank 1 failed with exit code -6: killed by SIGABRT after: terminate called" in str(err)
    assert "op.preamble.length <= op.nbytes" in str(err)


# ------------------------------------------------------------------ real launches: 2 CPU processes, gloo


def _our_workers(out: Path) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if str(out) in " ".join(p.info["cmdline"] or []):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def test_two_gloo_ranks_train_and_stay_identical(quick, tmp_path):
    cfg = quick.replace(device="cpu", grad_accum_steps=2)
    jobs = [DDPJob(cfg, DDPOptions(no_sync=True), "dataloader, no_sync"),
            DDPJob(cfg.replace(loader="device"), DDPOptions(no_sync=False), "device loader, every micro-batch")]
    runs = launch(jobs, 2, out_dir=tmp_path, timeout_s=300)
    assert sorted(p.name for p in tmp_path.glob("job[0-9]*.json")) == ["job0.json", "job1.json"]  # rank 0 wrote one each
    for run in runs:
        assert [r.label for r in run.ranks] == ["rank 0", "rank 1"]
        assert all(r.status == "ok" and r.steps_done == cfg.warmup_steps + cfg.steps for r in run.ranks)
        assert run.parameters["identical"] and run.parameters["max_abs_diff"] == 0.0
        assert run.parameters["max_change_from_start"] > 0  # they trained, not merely started equal
        d = run.result.extras["ddp"]
        assert d["world_size"] == 2 and d["backend"] == "gloo"
        assert run.result.images_per_step == 2 * cfg.batch_size * cfg.grad_accum_steps
        assert len(run.result.window_throughput) == cfg.windows and run.result.eval_accuracy is not None
    with_sync, without = (r.result.extras["ddp"] for r in runs)
    # no_sync skips the all-reduce on every micro-batch but the last
    assert without["allreduce_calls_per_step"] == cfg.grad_accum_steps * with_sync["allreduce_calls_per_step"]
    assert without["allreduce_mb_per_step"] == pytest.approx(cfg.grad_accum_steps * with_sync["gradient_mb"])
    assert not _our_workers(tmp_path)


def test_a_crashed_rank_fails_the_launch_quickly_and_clearly(quick, tmp_path):
    t0 = time.perf_counter()
    with pytest.raises(DistributedRunError) as info:
        run_ddp(quick.replace(device="cpu"), 2, out_dir=tmp_path, timeout_s=240, crash_rank=1, crash_step=1)
    err = info.value
    assert err.rank == 1 and not err.timed_out and err.exit_code not in (0, None)
    assert "rank 1 failed" in str(err) and "deliberate crash on rank 1 at step 1" in str(err)
    assert time.perf_counter() - t0 < 240
    assert not list(tmp_path.glob("job[0-9]*.json"))
    assert not _our_workers(tmp_path)


def test_scaling_comparison_is_named_for_its_reference_results():
    assert lesson.scaling.name == lesson.NAME
    assert os.environ["FASTLAB_PROFILE"] == "smoke"


def test_a_command_started_by_a_caller_that_is_killed_ends_with_it(tmp_path):
    """torchrun is started in a session of its own (so a timeout kills its whole group); a caller killed by SIGTERM
    (a kernel shut down) must not leave it running: the kernel ends it with its caller (Linux)."""
    import subprocess

    if not sys.platform.startswith("linux"):
        pytest.skip("the parent-death signal is Linux's")
    script = ("import pathlib, sys; from fastlab.processes import run_with_timeout\n"
              f"run_with_timeout([sys.executable, '-c', 'import time; time.sleep(600)'], "
              f"pathlib.Path({str(tmp_path / 'log')!r}), 600)\n")
    caller = subprocess.Popen([sys.executable, "-c", script], cwd=Path(__file__).resolve().parents[1],
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    try:
        deadline, started = time.monotonic() + 60, []
        while time.monotonic() < deadline and not started:
            started = psutil.Process(caller.pid).children()
            time.sleep(0.2)
        assert started, "the command did not start"
        caller.send_signal(signal.SIGTERM)
        caller.wait(timeout=30)
        _, alive = psutil.wait_procs(started, timeout=10)
        assert alive == []
    finally:
        caller.kill()
