"""The one prepared command for a CUDA machine: `make gpu-check` (or `PYTHONPATH=. python tests/gpu_check.py`).

Asserts every CUDA-only path of fastlab at small sizes, then runs both bench ladders at gpu-profile sizes and
saves them. Needs torch 2.11+ with its torchvision, numpy, Pillow and nvidia-ml-py. Without CUDA: exit 0. Exit 1
when a check failed (or passed its deadline, CHECK_DEADLINE_S); outcomes go to <out>/checks.json. About 4 minutes.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from torch import nn

import fastlab
from fastlab import isolation, measure
from fastlab.config import config_for
from fastlab.exercise import technique_shown
from fastlab.files import write_json
from fastlab.lessons import ddp
from fastlab.lessons.batch_size import find_max_batch, probe_config
from fastlab.models import build_model
from fastlab.results import save_results
from fastlab.watch import compare_loops

# (module, its package, what needs it): what gpu-check imports beyond torch.
PACKAGES: tuple[tuple[str, str, str], ...] = (
    ("numpy", "numpy", "data sets and preflight"),
    ("torchvision", "torchvision (the release that matches torch)", "ResNet-18 and the DataLoader rungs"),
    ("PIL", "Pillow", "the DataLoader rungs' transforms"),
    ("pynvml", "nvidia-ml-py", "GPU utilisation"),
)
LADDER_RUNG_SECONDS = 3.0  # each rung's timed steps: a few windows at every rung's speed
CHECK_DEADLINE_S = 180.0  # several times the longest check's time
LADDER_OVERRUN_S = 240.0  # past the ladders' budget: for the rungs started before it, compiled ones too


def missing_packages() -> list[str]:
    """The packages gpu-check needs that do not import here (a mismatched torchvision too), with why."""
    missing = []
    for module, package, used_for in PACKAGES:
        try:
            importlib.import_module(module)
        except Exception as e:  # ImportError, or a mismatched build's RuntimeError
            why = "" if isinstance(e, ModuleNotFoundError) else f": {type(e).__name__}: {str(e).splitlines()[0]}"
            missing.append(f"{package} (for {used_for}{why})")
    return missing


def within_deadline(fn: Callable[[], str], seconds: float) -> tuple[str, bool]:
    """(fn()'s detail, True), or (why, False) when it raised or passed `seconds` (then it gets a Ctrl-C); a process
    hung in a CUDA call prints every thread's traceback and exits 1 after a grace period."""
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    faulthandler.dump_traceback_later(seconds + 2 * isolation.STOP_GRACE_SECONDS, exit=True, file=sys.__stderr__)
    timer.start()
    try:
        return fn(), True
    except KeyboardInterrupt:
        if not expired.is_set():  # the reader's own Ctrl-C ends gpu-check
            raise
        return f"not done within its deadline of {seconds:g} s: stopped", False
    except Exception as e:  # every check reports; one failure must not hide the others
        late = f"past its deadline of {seconds:g} s, stopped: " if expired.is_set() else ""
        return f"{late}{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}", False
    finally:
        timer.cancel()
        faulthandler.cancel_dump_traceback_later()


CHECKS: list[tuple[str, Callable[[], str]]] = []


def check(name: str) -> Callable[[Callable[[], str]], Callable[[], str]]:
    def register(fn: Callable[[], str]) -> Callable[[], str]:
        CHECKS.append((name, fn))
        return fn

    return register


def _small(**changes: Any):
    base = dict(dataset="synthetic", steps=20, warmup_steps=3, windows=4, train_images=4096, eval_images=512,
                batch_size=256, max_seconds=60.0)
    return config_for("gpu", **{**base, **changes})


@check("synchronised timing agrees with CUDA events")
def _timing() -> str:
    x = torch.randn(4096, 4096, device="cuda")
    for _ in range(3):
        x @ x
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = measure.now(torch.device("cuda"))
    start.record()
    for _ in range(50):
        x @ x
    end.record()
    wall = measure.now(torch.device("cuda")) - t0
    events = start.elapsed_time(end) / 1000
    assert abs(wall - events) / events < 0.10, f"host clock {wall:.4f} s vs CUDA events {events:.4f} s"
    return f"host clock {wall * 1000:.1f} ms, CUDA events {events * 1000:.1f} ms"


@check("peak memory resets per run")
def _peak_resets() -> str:
    big = fastlab.run(_small(batch_size=1024), progress=False)
    small = fastlab.run(_small(batch_size=64), progress=False)
    assert big.ok and small.ok, (big.summary(), small.summary())
    assert small.peak_memory_mb < big.peak_memory_mb * 0.5, (small.peak_memory_mb, big.peak_memory_mb)
    return f"batch 1024: {big.peak_memory_mb:,.0f} MiB, then batch 64: {small.peak_memory_mb:,.0f} MiB"


class _Hog(nn.Module):
    """A net whose activations grow with the batch far faster than a CNN's: OOM arrives at a modest batch."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3 * 32 * 32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = x.flatten(1).repeat(1, 4096)  # 48 MiB of fp32 per image
        return self.fc(wide[:, : 3 * 32 * 32] + wide[:, -3 * 32 * 32 :])


OOM_PROBE_STEPS = 2


@check("an out-of-memory run returns memory to its starting level; find_max_batch is exact")
def _oom() -> str:
    with mock.patch.dict(os.environ, FASTLAB_ISOLATION="thread"):  # the hog's runs in this process: its allocator
        return _oom_in_process()


def _oom_in_process() -> str:
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    total_gib = torch.cuda.get_device_properties(0).total_memory / 2**30
    huge = int(total_gib * 2**30 / (48 * 2**20) * 2)  # twice what fits
    r = fastlab.run(_small(batch_size=huge, steps=4, windows=2, train_images=4 * huge), model=_Hog, progress=False)
    assert r.status == "failed" and "out of memory" in r.error, r.summary()
    after = torch.cuda.memory_allocated()
    assert after <= before + 2**20, f"memory allocated before {before}, after the OOM run {after}"
    base = _small(steps=2, windows=1)
    search = find_max_batch(base, start=max(huge // 8, 1), resolution=1, probe_steps=OOM_PROBE_STEPS,
                            runner=lambda cfg, **kw: fastlab.run(cfg, model=_Hog, **kw))
    assert search.largest and search.smallest_failing == search.largest + 1, (search.largest, search.smallest_failing)
    # the probes' own configuration: a larger on-device training set would fail at the boundary
    again = fastlab.run(probe_config(base, search.largest, OOM_PROBE_STEPS), model=_Hog, progress=False)
    assert again.ok, again.summary()
    return (f"OOM at batch {huge}: allocated {before / 2**20:.0f} -> {after / 2**20:.0f} MiB; largest batch "
            f"{search.largest}, {search.smallest_failing} fails; rerun at {search.largest}: ok")


@check("fp16 + GradScaler changes its scale; bf16 runs without a scaler")
def _precision() -> str:
    net = nn.Linear(64, 10).cuda()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0**40)  # overflows fp16 at once: the scale must drop
    x, y = torch.randn(32, 64, device="cuda"), torch.randint(0, 10, (32,), device="cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        loss = nn.functional.cross_entropy(net(x) * 1e4, y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() < 2.0**40, scaler.get_scale()
    fp16 = fastlab.run(_small(amp="fp16", log_every=1), progress=False)
    assert fp16.ok and fp16.grad_scale, fp16.summary()
    text = f"scale 2^40 -> {scaler.get_scale():g} after an overflow; fp16 run ok, scale {fp16.grad_scale[-1]:g}"
    if measure.bf16_supported(torch.device("cuda")):
        bf16 = fastlab.run(_small(amp="bf16", log_every=1), progress=False)
        assert bf16.ok and not bf16.grad_scale, bf16.summary()
        text += "; bf16 run ok without a scaler"
    return text


def layout_recording_net(seen: list[tuple[bool, bool]], device_type: str = "cuda") -> Callable[[], nn.Module]:
    """A ResNet-18 factory recording (input, weight) channels_last at each forward on `device_type`."""
    def net() -> nn.Module:
        m = build_model("resnet18")
        conv = next(c for c in m.modules() if isinstance(c, nn.Conv2d))

        def hook(module: nn.Module, args: tuple) -> None:
            if args[0].device.type != device_type:
                return
            cl = torch.channels_last
            seen.append((args[0].is_contiguous(memory_format=cl), conv.weight.is_contiguous(memory_format=cl)))

        conv.register_forward_pre_hook(hook)
        return m

    return net


@check("channels_last reaches weights and inputs")
def _channels_last() -> str:
    seen: list[tuple[bool, bool]] = []
    r = fastlab.run(_small(channels_last=True, steps=4, windows=2), model=layout_recording_net(seen), progress=False)
    assert r.ok and seen and all(a and b for a, b in seen), (r.summary(), seen[:3])
    return f"{len(seen)} forward passes on CUDA, inputs and weights channels_last in all"


@check("cudnn.benchmark on vs off differ in warm-up, each run fresh")
def _cudnn() -> str:
    cfg = _small(model="resnet18", steps=8, windows=2, warmup_steps=3)
    runs = [fastlab.run(cfg.replace(cudnn_benchmark=on), progress=False) for on in (False, True, False, True)]
    off, on = runs[2].warmup_seconds, runs[3].warmup_seconds
    assert all(r.ok for r in runs), [r.summary() for r in runs]
    assert all(r.extras.get("isolation") == "process" for r in runs), [r.extras.get("isolation") for r in runs]
    assert on > off * 1.2, f"warm-up with benchmark {on:.3f} s vs without {off:.3f} s"
    return f"warm-up {off:.2f} s off, {on:.2f} s on (autotuning); second pair of an off/on/off/on sequence"


class UntunedForward(nn.Module):
    """ResNet-18 whose forward runs with cudnn.benchmark off, so only its backward is autotuned; a class, so a fresh
    process can build it."""

    def __init__(self) -> None:
        super().__init__()
        self.net = build_model("resnet18")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flag = torch.backends.cudnn.benchmark
        torch.backends.cudnn.benchmark = False
        try:
            return self.net(x)
        finally:
            torch.backends.cudnn.benchmark = flag


@check("cudnn.benchmark autotunes the backward pass too (an off run, then an on run)")
def _cudnn_backward() -> str:
    cfg = _small(model="resnet18", steps=8, windows=2, warmup_steps=1)  # the one warm-up step autotunes
    off, on = (fastlab.run(cfg.replace(cudnn_benchmark=b), model=UntunedForward, progress=False) for b in (False, True))
    assert off.ok and on.ok, (off.summary(), on.summary())
    assert off.extras.get("isolation") == on.extras.get("isolation") == "process", off.extras.get("isolation")
    # plans cached by the off run (autograd's thread outlives it) would leave nothing to tune: fresh processes
    assert on.warmup_seconds > off.warmup_seconds * 1.1, (f"first step {on.warmup_seconds:.3f} s with benchmark vs "
                                                          f"{off.warmup_seconds:.3f} s without (forward untuned in both)")
    return (f"first step {off.warmup_seconds:.2f} s off, {on.warmup_seconds:.2f} s on, forward untuned in both: "
            f"the difference is the backward pass's autotuning")


@check("compile reduce-overhead: two runs back to back, each with CUDA graphs")
def _compile() -> str:
    cfg = _small(model="compact", compile="reduce-overhead", amp="bf16", channels_last=True, loader="device",
                 max_seconds=120.0)
    runs = [fastlab.run(cfg, label=f"reduce-overhead #{i}", progress=False) for i in (1, 2)]
    for r in runs:  # the second records graphs after the first's pools were freed
        assert r.ok, r.summary()
        assert "cuda_graphs" not in r.no_ops, r.no_ops.get("cuda_graphs")
    return "; ".join(f"#{i}: {r.throughput.median:,.0f} images/s, warm-up (compile) {r.warmup_seconds:.1f} s"
                     for i, r in enumerate(runs, 1))


@check("a CUDA run records the copy knobs it could not use")
def _copy_no_ops() -> str:
    base = _small(model="tiny", loader="dataloader", steps=8, windows=2, train_images=2048)
    pageable = fastlab.run(base.replace(non_blocking=True), label="non_blocking, pageable", progress=False)
    assert pageable.ok and "pageable" in pageable.no_ops.get("non_blocking", ""), pageable.no_ops
    pinned = fastlab.run(base.replace(non_blocking=True, pin_memory=True), label="pinned", progress=False)
    assert pinned.ok and not {"pin_memory", "non_blocking"} & set(pinned.no_ops), pinned.no_ops
    return f"non_blocking from pageable memory recorded as a no-op; with pin_memory none ({pinned.no_ops or 'no no-ops'})"


@check("NVML utilisation samples arrive")
def _nvml() -> str:
    r = fastlab.run(_small(model="resnet18", steps=60, windows=3, batch_size=512), progress=False)
    assert r.ok and r.gpu_util, r.extras.get("gpu_util_note", "no samples")
    return f"{len(r.gpu_util)} samples, median {sorted(u for _, u in r.gpu_util)[len(r.gpu_util) // 2]:.0f}%"


def plain_loop(amp: bool = False, workers: int = 0, channels_last: bool = False, device: str = "cuda",
               images: int = 2048, batch_size: int = 128, model: str = "compact") -> Callable[[Any], None]:
    """A loop as a reader writes it, under the watch: what an exercise measures in a GPU room."""
    from torch.utils.data import DataLoader, TensorDataset

    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(images, 3, 32, 32, generator=g), torch.randint(0, 10, (images,), generator=g))
    fmt = torch.channels_last if channels_last else torch.contiguous_format

    def loop(w: Any) -> None:
        torch.manual_seed(0)
        net = build_model(model).to(device, memory_format=fmt)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
        loader = DataLoader(data, batch_size=batch_size, shuffle=True, num_workers=workers, pin_memory=workers > 0)
        for x, y in w(loader):
            with w.step(len(x)) as s:
                x = x.to(device, non_blocking=True).contiguous(memory_format=fmt)
                y = y.to(device, non_blocking=True)
                with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=amp):
                    loss = nn.functional.cross_entropy(net(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                s.loss = loss

    return loop


@check("the watch on a hand-written CUDA loop: exercise checks see each technique")
def _watched_loops() -> str:
    return watched_loops("cuda")


def watched_loops(device: str, **sizes: Any) -> str:
    """compare_loops as exercise.check runs it, and what the watch saw of each technique."""
    given = plain_loop(device=device, **sizes)
    found = []
    for technique, edited in (("autocast", plain_loop(amp=True, device=device, **sizes)),
                              ("workers", plain_loop(workers=2, device=device, **sizes)),
                              ("channels_last", plain_loop(channels_last=True, device=device, **sizes))):
        c = compare_loops(given, edited, repeats=2, labels=("given", technique), facts=True, device=device,
                          warmup_steps=3, window_steps=3)
        shown, seen = technique_shown(technique, c)
        assert shown, (technique, seen)
        runs = c.before + c.after
        assert all(r.ok and r.window_throughput and r.peak_memory_mb > 0 for r in runs), [r.summary() for r in runs]
        assert c.speed.comparable, c.speed.words
        found.append(f"{technique} {c.speed.ratio:.2f}x ({c.speed.direction}; seen: {seen})")
    return "; ".join(found)


@check("a one-process nccl DDP run finishes")
def _ddp() -> str:
    job = ddp.torchrun(1, _small(steps=10, windows=2), timeout_s=240)
    r = job.result
    assert r.ok and r.extras["ddp"]["backend"] == "nccl", (r.summary(), r.extras.get("ddp", {}).get("backend"))
    return f"{r.throughput.median:,.0f} images/s on 1 rank, backend nccl"


def run_ladders(out: Path, budget_s: float, rung_seconds: float = LADDER_RUNG_SECONDS, profile: str = "gpu",
                repeats: int = 1, warmup_steps: int | None = None) -> str:
    """Both ladders at `profile`'s sizes, each rung's timed steps limited to `rung_seconds`, each ladder's first pass
    to half of `budget_s`, then `repeats` - 1 more passes interleaved (saved after every run); warmup_steps: at most
    this many untimed steps a rung (None: the profile's)."""
    # heavy on purpose: fastlab.bench imports fastlab.plots (matplotlib, which needs Pillow), so a machine without
    # Pillow still gets missing_packages's one line from main instead of an ImportError
    from fastlab.bench import ladder, markdown_table, run_ladder

    lines = []
    for model in ("resnet18", "compact"):
        base = config_for(profile, model=model, dataset="synthetic")  # no download from the budget
        if warmup_steps is not None:
            base = base.replace(warmup_steps=min(base.warmup_steps, warmup_steps))
        not_run: dict[str, str] = {}
        path = out / f"ladder-{model}.json"
        meta = {"kind": "bench", "metric": "throughput", "profile": profile, "model": model, "not_run": not_run,
                "rung_seconds": rung_seconds, "repeats": repeats}

        def save(done: list, path: Path = path, meta: dict = meta) -> None:
            save_results(path, done, meta=meta)

        done = run_ladder(base, ladder(base), progress=False, on_update=save, max_seconds=rung_seconds,
                          budget_s=budget_s / 2, not_run=not_run, repeats=repeats)
        save(done)
        lines.append(markdown_table(done))
        if not_run:
            lines.append("Not started (budget spent): " + "; ".join(f"{k}: {v}" for k, v in not_run.items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="gpu-check-results", help="folder for checks.json and the ladders")
    parser.add_argument("--ladder-budget-s", type=float, default=120.0,
                        help="wall time for both ladders together (half each): no rung starts once its half is spent")
    parser.add_argument("--no-ladder", action="store_true")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("fastlab gpu-check: no CUDA GPU on this machine; nothing to check (exit 0).")
        return 0
    missing = missing_packages()
    if missing:
        print(f"fastlab gpu-check: missing {', '.join(missing)}; install them (torchvision of the release that "
              f"matches torch {torch.__version__}) and run again (exit 1).")
        return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"fastlab gpu-check on {measure.device_name(torch.device('cuda'))}, torch {torch.__version__}, "
          f"CUDA {torch.version.cuda}", flush=True)
    outcomes = []
    for name, fn in CHECKS:
        t0 = time.perf_counter()
        detail, ok = within_deadline(fn, CHECK_DEADLINE_S)
        seconds = time.perf_counter() - t0
        outcomes.append({"check": name, "ok": ok, "seconds": round(seconds, 1), "detail": detail})
        print(f"{'PASS' if ok else 'FAIL'} [{seconds:5.1f} s] {name}: {detail}", flush=True)
        write_json(out / "checks.json", outcomes)
    if not args.no_ladder:
        tables, ok = within_deadline(lambda: run_ladders(out, args.ladder_budget_s),
                                     args.ladder_budget_s + LADDER_OVERRUN_S)
        if not ok:
            outcomes.append({"check": "ladders", "ok": False, "detail": tables})
        print(tables if ok else f"FAIL ladders: {tables}", flush=True)
    failed = [o["check"] for o in outcomes if not o["ok"]]
    print(f"{len(outcomes) - len(failed)} of {len(outcomes)} checks passed" + (f"; failed: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    # a fresh process cannot build __main__.UntunedForward: run the module imported under its own name (this
    # script's folder, tests/, is first on the import path, and a run's process takes that path)
    from gpu_check import main as importable_main

    sys.exit(importable_main())
