"""Every run in a fresh process (a forkserver's child), so that two compared runs share no state: cuDNN plans,
OpenMP teams, the allocator, compile caches and globals all outlive a thread. Ctrl-C or a stop ends the child's run
at its next step; a second Ctrl-C, STOP_GRACE_SECONDS of silence after a stop, or a step still running
BUDGET_GRACE_SECONDS past the run's time budget (config.max_seconds) kills it, with the processes it started. The
child streams each step (its time, data wait, memory, loss), so a run killed mid-step keeps its finished steps. What
a child cannot import (a class from __main__, a lambda) runs in a fresh thread instead, and `extras["isolation"]`
says why. A thread cannot be killed: the caller gives up on one whose loop waits for a batch past the hung-loader bound
or its time budget (Watchdog), ends the DataLoader workers it started, and returns what the run kept; a step
still computing is waited for.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import gc
import mmap
import multiprocessing
import os
import pickle
import random
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import psutil
import torch

from .clocks import window_ends
from .data import load_data, worker_start_method
from .exits import describe_exit, oom_kills
from .harness import TrainingRun, cold_compile_caches, progress_bar
from .results import RunResult

PRELOAD = ["torchvision", "torch._dynamo", "torch._inductor.config", "fastlab.harness"]  # imported once, by the server
_context: Any = None
T = TypeVar("T")
STOP_GRACE_SECONDS = 30.0  # after a stop, a run's process that sends nothing for this long is killed
BUDGET_GRACE_SECONDS = 3.0  # a step still running this long past the run's time budget is ended mid-step
# A loader that sends no batch for max(DATA_WAIT_FLOOR_SECONDS, DATA_WAIT_STEPS x the median step) has hung: the
# floor leaves room for an epoch's workers to start on a loaded machine (each imports torch), the multiple for a slow
# step's data. A paused block (the held-out evaluation) gets the multiple for each of its held-out batches.
DATA_WAIT_FLOOR_SECONDS = 120.0
DATA_WAIT_STEPS = 20
STREAMED = ("step_seconds", "data_wait_seconds", "memory_trace_mb")  # per-step lists a child sends with each step


_RUN_LOCK = threading.Lock()
_active_label: list[str] = []


def active_run() -> str | None:
    """The label of the run in progress in this process, or None when none is."""
    return _active_label[0] if _active_label else None


def run_in_fresh_thread(fn: Callable[[], Any], stop: threading.Event,
                        give_up: Callable[[], Any] = lambda: None) -> Any:
    """fn() in a new thread; the caller waits. Ctrl-C while waiting sets `stop` (which fn must watch) and still
    waits for fn to return, so its partial result is kept. fn's exception is re-raised. give_up(), asked every
    0.1 s: None to go on waiting, else the value to return in fn's place (`stop` is set, the thread left to end at
    its next check of it)."""
    box: dict[str, Any] = {}
    done = threading.Event()

    def target() -> None:
        try:
            box["value"] = fn()
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
            stop.set()
        instead = give_up()
        if instead is not None:
            stop.set()
            return instead
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


def _mp_context() -> Any:
    global _context
    if _context is None:
        method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
        _context = multiprocessing.get_context(method)
        if method == "forkserver":
            _context.set_forkserver_preload(PRELOAD)
    return _context


@dataclass
class RunSpec:
    """What a child needs to build the run itself: everything else (the bar, callbacks, events) stays here."""

    config: Any
    label: str
    payload: bytes  # pickle of (model, dataset): checked in the caller, unpickled in the child
    checkpoints: Any
    cold_compile_caches: bool
    setup: tuple  # the caller's environment, import path, folder, threads and worker start method (_setup)
    images: bytes | None = None  # the caller's cached images, pickled (as tensors they would go by shared memory)


def why_in_process(training: Any) -> tuple[str | None, bytes]:
    """(None, payload) when the run can go to a fresh process; else (the reason it runs here, b"")."""
    if os.environ.get("FASTLAB_ISOLATION", "process") == "thread":
        return "FASTLAB_ISOLATION=thread asks for runs in this process", b""
    if training.parallel is not None:
        return "a DDP rank is already a process of its own", b""
    try:
        payload = pickle.dumps((training.model_arg, training.dataset_arg), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # a lambda, a local class, an open file: nothing a child could rebuild
        return f"the model or dataset cannot be sent to a child process ({type(e).__name__}: {e})", b""
    if b"__main__" in payload:  # a class or function defined in a notebook cell: a child cannot import it
        return ("the model or dataset is defined in __main__ (a notebook cell or a script), which a child process "
                "cannot import; move it into a module to run it isolated"), b""
    return None, payload


def execute(training: Any, cold: bool = False) -> Any:
    """training.execute() in a fresh process when it can go there, else in a fresh thread; returns its RunResult.
    cold: with torch.compile's caches off (harness.cold_compile_caches)."""
    reason, payload = why_in_process(training)
    if reason is not None:
        training.waiting = ctypes.c_double(0.0)  # RunLimits.waiting, as a run's process shares it
        with cold_compile_caches(training.cfg) if cold else contextlib.nullcontext():
            result = run_in_fresh_thread(training.execute, training.halt,
                                         Watchdog(training, training.waiting, in_process=True))
        result.extras["isolation"] = f"in-process (fresh thread): {reason}"
        return result
    images = None
    if training.dataset_arg is None:  # loaded once here, from this process's cache, not in every child
        images = pickle.dumps(load_data(training.cfg, None)[0], protocol=pickle.HIGHEST_PROTOCOL)
    return _run_child(training, RunSpec(training.cfg, training.result.label, payload, training.checkpoints,
                                        cold, _setup(), images))


class StopFlag:
    """A stop request the child reads at every step: one shared byte, no lock (a Ctrl-C while the caller held an
    Event's lock would leave the child waiting forever)."""

    def __init__(self, ctx: Any) -> None:
        self.flag = ctx.RawValue("b", 0)

    def set(self) -> None:
        self.flag.value = 1

    def is_set(self) -> bool:
        return bool(self.flag.value)


def _receive(conn: Any) -> Any:
    """conn.recv() with Ctrl-C held back until the message is read whole, so the pipe is never left mid-message."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        return conn.recv()
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        return conn.recv()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _start(target: Callable[..., None], name: str, *args: Any) -> tuple[Any, Any]:
    """(the started child process running target(its end of a pipe, *args), this end of the pipe)."""
    here, there = _mp_context().Pipe(duplex=False)
    child = _mp_context().Process(target=target, args=(there, *args), name=name, daemon=False)
    with _without_main():
        child.start()
    there.close()
    return child, here


class Watchdog:
    """When a run must be ended from outside its loop, read from the step seconds it has kept and its waiting mark
    (RunLimits.waiting: when the loop began waiting for a batch; negated inside a paused block, its held-out
    evaluation; 0 for neither). Its time budget: the seconds of its timed steps (after the warm-up, as the watch
    counts them; time paused for evaluation is in no step) plus the time since the last step ended; the loop checks
    it between steps, this ends a step that runs BUDGET_GRACE_SECONDS past it. A hung loader: a wait for a batch
    past max(DATA_WAIT_FLOOR_SECONDS, DATA_WAIT_STEPS x the median step so far), or a paused block past that for
    each held-out batch. The caller of a run's process kills it. A run in a thread of this process is given up on
    (the Watchdog called as run_in_fresh_thread's give_up, every 0.1 s), and only while its loop waits for a batch (a
    step still computing cannot be ended there): the DataLoader workers it started are killed (the thread's loader
    then fails at its next look at them); a thread blocked in the Dataset itself cannot be ended, and the reason says
    so."""

    def __init__(self, training: Any, waiting: Any, in_process: bool) -> None:
        cfg = training.cfg
        self.training, self.cfg, self.waiting, self.in_process = training, cfg, waiting, in_process
        self.steps = training.result.step_seconds  # the run's step seconds kept so far
        self.before = {p.pid for p in _run_processes()} if in_process else set()  # not the run's workers
        self.seen = 0  # steps seen
        self.since: float | None = None  # when the last step ended, once timed steps have begun
        self.eval_batches = max(1, -(-cfg.eval_images // cfg.batch_size))
        workers = cfg.num_workers if cfg.loader == "dataloader" else 0
        self.where = (f"on its DataLoader's {workers} worker processes" if workers else
                      "on its data in the run's own process (num_workers=0: the Dataset's __getitem__ or the loader)")
        self.ended = (("its loop, waiting for a batch, was given up on", "the run was given up on") if in_process else
                      ("its process was ended", "the run's process and its workers were ended"))

    def check(self, last: bool = False) -> tuple[str, str] | None:
        """(status, reason) once the run must be ended: time_limited past its budget (not once `last`: the run said
        it takes no more steps), failed for a hung loader; else None."""
        now, mark, warmup = time.monotonic(), self.waiting.value, self.cfg.warmup_steps
        if len(self.steps) != self.seen:
            self.seen = len(self.steps)
            self.since = now if self.seen >= warmup else None
        done, limit = self.seen, self.cfg.max_seconds
        stepping = not last and (mark > 0 or not self.in_process)
        if (limit and stepping and self.since is not None
                and sum(self.steps[warmup:done]) + now - self.since > limit + BUDGET_GRACE_SECONDS):
            return "time_limited", (f"stopped at its {limit:g} s budget during step {done + 1}: {self.ended[0]} "
                                    f"{BUDGET_GRACE_SECONDS:g} s past the budget, mid-step, keeping the {done} steps "
                                    "it finished")
        waited = now - abs(mark) if mark else 0.0
        median = sorted(self.steps)[done // 2] if done else 0.0
        if waited <= max(DATA_WAIT_FLOOR_SECONDS, DATA_WAIT_STEPS * median * (self.eval_batches if mark < 0 else 1)):
            return None
        if mark < 0:
            return "failed", (f"its held-out evaluation (a paused block: `with w.paused()`) did not end in {waited:.0f} "
                              f"s ({self.eval_batches} held-out batches; the bound: {DATA_WAIT_FLOOR_SECONDS:g} s or "
                              f"{DATA_WAIT_STEPS} x the median step for each, whichever is longer): its loader hung, "
                              f"so {self.ended[1]}, keeping the {done} steps it finished")
        where = self.where if done else f"{self.where}, or for the items of the Dataset the run checks first"
        return "failed", (f"its loader sent no batch for {waited:.0f} s, waiting {where} (the bound: "
                          f"{DATA_WAIT_FLOOR_SECONDS:g} s or {DATA_WAIT_STEPS} x the median step, whichever is longer): "
                          f"the loader hung, so {self.ended[1]}, keeping the {done} steps it finished")

    def __call__(self) -> RunResult | None:
        """In this process: None to go on waiting, else the run given up on, as kept then (a copy)."""
        ended = self.check()
        if ended is None:
            return None
        status, reason = ended
        workers = [p for p in _run_processes() if p.pid not in self.before]
        _forget_workers({p.pid for p in workers})
        kill_all(workers, wait_s=0)  # not reaped here: the loader must find its own workers' ends
        left = ("its DataLoader workers were ended" if workers else
                "the run's thread cannot be ended from here: it stays blocked until the Dataset returns an item, then "
                "stops at its next batch (restart the kernel to end it now)")
        kept = copy.deepcopy(self.training.result)
        kept.steps_done = self.seen
        return _ended_here(kept, self.cfg, status, f"{reason}; {left}")


def _run_child(training: Any, spec: RunSpec) -> Any:
    """The run in a child process, its steps kept here as they stream in; the child killed, with its workers, on a
    second Ctrl-C, on STOP_GRACE_SECONDS of silence after a stop, or when the Watchdog ends the run."""
    stop, waiting = StopFlag(_mp_context()), _mp_context().RawValue("d", 0.0)
    oom_before = oom_kills()  # a SIGKILL the out-of-memory killer sends raises it: then the end is named so
    child, here = _start(_child, f"fastlab-run {spec.label}", spec.setup, _train, (spec, stop, waiting), {})
    bar = None  # drawn at the first step, as the in-process loop does: an error in set-up prints no empty bar
    done, last, outcome, killed, ended = 0, False, None, None, None
    heard = None  # when the child was last heard from, once a stop was asked
    watchdog = Watchdog(training, waiting, in_process=False)
    try:
        while outcome is None:
            try:
                if heard is None and any(e.is_set() for e in training.stops):
                    stop.set()
                    heard = time.monotonic()
                if here.poll(0.05):
                    message = _receive(here)
                    if heard is not None:
                        heard = time.monotonic()
                    if message[0] == "step":
                        _, step, total, facts = message
                        keep_step(training.result, step, facts)
                        last = facts["last"]
                        bar = bar or progress_bar(total, spec.label, training.progress)
                        bar.update(step - done)
                        done = step
                        if training.on_step is not None:
                            training.on_step(step, total)
                    else:
                        outcome = message
                elif not child.is_alive() and not here.poll(0):
                    break
                elif heard is not None and time.monotonic() - heard > STOP_GRACE_SECONDS:
                    killed = f"as it sent nothing for {STOP_GRACE_SECONDS:g} s after a stop"
                    break
                elif (ended := watchdog.check(last)) is not None:
                    killed = ended[1]
                    break
            except KeyboardInterrupt:  # the caller's Ctrl-C: the child stops at its next step and reports
                if heard is not None:
                    killed = "on a second Ctrl-C"
                    break
                training.halt.set()  # one of training.stops: passed on at the loop's next turn
            except EOFError:  # the child closed its end without a result: it died
                break
    finally:
        if bar is not None:
            bar.close()
        here.close()
        child.join(timeout=0 if killed else 30)
        if child.is_alive():
            kill_with_its_processes(child)
    if ended is not None:
        result = _ended_here(training.result, training.cfg, *ended)
    elif outcome is not None:
        result = _value(outcome)
    else:  # the child died: what it streamed is what we know
        result = training.result
        result.status = "failed"
        how = describe_exit(child.exitcode, oom_before, killed_here=killed is not None)
        result.error = f"the run's process ended without a result ({how}) after {done} steps"
        if killed:
            result.error += f"; killed here {killed}"
    result.extras["isolation"] = "process"
    return result


def kill_with_its_processes(child: Any) -> None:
    """SIGKILL a run's process and every process it started (DataLoader workers), and wait for them: nothing of
    the run goes on using the CPU or the GPU."""
    try:
        started = psutil.Process(child.pid).children(recursive=True)
    except psutil.Error:  # already gone
        started = []
    child.kill()
    child.join()
    kill_all(started)


def kill_all(processes: list[psutil.Process], wait_s: float = 5.0) -> None:
    """SIGKILL each process (one already gone is passed over), then wait up to wait_s for them to go (which reaps a
    child of this process: its own parent object then never sees it end)."""
    for p in processes:
        with contextlib.suppress(psutil.Error):
            p.kill()
    if wait_s:
        psutil.wait_procs(processes, timeout=wait_s)


def step_facts(result: RunResult, step: int, total: int) -> dict[str, Any]:
    """What a child sends of its step `step`: this step's entry of each STREAMED list, its loss when it was read,
    whether it takes another step, and (with the first step) what the run's data and memory meter are."""
    facts: dict[str, Any] = {name: getattr(result, name)[-1] for name in STREAMED
                             if len(getattr(result, name)) == step}
    facts["loss"] = result.losses[-1][1] if result.losses and result.losses[-1][0] == step - 1 else None
    facts["last"] = step >= total or bool(result.stopped_by) or result.status != "ok"
    if step == 1:
        facts.update(dataset=result.dataset, memory_kind=result.memory_kind)
    return facts


def keep_step(result: RunResult, step: int, facts: dict[str, Any]) -> None:
    """The parent's copy of a streamed step, on the result it returns if the child ends without one."""
    for name in STREAMED:
        if name in facts:
            getattr(result, name).append(facts[name])
    if facts["loss"] is not None:
        result.losses.append((step - 1, facts["loss"]))
    if step == 1:
        result.dataset, result.memory_kind = facts["dataset"], facts["memory_kind"]
    result.steps_done = step


def _ended_here(result: RunResult, cfg: Any, status: str, reason: str) -> RunResult:
    """A run its caller ended mid-step (at its time budget: time_limited; a hung loader: failed), with the steps it
    kept and the windows they closed (a window's time is the sum of its steps' times: the watch reads its clock
    once per step)."""
    result.status, result.error = status, reason
    if status == "time_limited":
        result.stopped_by = "max_seconds"
    result.warmup_seconds = sum(result.step_seconds[:cfg.warmup_steps])
    result.peak_memory_mb = max(result.memory_trace_mb, default=0.0)
    start = cfg.warmup_steps
    for end in sorted(window_ends(cfg.warmup_steps, cfg.steps, cfg.windows)):
        if end > result.steps_done:
            break
        seconds = sum(result.step_seconds[start:end])
        result.window_seconds.append(seconds)
        result.window_throughput.append(result.images_per_step * (end - start) / seconds)
        start = end
    result.timed_seconds = sum(result.window_seconds)
    return result


def _forget_workers(pids: set[int]) -> None:
    """Unregister these DataLoader workers from torch's SIGCHLD handler before they are killed. A DataLoader with
    workers iterated once in the main thread installs that handler, and it raises "DataLoader worker ... is killed"
    in the main thread (a notebook's, wherever it then is) when any registered worker dies. The run's thread then
    finds its workers gone at its own next look and fails there."""
    from torch.utils.data import dataloader
    from torch.utils.data._utils import signal_handling

    # type(), not isinstance: isinstance reads each object's __class__, and one of torch's (reduce_op) warns when read
    iterator = dataloader._MultiProcessingDataLoaderIter
    for loader in gc.get_objects():
        if type(loader) is iterator and loader._worker_pids_set and pids & {w.pid for w in loader._workers}:
            signal_handling._remove_worker_pids(id(loader))
            loader._worker_pids_set = False


def _run_processes() -> list[Any]:
    """This process's descendants but multiprocessing's own servers (the forkserver and the resource tracker, which
    serve this process for its whole life): a run's DataLoader workers, in a run in this process. Runs are one at a
    time (exclusive_run), so those started during a run are its own."""
    me = psutil.Process()
    servers = set()
    for p in me.children():
        with contextlib.suppress(psutil.Error):
            if any(s in " ".join(p.cmdline()) for s in ("forkserver", "resource_tracker")):
                servers.add(p.pid)
    return [p for p in me.children(recursive=True) if p.pid not in servers]


@contextlib.contextmanager
def _without_main() -> Any:
    """Start a child without re-running the caller's __main__, so a script needs no `if __name__ == "__main__"`."""
    from multiprocessing import spawn

    original = spawn.get_preparation_data

    def preparation_data(name: str) -> dict:
        data = original(name)
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
        return data

    spawn.get_preparation_data = preparation_data
    try:
        yield
    finally:
        spawn.get_preparation_data = original


class ChildTraceback(Exception):
    """The child's traceback, as the cause of its exception raised here: the exception's own message stays as it was."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f"in the run's process:\n{self.text}"


def call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """fn(*args, **kwargs) in a fresh process, waited for: its return value, or its exception raised here. For a
    measurement that is not a training run; fn and its arguments must be importable or picklable."""
    oom_before = oom_kills()
    child, here = _start(_child, "fastlab-call", _setup(), fn, args, kwargs)
    try:
        while not here.poll(0.1):  # a Ctrl-C is raised here, not held back until the child ends (_receive)
            pass
        message = _receive(here)
    except EOFError:
        child.join()
        raise RuntimeError(f"{getattr(fn, '__name__', fn)!s} ended its process without a result "
                           f"({describe_exit(child.exitcode, oom_before)})") from None
    except BaseException:  # Ctrl-C while waiting: the child's work is abandoned with it
        child.kill()
        child.join()
        raise
    finally:
        here.close()
    child.join()
    return _value(message)


def _value(message: tuple) -> Any:
    """A child's ("value", v) message: v; its ("error", ...) one: the exception raised here."""
    if message[0] == "error":
        _, error, child_traceback = message
        raise error from ChildTraceback(child_traceback)
    return message[1]


def _setup() -> tuple[dict[str, str], list[str], str, int, str]:
    """What a child takes of its caller (_begin): the environment, import path, folder, threads and the worker start
    method."""
    return dict(os.environ), list(sys.path), os.getcwd(), torch.get_num_threads(), worker_start_method()


_LAYOUT: list[Any] = []  # the child's random padding, kept for the whole run
_RESERVE = 64 << 20  # bytes


def _shift_layout() -> tuple[int, int]:
    """Reserve a random amount of address space and take random heap blocks, so that the run's arrays land at a
    random place: children of one server otherwise lay out alike, a bias repeats cannot see. (pages, heap bytes)."""
    rng = random.Random(os.urandom(8))  # never the training seed's generator
    pages, heap = rng.randrange(0, 512), rng.randrange(0, 1 << 16, 64)
    # 64 MB: more than a gap between the server's libraries, where padding would move nothing
    _LAYOUT.append(mmap.mmap(-1, _RESERVE + pages * mmap.PAGESIZE, flags=mmap.MAP_PRIVATE, prot=0))
    left = heap
    while left:  # past Python's small-object pool (512 bytes), from the C heap the run's tensors use
        block = min(left, rng.randrange(576, 16384, 64))
        _LAYOUT.append(bytearray(block))
        left -= block
    return pages, heap


PARENT_POLL_SECONDS = 1.0  # how often a child looks whether its caller is still there


def _end_with_parent() -> None:
    """In a child: once its caller is gone (killed by SIGTERM, SIGHUP or SIGKILL, or a kernel shut down), kill the
    child's own processes (DataLoader workers, even one stuck in a Dataset) and end, so nothing of the run is left
    running. Its OS parent may be the forkserver, which outlives the caller while any child lives, so the caller is
    read through multiprocessing's parent sentinel, on a timer signal: a thread's malloc arena would undo the random
    layout (_shift_layout). System calls the signal interrupts are restarted."""
    parent = multiprocessing.parent_process()
    if parent is None or not hasattr(signal, "setitimer"):
        return

    def check(signum: int, frame: Any) -> None:
        if not parent.is_alive():
            kill_all(psutil.Process().children(recursive=True), wait_s=0)
            os._exit(1)

    signal.signal(signal.SIGALRM, check)
    signal.siginterrupt(signal.SIGALRM, False)
    signal.setitimer(signal.ITIMER_REAL, PARENT_POLL_SECONDS, PARENT_POLL_SECONDS)


def _begin(setup: tuple) -> tuple[int, int]:
    """A child's first step: its caller's setup (DataLoader workers then start as in the caller, not through a
    forkserver of the child's own), a random layout (not with FASTLAB_LAYOUT=fixed), then a watch on its parent;
    returns the layout's shift."""
    environ, path, cwd, threads, start_method = setup
    os.environ.clear()
    os.environ.update(environ)
    sys.path[:] = path
    os.chdir(cwd)
    torch.set_num_threads(threads)
    multiprocessing.set_start_method(start_method, force=True)
    shift = (0, 0) if os.environ.get("FASTLAB_LAYOUT") == "fixed" else _shift_layout()
    _end_with_parent()  # after the shift: its thread's stack would otherwise land where the shift decides
    return shift


def _child(conn: Any, setup: tuple, fn: Callable[..., Any], args: tuple, kwargs: dict) -> None:
    """In a child: its caller's setup, then fn(*args, **kwargs), whose value (or exception) is sent back. A run
    (_train) also gets the pipe, for its steps, and the layout's shift."""
    try:
        shift = _begin(setup)
        if fn is _train:
            kwargs = {"conn": conn, "shift": shift}
        conn.send(("value", fn(*args, **kwargs)))
    except (BrokenPipeError, ConnectionResetError):  # the caller is gone: nobody to tell, nothing to print
        os._exit(1)
    except BaseException as e:  # handed to the caller, who raises it again
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            conn.send(("error", _portable(e), traceback.format_exc()))
    finally:
        conn.close()


def _train(spec: RunSpec, stop: StopFlag, waiting: Any, conn: Any, shift: tuple[int, int]) -> RunResult:
    """In a run's child: the run rebuilt from its spec and run, each step streamed to the caller."""
    model, dataset = pickle.loads(spec.payload)
    training = TrainingRun(spec.config, spec.label, model, dataset, False, stop, None, checkpoints=spec.checkpoints)
    training.on_step = lambda step, total: conn.send(("step", step, total, step_facts(training.result, step, total)))
    training.preloaded = pickle.loads(spec.images) if spec.images is not None else None
    training.waiting = waiting
    training.result.extras["run_pid"] = os.getpid()
    training.result.extras["layout_shift"] = {"pages": shift[0], "heap_bytes": shift[1]}
    with cold_compile_caches(spec.config) if spec.cold_compile_caches else contextlib.nullcontext():
        return training.execute()


def _portable(error: BaseException) -> BaseException:
    """The exception itself when it survives pickling, else a RuntimeError with its words."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")
