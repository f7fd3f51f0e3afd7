"""Issue 27: bf16 judged from the CPU, traps shown in one short run, no-op arms not trained, runs sized by time.

No test here trains: runs are faked (RunResults built from the config they were given), the CPU's capability
and the calibration's step times are mocked.
"""

import datetime
import json

import pytest
import torch

import fastlab
import fastlab.train
from fastlab import bench, calibration, config, loop_instruments, measure
from fastlab.config import config_for, plan_arm
from fastlab.lessons import kernels, mixed_precision
from fastlab.profiles import PROFILES
from fastlab.run_limits import RunLimits
from fastlab.train import interleave

CPU = torch.device("cpu")
AVX2_FLAGS = "fpu sse sse2 avx avx2 fma"
AVX512_BF16_FLAGS = "fpu sse sse2 avx avx2 avx512f avx512bw avx512_bf16"


def fake_run(seen):
    """A stand-in for fastlab.run: records the config and returns a result of four 100 images/s windows."""

    def run(cfg, label="run", progress=True, **kwargs):
        seen.append((label, cfg))
        return fastlab.RunResult(config=cfg.to_dict(), label=label, window_throughput=[100.0] * 4,
                                 step_seconds=[0.1] * (cfg.warmup_steps + cfg.steps), images_per_step=cfg.batch_size)

    return run


# ---------------------------------------------------------------- 1. bf16 from the CPU's capability


def test_native_bf16_is_read_from_the_cpu_flags():
    assert measure.cpu_native_bf16(set(AVX512_BF16_FLAGS.split()))
    assert measure.cpu_native_bf16({"avx2", "amx_bf16"})
    assert not measure.cpu_native_bf16(set(AVX2_FLAGS.split()))  # the AMD EPYC with AVX2 only
    text = f"processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: {AVX2_FLAGS}\n"
    assert measure.cpu_model(text) == "AMD EPYC 7B13"
    assert measure.cpu_flags(text) == set(AVX2_FLAGS.split())
    assert measure.cpu_isa() == str(torch.backends.cpu.get_cpu_capability())


@pytest.mark.parametrize("native, preferred", [(True, "bf16"), (False, "off")])
def test_bf16_supported_on_a_cpu_follows_the_cpu_not_the_device_type(native_bf16, native, preferred):
    native_bf16(native)
    assert measure.bf16_supported(CPU) is native
    assert measure.bf16_is_trap(CPU) is (not native)
    assert config.preferred_amp(CPU) == preferred
    # the lessons that compare a half precision keep bf16 where it is a trap: it is shown, as a trap
    assert mixed_precision.low_precision(CPU) == "bf16"
    amp = next(r for r in bench.ladder(config_for("smoke", device="cpu")) if r.name == "amp")
    assert amp.changes == {"amp": "bf16"} and (("known trap" in amp.why) is (not native))


def test_every_environment_names_the_cpu_model_and_isa():
    env = measure.environment(CPU)
    assert env["cpu"] == measure.cpu_model() and env["cpu"] != ""
    assert env["cpu_isa"] == measure.cpu_isa() and isinstance(env["cpu_native_bf16"], bool)


def test_bf16_without_native_support_runs_emulated_with_a_note(native_bf16):
    native_bf16(False)
    runs, no_ops, notes = config.as_run_here(config_for("smoke", amp="bf16"), CPU)
    assert runs.amp == "bf16" and no_ops == {} and "no native bf16" in notes[0]


# ---------------------------------------------------------------- 2. a known trap: one short demonstration run


def test_without_native_bf16_the_bf16_arms_become_one_trap_demonstration(native_bf16, monkeypatch, smoke):
    native_bf16(False)
    seen = []
    monkeypatch.setattr(fastlab.train, "run", fake_run(seen))
    results = mixed_precision.compare_precision(smoke.replace(device="cpu"), progress=False)
    bf16 = [(label, cfg) for label, cfg in seen if cfg.amp == "bf16"]
    assert len(bf16) == 1 and "trap demonstration" in bf16[0][0]
    assert bf16[0][1].steps == config.DEMONSTRATION_STEPS < smoke.steps and bf16[0][1].windows == 1
    assert [cfg.seed for _, cfg in seen if cfg.amp == "off"] == list(mixed_precision.seeds_for(smoke))
    trap = [r for r in results if r.trap and r.config["amp"] == "bf16"]  # (fp16 is a CPU trap too)
    assert len(trap) == 1 and "no native bf16" in trap[0].trap


def test_with_native_bf16_the_bf16_arms_run_as_arms(native_bf16, monkeypatch, smoke):
    native_bf16(True)
    seen = []
    monkeypatch.setattr(fastlab.train, "run", fake_run(seen))
    results = mixed_precision.compare_precision(smoke.replace(device="cpu"), progress=False)
    bf16 = [cfg for _, cfg in seen if cfg.amp == "bf16"]
    assert [cfg.seed for cfg in bf16] == list(mixed_precision.seeds_for(smoke))
    assert all(cfg.steps == smoke.steps for cfg in bf16)
    assert not any(r.trap for r in results if r.config["amp"] == "bf16")


def test_the_ladder_shows_the_bf16_trap_in_one_short_run_and_drops_it(native_bf16, monkeypatch, smoke):
    native_bf16(False)
    seen = []
    monkeypatch.setattr(bench, "run", fake_run(seen))
    monkeypatch.setattr(fastlab.train, "run", fake_run(seen))  # the trap's demonstration run
    base = smoke.replace(device="cpu")
    results = bench.run_ladder(base, bench.select_rungs(bench.ladder(base), only=["amp", "channels_last"]),
                               progress=False)
    amp = next(r for r in results if r.rung == "amp")
    assert amp.config["steps"] == config.DEMONSTRATION_STEPS and "trap" in amp.dropped
    assert results[-1].config["amp"] == "off"  # not carried up


def test_fp16_autocast_on_a_cpu_is_a_trap_shown_once_and_bounded_in_time(native_bf16, monkeypatch, smoke):
    native_bf16(True)  # even where bf16 is native: a CPU's fp16 is the trap (seen at tens of seconds a step)
    from fastlab.config import trap_reasons

    assert "fp16 autocast on a CPU" in trap_reasons(smoke.replace(amp="fp16"), CPU)["amp"]
    assert trap_reasons(smoke.replace(amp="fp16"), "cuda") == {}  # fp16 + GradScaler is the GPU recipe
    seen = []
    monkeypatch.setattr(fastlab.train, "run", fake_run(seen))
    results = mixed_precision.compare_precision(smoke.replace(device="cpu"), progress=False)
    fp16 = [cfg for label, cfg in seen if cfg.amp == "fp16"]
    assert len(fp16) == 1 and fp16[0].max_seconds == config.DEMONSTRATION_SECONDS
    assert fp16[0].eval_images == config.DEMONSTRATION_EVAL_IMAGES
    assert [r.extras["variant"] for r in results if r.trap] == ["fp16 + GradScaler"]
    # a demonstration never runs longer than the arm's own budget either
    assert config.demonstration_config(smoke.replace(max_seconds=4.0)).max_seconds == 4.0
    assert config.demonstration_config(smoke.replace(max_seconds=0.0)).max_seconds == config.DEMONSTRATION_SECONDS


# ---------------------------------------------------------------- 3. no run that can teach nothing


def test_a_comparison_whose_changes_are_all_no_ops_trains_nothing_and_says_why(monkeypatch, smoke):
    seen = []
    monkeypatch.setattr(fastlab.train, "run", fake_run(seen))
    results = kernels.compare_cudnn_benchmark(smoke.replace(device="cpu"), progress=False)
    assert {label for label, _ in seen} == {"cudnn.benchmark off"}  # the baseline only (in each repeat)
    idle = results[1]
    assert idle.status == "no_op" and not idle.window_throughput and "cudnn_benchmark" in idle.no_ops
    assert "cuDNN runs only on NVIDIA GPUs" in idle.error and "NOT TRAINED" in idle.summary()
    # undoing a knob that is a no-op here is a no-op too (either direction)
    assert plan_arm(smoke.replace(tf32=False), smoke, CPU).kind == "no-op"
    assert plan_arm(smoke, smoke.replace(channels_last=True), CPU).kind == "train"
    assert plan_arm(smoke, smoke.replace(cudnn_benchmark=True, channels_last=True), CPU).kind == "train"


@pytest.mark.parametrize("amx_fp16", [False, True])
def test_tf32_comparison_on_a_cpu_does_not_train_conv_tf32(monkeypatch, smoke, amx_fp16):
    seen = []
    monkeypatch.setattr(fastlab.train, "run", fake_run(seen))
    monkeypatch.setattr("fastlab.config.cpu_flags", lambda: {"avx2", "avx512bw", "avx512vl", "avx512dq"}
                        | ({"amx_fp16"} if amx_fp16 else set()))
    results = kernels.compare_tf32(smoke.replace(device="cpu"), progress=False)
    # conv TF32 is a no-op on a CPU; TF32 matmuls (matmul_precision="high") act only on a CPU with AMX-FP16
    assert len(seen) == (2 if amx_fp16 else 1) * fastlab.config.comparison_repeats(smoke)
    assert [r.status for r in results] == ["ok", "no_op", "ok" if amx_fp16 else "no_op"]


def test_the_throughput_ladder_does_not_train_a_rung_of_no_ops(monkeypatch, smoke):
    seen = []
    monkeypatch.setattr(bench, "run", fake_run(seen))
    base = smoke.replace(device="cpu")
    results = bench.run_ladder(base, bench.select_rungs(bench.ladder(base), only=["cudnn", "channels_last"]),
                               progress=False)
    assert list(dict.fromkeys(label for label, _ in seen)) == ["naive", "+channels_last"]
    cudnn = next(r for r in results if r.rung == "cudnn")
    assert cudnn.status == "no_op" and "cuDNN" in cudnn.error
    assert "no_op: every change is a no-op here (cudnn_benchmark: cuDNN" in bench.markdown_table(results)


def test_interleave_keeps_a_changed_arm_and_stops_when_interrupted(smoke, monkeypatch):
    calls = []

    def interrupted(cfg, label="run", progress=True, comparison=None):
        calls.append(label)
        return fastlab.RunResult(config=cfg.to_dict(), label=label, status="interrupted")

    monkeypatch.setattr(fastlab.train, "run", interrupted)
    out = interleave([("a", smoke), ("b", smoke.replace(channels_last=True))], seeds=(0, 1), device=CPU)
    assert calls == ["a (seed 0)"] and out[0].extras["variant"] == "a"


# ---------------------------------------------------------------- 4. runs sized by time


@pytest.fixture
def calibration_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTLAB_CALIBRATION_CACHE", str(tmp_path / "calibration.json"))
    monkeypatch.setattr(calibration, "_KERNEL_CACHE", {})
    return tmp_path / "calibration.json"


def test_the_calibrated_steps_follow_the_measured_step_time(calibration_cache, monkeypatch):
    cpu = config_for("cpu", device="cpu", dataset="synthetic")
    fast, _ = calibration.sized(cpu, arms=2, measure=lambda cfg: [0.10, 0.11, 0.09])
    monkeypatch.setattr(calibration, "_KERNEL_CACHE", {})
    monkeypatch.setattr(calibration, "fingerprint", lambda device: {"cpu_model": "a slower CPU"})
    slow, record = calibration.sized(cpu, arms=2, measure=lambda cfg: [0.40, 0.40, 0.40])
    sizing = fastlab.config.time_sizing("cpu")
    assert fast.steps == min(sizing["max_steps"], int(sizing["run_seconds"] / 0.10))
    assert slow.steps == max(sizing["min_steps"], int(sizing["run_seconds"] / 0.40)) < fast.steps
    assert record["step_seconds"] == 0.40 and record["steps"] == slow.steps
    assert record["fingerprint"] == {"cpu_model": "a slower CPU"} and record["profile_steps"] == cpu.steps


def test_a_calibration_is_measured_once_per_machine_and_cached_with_its_fingerprint(calibration_cache,
                                                                                     monkeypatch):
    cpu = config_for("cpu", device="cpu", dataset="synthetic")
    measured = []

    def measure_once(cfg):
        measured.append(cfg)
        return [0.2] * 4

    first = calibration.calibrate(cpu, measure_once)
    assert first.fingerprint["cpu_model"] == measure.cpu_model() and "cpu_isa" in first.fingerprint
    monkeypatch.setattr(calibration, "_KERNEL_CACHE", {})  # a new kernel on the same machine: read from disk
    again = calibration.calibrate(cpu, measure_once)
    assert len(measured) == 1 and again.source == "cache" and again.step_seconds == first.step_seconds
    monkeypatch.setattr(measure, "cpu_model", lambda text=None: "another CPU")  # another machine: measured anew
    calibration.calibrate(cpu, measure_once)
    assert len(measured) == 2


def test_a_cached_calibration_is_stale_when_old_or_measured_at_another_load():
    now = datetime.datetime(2026, 12, 6, 12, tzinfo=datetime.timezone.utc)

    def entry(days_ago, load):
        return {"measured_at": (now - datetime.timedelta(days=days_ago)).isoformat(), "load_per_cpu": load,
                "step_seconds": 0.2}

    assert calibration.stale(entry(1, 0.2), now, 0.3) is None
    assert calibration.stale(entry(1, None), now, 3.0) is None  # an entry from before loads were kept: by age only
    assert calibration.stale(entry(1, 0.2), now, None) is None  # no load average here (Windows): by age only
    assert "days ago" in calibration.stale(entry(calibration.MAX_AGE.days + 1, 0.2), now, 0.2)
    assert "load of 3.0 per CPU, 0.1 now" in calibration.stale(entry(0, 3.0), now, 0.1)  # timed under load
    assert "unknown" in calibration.stale({"load_per_cpu": 0.2, "step_seconds": 0.2}, now, 0.2)


@pytest.mark.parametrize("seconds", ["0.2", 0, -1, float("nan"), float("inf"), None, True])
def test_a_cached_step_time_that_is_not_a_positive_number_is_measured_again_in_one_line(calibration_cache,
                                                                                         monkeypatch, capsys, seconds):
    """A damaged entry would size every run to its maximum (0, -1, NaN) or fail mid-notebook (a string)."""
    cpu = config_for("cpu", device="cpu", dataset="synthetic")
    calibration.calibrate(cpu, lambda cfg: [0.2] * 4)
    entries = json.loads(calibration_cache.read_text())
    (key,) = entries
    entries[key]["step_seconds"] = seconds
    calibration_cache.write_text(json.dumps(entries))
    monkeypatch.setattr(calibration, "_KERNEL_CACHE", {})
    capsys.readouterr()
    again = calibration.calibrate(cpu, lambda cfg: [0.3] * 4)
    assert again.source == "measured" and again.step_seconds == 0.3
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and str(calibration_cache) in out and "not a positive number" in out, out


@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe\x00", b"[1, 2]"])
def test_a_calibration_cache_that_is_not_one_is_kept_aside_not_overwritten(calibration_cache, monkeypatch, capsys,
                                                                           content):
    calibration_cache.write_bytes(content)
    cpu = config_for("cpu", device="cpu", dataset="synthetic")
    cal = calibration.calibrate(cpu, lambda cfg: [0.3] * 4)
    assert cal.source == "measured"
    asides = [p for p in calibration_cache.parent.iterdir() if ".unreadable-" in p.name]
    assert len(asides) == 1 and asides[0].read_bytes() == content  # kept, whole
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and str(calibration_cache) in out and asides[0].name in out, out
    assert key_count(calibration_cache) == 1  # the new cache holds the new calibration


def key_count(path) -> int:
    return len(json.loads(path.read_text()))


def test_a_stale_cached_calibration_is_measured_again(calibration_cache, monkeypatch):
    cpu = config_for("cpu", device="cpu", dataset="synthetic")
    monkeypatch.setattr(calibration, "load_per_cpu", lambda: 3.0)  # four other jobs on a 2-core machine
    busy = calibration.calibrate(cpu, lambda cfg: [0.8] * 4)
    assert busy.load_per_cpu == 3.0
    monkeypatch.setattr(calibration, "_KERNEL_CACHE", {})
    monkeypatch.setattr(calibration, "load_per_cpu", lambda: 0.1)  # the others finished
    idle = calibration.calibrate(cpu, lambda cfg: [0.2] * 4)
    assert idle.source == "measured" and idle.step_seconds == 0.2
    monkeypatch.setattr(calibration, "_KERNEL_CACHE", {})
    assert calibration.calibrate(cpu, lambda cfg: [9.9] * 4).source == "cache"  # same load: kept


def test_every_arm_of_a_comparison_gets_the_same_calibrated_steps(calibration_cache, monkeypatch):
    seen = []
    monkeypatch.setattr(fastlab.train, "run", fake_run(seen))
    monkeypatch.setattr(calibration, "measure_step_seconds", lambda cfg: [0.25] * 4)
    cpu = config_for("cpu", device="cpu", dataset="synthetic")
    results = kernels.compare_channels_last(cpu, progress=False)
    steps = {cfg.steps for _, cfg in seen if "trap" not in _}
    runs = 4 * fastlab.config.comparison_repeats(cpu)  # 4 arms, each repeated (interleaved)
    expected = calibration.steps_for(calibration.calibrate(cpu), calibration.seconds_per_run("cpu", runs), "cpu")
    assert steps == {expected} and expected != cpu.steps
    assert all(r.extras["calibration"]["steps"] == expected for r in results)


def test_smoke_keeps_its_fixed_steps(monkeypatch):
    def never(cfg):
        raise AssertionError("smoke must not calibrate")

    smoke = config_for("smoke")
    assert calibration.sized(smoke, arms=3, measure=never) == (smoke, None)
    with pytest.raises(ValueError, match="arms=0 is not allowed"):
        calibration.seconds_per_run("cpu", 0)


def test_compare_and_sweep_do_not_train_a_no_op_change(monkeypatch, smoke):
    seen = []
    monkeypatch.setattr(fastlab.train, "run", fake_run(seen))
    base = smoke.replace(device="cpu")
    results = fastlab.train.compare(base, progress=False, comparison="x:y", cudnn_benchmark=True)
    assert {label for label, _ in seen} == {"baseline"} and results[1].status == "no_op"
    assert results[1].comparison == "x:y"
    swept = fastlab.train.sweep("pin_memory", [False, True], base, progress=False)
    assert [r.status for r in swept] == ["ok", "no_op"] and "pin_memory" in swept[1].error
    before = len(seen)
    fastlab.train.sweep("channels_last", [False, True], base, progress=False)
    assert list(dict.fromkeys(label for label, _ in seen[before:])) == ["channels_last=False", "channels_last=True"]


def test_the_bench_ladder_sizes_every_rung_alike_and_records_the_calibration(calibration_cache, monkeypatch,
                                                                            tmp_path):
    seen = []
    monkeypatch.setattr(bench, "run", fake_run(seen))
    monkeypatch.setattr(bench, "write_report", lambda path: None)
    monkeypatch.setattr(calibration, "measure_step_seconds", lambda cfg: [0.5] * 4)
    out = bench.bench(tmp_path / "b", profile="cpu", only=["workers", "channels_last"], progress=False)
    doc = fastlab.results.load_document(out / "results.json")
    steps = {cfg.steps for _, cfg in seen}
    assert steps == {doc["meta"]["calibration"]["steps"]} and doc["meta"]["calibration"]["step_seconds"] == 0.5


# ---------------------------------------------------------------- 5. thorough on request


def test_thorough_on_request_scales_the_time_and_the_seeds(monkeypatch, tmp_path):
    from notebook_timings import record_timing

    from fastlab import config
    from fastlab.tools import timings

    fast = config.time_sizing("cpu")
    monkeypatch.setenv("FASTLAB_THOROUGH", "1")
    slow = config.time_sizing("cpu")
    assert slow["run_seconds"] == fast["run_seconds"] * config.THOROUGH_SCALE > fast["run_seconds"]
    assert config.time_sizing("smoke") is None  # smoke stays fixed: nbval's outputs
    assert mixed_precision.seeds_for(config_for("cpu")) == config.THOROUGH_SEEDS
    assert mixed_precision.seeds_for(config_for("smoke")) == PROFILES["smoke"].precision_seeds
    monkeypatch.setenv("FASTLAB_TIMINGS", str(tmp_path / "timings.json"))
    assert "FASTLAB_THOROUGH=1" in timings.notebook_time("02_mixed_precision", "cpu")
    assert "not measured yet)" in timings.notebook_time("02_mixed_precision", "cpu")
    record_timing(tmp_path / "timings.json", "02_mixed_precision", "cpu-thorough", 600.0, "ok", "CPU (x)")
    assert "(it took 10.0 min on CPU (x))" in timings.notebook_time("02_mixed_precision", "cpu")
    assert "THOROUGH" not in timings.notebook_time("02_mixed_precision", "smoke")
    monkeypatch.setenv("FASTLAB_THOROUGH", "very")
    with pytest.raises(ValueError, match="FASTLAB_THOROUGH='very' is not allowed"):
        config.thorough()


def test_a_rung_above_an_untrained_one_is_judged_against_the_rung_that_ran(smoke):
    from fastlab.lessons import all_together
    from fastlab.outcomes import built_on
    from fastlab.train import not_trained

    cfg = smoke.replace(device="cpu")

    def ran(label, speed, **changes):
        return fastlab.RunResult(config=cfg.replace(**changes).to_dict(), label=label, window_throughput=[speed] * 3,
                                 peak_memory_mb=100.0, rung=label)

    idle = not_trained(cfg.replace(cudnn_benchmark=True), "+cudnn", "cudnn_benchmark: no cuDNN here")
    results = [ran("naive", 100.0), idle, ran("+channels_last", 300.0, cudnn_benchmark=True, channels_last=True)]
    assert built_on(results, 2) is results[0]
    assert built_on(results, 1) is results[0] and results[1].summary().startswith("+cudnn: NOT TRAINED")
    assert all_together.total_speedup(results) == pytest.approx(3.0)
    assert str(fastlab.verdict(results[0].throughput, results[2].throughput)).startswith("3.00x (faster)")


def test_calibration_on_a_cuda_clock_times_synchronised_steps_not_launches(monkeypatch):
    import importlib
    from types import SimpleNamespace

    from fastlab.results import RunResult

    watch = importlib.import_module("fastlab.watch")  # the module (fastlab.watch is also the function)

    host, gpu = [0.0], [0.0]  # a pretend CUDA device: a step launches in 1 ms, its kernels run 30 ms

    def sync(device) -> None:
        host[0] = max(host[0], gpu[0])

    class Meter:  # no CUDA allocator here
        kind = "cuda_max_allocated"

        def __init__(self, device) -> None:
            pass

        def sample(self) -> float:
            return 0.0

        peak = reset = sample

    class Util:
        samples, unavailable = [], ""

        def __init__(self, device) -> None:
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            pass

    monkeypatch.setattr(watch, "synchronize", sync)
    monkeypatch.setattr(watch, "time", SimpleNamespace(perf_counter=lambda: host[0], process_time=lambda: 0.0))
    monkeypatch.setattr(loop_instruments, "MemoryMeter", Meter)
    monkeypatch.setattr(watch, "GpuUtilSampler", Util)

    def fake_run(cfg, label="run", progress=True):  # the watch fastlab.run measures with, on the pretend device
        res = RunResult(config=cfg.to_dict(), label=label, images_per_step=cfg.batch_size)
        w = watch.Watch(label, device=torch.device("cuda"), warmup_steps=cfg.warmup_steps,
                        limits=RunLimits(steps=cfg.steps, windows=cfg.windows, result=res))
        for _ in range(cfg.warmup_steps + cfg.steps):
            gpu[0] = max(gpu[0], host[0]) + 0.030
            host[0] += 0.001
            w.step_done(cfg.batch_size)
        return w.result()

    monkeypatch.setattr(fastlab.train, "run", fake_run)
    seconds = calibration.measure_step_seconds(config_for("gpu", device="cpu"))
    assert seconds == pytest.approx([0.030] * calibration.CALIBRATION_STEPS)
