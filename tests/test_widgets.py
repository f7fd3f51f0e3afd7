import dataclasses
import os
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("ipywidgets")

import fastlab  # noqa: E402
from fastlab import widgets  # noqa: E402
from fastlab.plots import plot_comparison  # noqa: E402
from fastlab.results import RunResult  # noqa: E402
from fastlab.widgets import Panel  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_registry():
    """Each test starts with no panels in this process (the registry is per kernel, like a notebook's)."""
    widgets._PANELS.clear()
    yield
    for panel in list(widgets._RUNNING):
        panel.request_stop()
        panel.wait(60)
    widgets._PANELS.clear()


def wait_until(check, timeout=60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.05)
    return False


def fake_result(cfg, label, speed, status="ok"):
    return RunResult(config=cfg.to_dict(), label=label, status=status, steps_done=4, images_per_step=8,
                     window_throughput=[0.98 * speed, speed, 1.02 * speed], memory_kind="process_rss",
                     dataset={"synthetic": True}, env={"device_name": "cpu"})


def fake_runner(speeds, pause=0.0):
    """A runner that measures nothing: each call returns the next speed in `speeds`."""
    speeds = iter(speeds)

    def runner(cfg, *, label, progress, stop, on_step):
        time.sleep(pause)
        on_step(1, 1)
        return fake_result(cfg, label, next(speeds))

    return runner


def test_run_adds_a_result_measured_beside_its_baseline_and_redraws(quick, native_bf16):
    native_bf16(True)  # bf16 trains as an arm here, whatever CPU runs the test
    panel = Panel(quick, {"amp": None, "batch_size": [8, 16], "channels_last": None})
    assert panel.results == [] and panel.image.value == b""
    panel.controls["batch_size"].value = 8
    panel.controls["amp"].value = "bf16"
    panel.run_button.click()
    assert "A/B/A" in panel.status.value  # the cost of pairing is said before it is paid
    panel.wait(120)
    assert len(panel.results) == 1
    r = panel.results[0]
    assert r.status == "ok" and r.config["batch_size"] == 8 and r.config["amp"] == "bf16"
    assert "batch_size=8" in r.label and "amp=bf16" in r.label
    paired = r.extras["paired"]
    assert len(paired["ratios"]) == 2 and paired["label"] in ("noise", f"{paired['ratio']:.2f}x")
    assert "Against the baseline measured beside it" in panel.status.value and "2 baseline runs" in panel.status.value
    assert panel.image.value[:4] == b"\x89PNG"
    assert "images/s" in panel.status.value and not panel.run_button.disabled
    assert "Advice for" in panel.advice.value  # fastlab.advise's findings for the latest run, under the plot
    first_png = panel.image.value
    panel.run_button.click()
    panel.wait(120)
    assert len(panel.results) == 2 and panel.image.value != first_png
    assert panel.count.value == "2 results in the plot"


def test_stop_ends_the_run_interrupted_with_partial_steps(quick):
    panel = Panel(quick.replace(steps=400, windows=4), {"channels_last": None}, pairing="none")
    panel.run_button.click()
    assert wait_until(lambda: panel.progress.value >= 3)
    panel.stop_button.click()
    panel.wait(60)
    assert not panel.running
    r = panel.results[-1]
    assert r.status == "interrupted" and 3 <= r.steps_done < 401
    assert "INTERRUPTED" in panel.status.value


def test_bad_knob_values_are_refused_and_clear_stale_advice(quick):
    panel = Panel(quick, {"num_workers": [0, 2], "prefetch_factor": [None, 4]})
    assert panel.controls["prefetch_factor"].label.startswith("None")  # shown, not blank
    assert panel.current_config().prefetch_factor is None
    panel.advice.value = "advice about the previous run"
    panel.controls["prefetch_factor"].value = 4
    panel.start()
    assert not panel.running and "prefetch_factor=4" in panel.status.value and panel.results == []
    assert panel.advice.value == ""


def test_the_code_under_the_plot_follows_the_knobs_before_run(quick):
    def never(*args, **kwargs):
        raise AssertionError("the diff must not need a run")

    panel = Panel(quick, {"amp": None, "channels_last": None, "loader": None, "num_workers": [0, 2]}, runner=never)
    assert panel.code in panel.widget.children and "no change from the baseline" in panel.code.value
    panel.controls["amp"].value = "fp16"
    shown = panel.code.value
    assert "torch.autocast" in shown and "GradScaler" in shown and "no change" not in shown
    assert fastlab.code_diff(quick, quick.replace(amp="fp16"))._repr_html_() in shown  # the diff itself, computed
    panel.controls["channels_last"].value = True
    assert "memory_format=torch.channels_last" in panel.code.value and "GradScaler" in panel.code.value
    panel.controls["amp"].value, panel.controls["channels_last"].value = "off", False
    assert "no change from the baseline" in panel.code.value
    panel.controls["num_workers"].value = 2
    panel.controls["loader"].value = "device"  # workers with the device loader: refused, with the field and why
    assert "not a valid combination" in panel.code.value and "num_workers=2" in panel.code.value
    assert "Traceback" not in panel.code.value and "torch.autocast" not in panel.code.value
    assert panel.results == [] and not panel.running


def recording_runner(seen, speed=100.0):
    def runner(cfg, *, label, progress, stop, on_step):
        seen.append((label, cfg))
        on_step(1, 1)
        r = fake_result(cfg, label, speed)
        r.step_seconds = [30.0 if cfg.amp == "fp16" else 0.25] * 4  # warm-up step and three timed ones
        r.config["warmup_steps"] = 1
        return r

    return runner


def test_a_change_that_is_a_no_op_here_is_not_trained_and_the_panel_says_why(quick):
    seen = []
    on_cpu = quick.replace(device="cpu")
    panel = Panel(on_cpu, {"cudnn_benchmark": None, "batch_size": [8, 16]}, runner=recording_runner(seen))
    panel.advice.value = "advice about an earlier run"
    panel.controls["cudnn_benchmark"].value = True
    panel.run_button.click()
    assert not panel.running and seen == [] and panel.results == [] and panel.advice.value == ""
    assert "Not trained" in panel.status.value and "cuDNN runs only on NVIDIA GPUs" in panel.status.value
    panel.controls["batch_size"].value = 8  # with a change that does something here, it trains, A/B/A
    panel.run_button.click()
    panel.wait(10)
    assert [cfg.batch_size for _, cfg in seen] == [on_cpu.batch_size, 8, on_cpu.batch_size]
    assert len(panel.results) == 1 and "Not trained" not in panel.status.value


def test_a_known_trap_here_runs_as_one_short_demonstration_beside_full_baselines(quick):
    from fastlab.config import DEMONSTRATION_SECONDS, DEMONSTRATION_STEPS

    seen = []
    on_cpu = quick.replace(device="cpu", steps=40, max_seconds=300.0)
    panel = Panel(on_cpu, {"amp": None}, runner=recording_runner(seen), advice=False)
    panel.controls["amp"].value = "fp16"  # fp16 autocast on a CPU: a known trap (tens of seconds a step, seen)
    panel.run_button.click()
    assert "A known trap here" in panel.status.value  # said before it runs
    panel.wait(10)
    (_, before), (label, demo), (_, after) = seen
    assert before == after == on_cpu
    assert demo.amp == "fp16" and demo.steps == DEMONSTRATION_STEPS and demo.windows == 1
    assert demo.max_seconds == DEMONSTRATION_SECONDS and demo.eval_images < on_cpu.eval_images
    r = panel.results[-1]
    assert "fp16 autocast on a CPU" in r.trap and "paired" in r.extras
    assert "A known trap here (amp: fp16 autocast on a CPU" in panel.status.value
    assert "a median step took 30.00 s against 0.25 s in the baseline beside it" in panel.status.value


def test_unknown_knob_or_pairing_is_rejected_at_build(quick):
    with pytest.raises(ValueError, match="no field 'speed'"):
        Panel(quick, {"speed": [1, 2]})
    with pytest.raises(ValueError, match="pairing='ABBA' is not allowed"):
        Panel(quick, {"amp": None}, pairing="ABBA")


def test_headless_results_are_shown_first(quick):
    first = fastlab.run(quick, progress=False)
    panel = Panel(quick, {"amp": None}, results=[first])
    assert panel.image.value[:4] == b"\x89PNG"


def warm_main_thread():
    """What any notebook cell that touches a tensor does to the kernel's main thread: torch ops there."""
    import torch

    a = torch.randn(256, 256)
    for _ in range(30):
        a = torch.tanh(a @ a)


def test_a_panel_run_and_a_cell_run_go_to_a_fresh_process_the_same_way(quick, monkeypatch):
    """Like for like: a run from the kernel's main thread (after torch ops there) and one from a panel's thread.

    On a CPU a run in the kernel's main thread and one in a widget's thread timed differently (OpenMP keeps a
    thread team per calling thread; see fastlab.lessons.threads), so every run goes to a fresh process. Checked
    here: both send that process the same spec (config, data, environment, thread count, worker start method;
    only the label differs) and both ran there. The thread count is set in the main thread first: torch keeps it
    per thread under OpenMP, so a panel that read it in its own thread would send another. Whether the two then
    time alike is a measurement, not a test: tests/benchmark_panel_vs_cell.py.
    """
    import torch

    from fastlab import isolation

    warm_main_thread()
    sent = []
    real = isolation._run_child
    monkeypatch.setattr(isolation, "_run_child", lambda training, spec: sent.append(spec) or real(training, spec))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        panel = Panel(quick, {"channels_last": None}, pairing="none", advice=False, key="like-for-like")
        panel.run_button.click()
        panel.wait(180)
        cell = fastlab.run(quick, label="cell", progress=False)
    finally:
        torch.set_num_threads(threads)
    from_panel = panel.results[-1]
    assert len(sent) == 2, "each run sends one spec to a fresh process"
    spec_panel, spec_cell = sent
    assert spec_panel.label.startswith("panel 1") and spec_cell.label == "cell"
    assert dataclasses.replace(spec_panel, label="cell") == spec_cell
    assert spec_cell.setup[3] == 1  # the thread count the main thread set, sent by both
    for r in (from_panel, cell):
        assert r.status == "ok" and r.extras["isolation"] == "process" and r.extras["run_pid"] != os.getpid()
        assert r.env["torch_threads"] == 1
    assert from_panel.config == cell.config and from_panel.extras["run_pid"] != cell.extras["run_pid"]


def cpu_hogs():
    """One `while True: pass` process per usable core: a neighbour that takes the whole machine."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def test_a_busy_neighbour_after_page_load_reads_noise_for_unchanged_knobs(smoke):
    # Longer windows than the smoke profile's: a neighbour's contention comes in bursts, which a run must average.
    cfg = smoke.replace(steps=40, windows=4)
    baseline = fastlab.run(cfg, label="baseline", progress=False)  # page load, machine as it is
    panel = Panel(cfg, {"channels_last": None}, results=[baseline], advice=False, key="hog")
    for _attempt in range(3):
        hogs = cpu_hogs()
        try:
            time.sleep(0.5)
            panel.run_button.click()  # nothing changed: only the neighbour
            panel.wait(400)
        finally:
            for hog in hogs:
                hog.kill()
                hog.wait()
        paired = panel.results[-1].extras["paired"]
        if paired["noise"]:
            break
    assert paired["noise"] and "<b>noise</b>" in panel.status.value, "; ".join(
        r.extras["paired"]["label"] + f" (pairs {[round(x, 2) for x in r.extras['paired']['ratios']]})"
        for r in panel.results[1:])


def test_the_panel_says_when_the_machine_got_busier_since_page_load(quick, native_bf16):
    native_bf16(True)
    page_load = fake_result(quick, "baseline", 1000)
    panel = Panel(quick, {"amp": None}, results=[page_load], advice=False, runner=fake_runner([500, 510, 505]))
    panel.run_button.click()
    panel.wait(10)
    text = panel.status.value
    assert "<b>noise</b>" in text  # 510 against 500 and 505, measured beside it
    assert "The machine is busier now: the baseline was 1,000 images/s at page load, 502 now" in text
    calm = Panel(quick, {"amp": None}, results=[page_load], advice=False, runner=fake_runner([1000, 700, 1000]),
                 key="calm")
    calm.controls["amp"].value = "bf16"
    calm.run_button.click()
    calm.wait(10)
    assert "<b>0.70x</b>" in calm.status.value and "busier" not in calm.status.value


def test_two_panels_in_one_kernel_never_train_at_the_same_time(quick):
    lock, active, peak = threading.Lock(), [0], [0]

    def counting(cfg, **kwargs):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        try:
            return fastlab.run(cfg, **kwargs)
        finally:
            with lock:
                active[0] -= 1

    slow = quick.replace(steps=30, windows=2)  # long enough to press Run elsewhere meanwhile
    a = Panel(slow, {"channels_last": None}, runner=counting, pairing="AB", advice=False, title="panel A")
    b = Panel(quick, {"amp": None}, runner=counting, pairing="AB", advice=False, title="panel B")
    b.advice.value = "advice about an earlier run"
    a.run_button.click()
    b.run_button.click()  # refused: one run per kernel
    assert a.running and not b.running
    assert "the panel 'panel A' is running" in b.status.value and b.advice.value == ""
    # The panel's cell executed again while it runs: the new panel takes over the run and will show its result.
    a2 = Panel(slow, {"channels_last": None}, runner=counting, pairing="AB", advice=False, title="panel A")
    assert a2.running and a2.run_button.disabled and "is running" in a2.status.value
    a2.run_button.click()  # refused: that run is still going
    b.run_button.click()
    assert not b.running
    a2.wait(180)
    assert len(a2.results) == 1 and a2.results[0].label.startswith("panel 1") and "paired" in a2.results[0].extras
    assert wait_until(lambda: not a2.run_button.disabled, 10)
    b.run_button.click()
    assert b.running
    b.wait(180)
    assert len(b.results) == 1
    a3 = Panel(slow, {"channels_last": None}, runner=counting, title="panel A")  # executed once more, idle
    assert a3.results == a2.results and a3.count.value == "1 results in the plot"
    assert peak[0] == 1


def test_the_plot_keeps_the_last_runs_and_clear_empties_them(quick):
    given = fake_result(quick, "baseline", 1000)
    panel = Panel(quick, {"amp": None}, results=[given], pairing="none", keep=3, runner=fake_runner(range(900, 999)))
    for _ in range(5):
        panel.run_button.click()
        panel.wait(10)
    assert len(panel.results) == 6 and panel.shown_results() == [given] + panel.results[-3:]
    assert panel.count.value.startswith("4 results in the plot (2 older runs not shown")
    panel.clear_button.click()
    assert panel.results == [given] and panel.count.value == "1 results in the plot"


def test_runs_not_credited_are_marked_in_the_plot(quick):
    results = [fake_result(quick, "baseline", 1000), fake_result(quick, "stopped", 900, "interrupted"),
               fake_result(quick, "nan loss", 1200, "diverged"), fake_result(quick, "fine", 1500)]
    labels = [t.get_text() for t in plot_comparison(results).axes[0].texts]
    assert labels[1] == "not comparable: interrupted" and labels[2].startswith("DIVERGED") and labels[3] == "1.50x"
