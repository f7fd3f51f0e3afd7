"""Test settings: the smoke profile, no display, and a data folder that starts empty (no downloads)."""

import atexit
import os
import shutil
import signal
import tempfile


def _temporary_folder(prefix: str) -> str:
    """A new folder under the system's temporary one, removed when the test session's process ends."""
    folder = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


os.environ["FASTLAB_PROFILE"] = "smoke"
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ["FASTLAB_DATA_DIR"] = _temporary_folder("fastlab-data-")
os.environ["FASTLAB_RESULTS_DIR"] = _temporary_folder("fastlab-results-")  # claim verdicts
os.environ.pop("FASTLAB_DATA", None)
# A job started in the background (`nohup make test &`, some CI runners) inherits Ctrl-C ignored, and so does every
# process it starts: the tests that send a Ctrl-C need Python's own handler (children inherit it as the default).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

import pytest  # noqa: E402

import fastlab  # noqa: E402


@pytest.fixture(autouse=True)
def no_notebook_budget_left_behind():
    """A budget a test starts (fastlab.budget) ends with it: it would refuse the runs of the tests after it."""
    yield
    from fastlab import budget

    budget.stop()


@pytest.fixture
def smoke():
    """The smoke config, shortened further where a test only needs a run to happen."""
    return fastlab.config_for("smoke")


@pytest.fixture
def quick(smoke):
    return smoke.replace(steps=4, warmup_steps=1, windows=2, train_images=128, eval_images=64)


@pytest.fixture
def native_bf16(monkeypatch):
    """native_bf16(True / False): the CPU reported with or without native bf16, whatever CPU runs the test (without
    it, bf16 autocast is a known trap, run as one short demonstration)."""
    from fastlab import measure

    def set_native(native: bool) -> None:
        monkeypatch.setattr(measure, "cpu_native_bf16", lambda flags=None: native)

    return set_native


def pytest_report_header(config):
    """Which kind of CPU the suite runs as: this machine's own, or FASTLAB_CPU_KIND's caps (checked to hold)."""
    import torch

    from fastlab import cpu_kind, measure

    kind = cpu_kind.active_kind()
    isa = measure.cpu_isa()
    native = "native bf16" if measure.cpu_native_bf16() else "no native bf16"
    return (f"fastlab CPU: {measure.cpu_model()}, torch kernels {isa}, {native}, torch {torch.__version__}"
            + (f" (run as FASTLAB_CPU_KIND={kind})" if kind else ""))
