"""The harness around a run in this process: one run at a time, a fresh thread, Ctrl-C and out-of-memory.
Ctrl-C and out-of-memory keep the steps done (marked "interrupted" or "failed"); any other error is raised.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .results import RunResult

_RUN_LOCK = threading.Lock()
_active_label: list[str] = []


def active_run() -> str | None:
    """The label of the run in progress in this process, or None when none is."""
    return _active_label[0] if _active_label else None


def run_in_fresh_thread(fn: Callable[..., Any], *args: Any, stop: threading.Event | None = None, **kwargs: Any) -> Any:
    """fn(*args, **kwargs) in a new thread; the caller waits. Ctrl-C while waiting sets `stop` (which fn must
    watch) and still waits for fn to return, so its partial result is kept. fn's exception is re-raised."""
    box: dict[str, Any] = {}
    done = threading.Event()

    def target() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as e:  # handed to the caller's thread below
            box["error"] = e
        finally:
            done.set()

    thread = threading.Thread(target=target, name="fastlab-run", daemon=True)
    thread.start()
    # An Event, not Thread.join: a KeyboardInterrupt inside join() can leave the thread marked finished early.
    while not done.is_set():
        try:
            done.wait(0.1)
        except KeyboardInterrupt:
            if stop is None:
                raise
            stop.set()
    thread.join()
    if "error" in box:
        raise box.pop("error")
    return box["value"]


@contextlib.contextmanager
def exclusive_run(label: str) -> Iterator[None]:
    """Serialise runs in this process: two runs at once would each time the other's contention."""
    while not _RUN_LOCK.acquire(timeout=0.1):  # a timeout keeps Ctrl-C working while waiting
        pass
    _active_label.append(label)
    try:
        yield
    finally:
        _active_label.clear()
        _RUN_LOCK.release()


# cuBLAS and cuDNN report a failed allocation in their own words; each is an out-of-memory all the same.
OOM_MARKERS = ("out of memory", "can't allocate memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED")


def is_out_of_memory(error: BaseException) -> bool:
    if isinstance(error, torch.cuda.OutOfMemoryError):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and any(m in text for m in OOM_MARKERS)


@contextlib.contextmanager
def run_guard(result: RunResult, batch_size: int) -> Iterator[None]:
    """Ctrl-C ends the run as interrupted; an out-of-memory error as failed; the steps done are kept either way.
    Only the error's message is kept: its traceback would hold the failed step's tensors alive."""
    failure = None
    try:
        yield
    except KeyboardInterrupt:
        result.status = "interrupted"
    except Exception as e:
        if not is_out_of_memory(e):
            raise
        failure = str(e).splitlines()[0] if str(e) else type(e).__name__
    if failure is not None:
        result.status = "failed"
        result.error = f"out of memory at batch_size={batch_size} ({failure})"


def progress_bar(total: int, label: str, enabled: bool):
    if not enabled:
        return _NoBar()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=label, unit="step", leave=False, mininterval=0.5)


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass
