import time

import pytest

pytest.importorskip("ipywidgets")

from fastlab.widgets import Panel  # noqa: E402


def wait_until(check, timeout=60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.05)
    return False


def test_run_adds_a_result_and_redraws(quick):
    panel = Panel(quick, {"amp": None, "batch_size": [8, 16], "channels_last": None})
    assert panel.results == [] and panel.image.value == b""
    panel.controls["batch_size"].value = 8
    panel.controls["amp"].value = "bf16"
    panel.run_button.click()
    panel.wait(120)
    assert len(panel.results) == 1
    r = panel.results[0]
    assert r.status == "ok" and r.config["batch_size"] == 8 and r.config["amp"] == "bf16"
    assert "batch_size=8" in r.label and "amp=bf16" in r.label
    assert panel.image.value[:4] == b"\x89PNG"
    assert "images/s" in panel.status.value and not panel.run_button.disabled
    assert "Advice for" in panel.advice.value  # fastlab.advise's findings for the latest run, under the plot
    first_png = panel.image.value
    panel.run_button.click()
    panel.wait(120)
    assert len(panel.results) == 2 and panel.image.value != first_png
    assert panel.count.value == "2 results in the plot"


def test_stop_ends_the_run_interrupted_with_partial_steps(quick):
    panel = Panel(quick.replace(steps=400, windows=4), {"channels_last": None})
    panel.run_button.click()
    assert wait_until(lambda: panel.progress.value >= 3)
    panel.stop_button.click()
    panel.wait(60)
    assert not panel.running
    r = panel.results[-1]
    assert r.status == "interrupted" and 3 <= r.steps_done < 401
    assert "INTERRUPTED" in panel.status.value


def test_bad_knob_values_are_reported_not_raised(quick):
    panel = Panel(quick, {"num_workers": [0, 2], "prefetch_factor": [None, 4]})
    assert panel.controls["prefetch_factor"].label.startswith("None")  # shown, not blank
    assert panel.current_config().prefetch_factor is None
    panel.controls["prefetch_factor"].value = 4
    panel.start()
    assert not panel.running and "prefetch_factor=4" in panel.status.value and panel.results == []


def test_unknown_knob_is_rejected_at_build(quick):
    with pytest.raises(ValueError, match="no field 'speed'"):
        Panel(quick, {"speed": [1, 2]})


def test_headless_results_are_shown_first(quick):
    import fastlab

    first = fastlab.run(quick, progress=False)
    panel = Panel(quick, {"amp": None}, results=[first])
    assert panel.image.value[:4] == b"\x89PNG"
