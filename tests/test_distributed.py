"""fastlab.distributed: the batch/lr arithmetic, sharding, the cross-rank checks, the flags that carry a config to
the ranks, reading the ranks' results back, and real torchrun runs of 2 CPU processes under gloo (one that trains,
one that crashes, one killed past its time)."""

import os
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import torch

from fastlab.config import config_for
from fastlab.distributed import (
    DDPOptions,
    DistributedRunError,
    _config_from_args,
    _parse_args,
    combine,
    flags,
    main,
    plan_batches,
    rank_file,
    read_ranks,
    window_throughput,
)
from fastlab.lessons import ddp as lesson
from fastlab.lessons.ddp import torchrun
from fastlab.parallel import compare_across_ranks, shard_indices
from fastlab.results import RunResult, save_results

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


# ------------------------------------------------------------------ the flags and the ranks' files


@pytest.mark.parametrize("changes", [{}, {"steps": 4, "windows": 2, "lr": 0.0125, "channels_last": True},
                                     {"num_workers": 2, "pin_memory": False, "max_seconds": 7.5, "amp": "bf16"}])
@pytest.mark.parametrize("options", [DDPOptions(), DDPOptions(batch="global", lr_scaling="sqrt", no_sync=False,
                                                                sync_batchnorm=True, backend="gloo")])
def test_flags_carry_the_config_and_options_to_the_ranks(changes, options):
    cfg = config_for("smoke", **changes)
    assert _config_from_args(_parse_args(flags(cfg, options))) == (cfg, options)


def test_a_rank_outside_torchrun_says_how_to_start_it(tmp_path, monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(SystemExit, match="start it with torchrun"):
        main(["--out", str(tmp_path)])


def _write_rank(out: Path, rank: int, result: RunResult, world: int = 2) -> None:
    save_results(rank_file(out, rank), [result], meta={"kind": "fastlab.distributed", "rank": rank, "world_size": world})
    time.sleep(0.01)  # the order they were written in is the order of failure


def test_reading_the_ranks_combines_them(tmp_path):
    for r in (1, 0):
        _write_rank(tmp_path, r, _rank_result(r, [1.0, 2.0], 10.0 * (r + 1)))
    run = read_ranks(tmp_path, "x2")
    assert [r.label for r in run.ranks] == ["rank 0", "rank 1"] and run.result.label == "x2"
    assert run.result.peak_memory_mb == 20.0 and run.result.images_per_step == 16


def test_reading_the_ranks_names_the_first_to_fail_not_the_one_that_lost_its_peer(tmp_path):
    _write_rank(tmp_path, 1, RunResult(config={}, label="rank 1", status="failed",
                                       error="RuntimeError: deliberate crash on rank 1 at step 2"))
    _write_rank(tmp_path, 0, RunResult(config={}, label="rank 0", status="failed",
                                       error="RuntimeError: Connection closed by peer"))
    with pytest.raises(DistributedRunError, match=r"^rank 1 failed: RuntimeError: deliberate crash") as info:
        read_ranks(tmp_path)
    assert info.value.rank == 1


def test_reading_the_ranks_names_a_rank_that_wrote_nothing(tmp_path):
    _write_rank(tmp_path, 0, _rank_result(0, [1.0, 2.0], 10.0), world=3)
    with pytest.raises(DistributedRunError, match=r"rank\(s\) 1, 2 wrote no result"):
        read_ranks(tmp_path)
    with pytest.raises(DistributedRunError, match="no rank wrote a result"):
        read_ranks(tmp_path / "empty")


def test_torchrun_refuses_a_bad_nproc_before_starting_anything(smoke, tmp_path):
    with pytest.raises(ValueError, match="nproc=0"):
        torchrun(0, smoke, out=tmp_path / "out")
    assert not (tmp_path / "out").exists()


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
    runs = [torchrun(2, cfg, DDPOptions(no_sync=True), label="dataloader, no_sync", out=tmp_path / "a", quiet=True),
            torchrun(2, cfg.replace(loader="device"), DDPOptions(no_sync=False), label="device loader, every micro-batch",
                     out=tmp_path / "b", quiet=True)]
    for run, out in zip(runs, ("a", "b")):
        assert sorted(p.name for p in (tmp_path / out).glob("rank*.json")) == ["rank0.json", "rank1.json"]
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


def test_the_printed_command_is_the_whole_run(quick, tmp_path, capsys):
    """What notebook 11 shows is what a reader types: the printed line, run alone in a shell, trains the same run."""
    cfg = quick.replace(device="cpu", steps=4, windows=2)
    shown = torchrun(2, cfg, DDPOptions(lr_scaling="linear"), label="shown", out=tmp_path)
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith("$ OMP_NUM_THREADS=1 ") and " -m torch.distributed.run --standalone --nproc-per-node=2 " \
        "-m fastlab.distributed --profile smoke " in line, line
    for f in tmp_path.glob("rank*.json"):
        f.unlink()
    typed = subprocess.run(line[2:], shell=True, capture_output=True, text=True, timeout=300)
    assert typed.returncode == 0, typed.stdout + typed.stderr
    again = read_ranks(tmp_path)
    assert again.result.label == "shown" and again.result.config == shown.result.config
    assert again.result.extras["ddp"]["lr"] == 2 * cfg.lr and again.parameters["identical"]
    assert again.result.steps_done == shown.result.steps_done == cfg.warmup_steps + cfg.steps


def test_a_crashed_rank_fails_the_run_quickly_and_clearly(quick, tmp_path):
    t0 = time.perf_counter()
    with pytest.raises(DistributedRunError) as info:
        torchrun(2, quick.replace(device="cpu"), out=tmp_path, timeout_s=240, quiet=True,
                 also=["--crash-rank", "1", "--crash-step", "1"])
    err = info.value
    assert err.rank == 1 and str(err).startswith("rank 1 failed: RuntimeError: deliberate crash on rank 1 at step 1")
    assert "torchrun exited with code 1" in str(err) and "torchrun.log" in str(err)
    assert time.perf_counter() - t0 < 240
    assert not _our_workers(tmp_path)


def test_a_run_past_its_time_is_killed_with_its_ranks(quick, tmp_path):
    """torchrun starts its ranks in sessions of their own: killing torchrun must end them too (Linux)."""
    cfg = quick.replace(device="cpu", steps=100_000, windows=1, max_seconds=0.0)
    t0 = time.perf_counter()
    with pytest.raises(DistributedRunError, match="did not finish within timeout_s=20 s"):
        torchrun(2, cfg, out=tmp_path, timeout_s=20, quiet=True)
    assert time.perf_counter() - t0 < 40
    assert psutil.wait_procs(_our_workers(tmp_path), timeout=15)[1] == []


def test_scaling_comparison_is_named_for_its_reference_results():
    assert lesson.scaling.name == lesson.NAME
    assert os.environ["FASTLAB_PROFILE"] == "smoke"
