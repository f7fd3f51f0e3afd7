"""Benchmark (not a test): fastlab.run against a bare hand-written loop of the same configuration, and the cost
of running each run in a fresh process.

1. The harness's own cost: fastlab.run and a bare loop train the same model on the same batches, each in a fresh
   process started the same way (fastlab.isolation's forkserver), alternating, several times; prints each one's
   median throughput and the ratio (goal: under 2%).
2. Isolation's cost: the wall time of one fastlab.run in a fresh process against the same run in a fresh thread
   of this process (FASTLAB_ISOLATION=thread), alternating: what a reader waits for per run.

    python tests/benchmark_overhead.py [--profile cpu] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

import fastlab
from fastlab.data import DeviceLoader, forever, load_images
from fastlab.measure import now, resolve_device
from fastlab.models import build_model


def bare_loop(cfg: fastlab.TrainConfig) -> float:
    """The same training, written plainly: returns images/s over the timed steps."""
    device = resolve_device(cfg.device)
    images = load_images(cfg.dataset, cfg.train_images, cfg.eval_images, allow_download=False)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    batches = forever(DeviceLoader(images.train_images, images.train_labels, batch_size=cfg.batch_size, train=True,
                                   device=device, seed=cfg.seed))
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    for step in range(cfg.warmup_steps + cfg.steps):
        if step == cfg.warmup_steps:
            t0 = now(device)
        x, y = next(batches)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        if (step + 1) % cfg.log_every == 0:
            loss.item()
    return cfg.batch_size * cfg.steps / (now(device) - t0)


def _bare_child(conn, cfg: fastlab.TrainConfig) -> None:
    conn.send(bare_loop(cfg))
    conn.close()


def bare_in_fresh_process(cfg: fastlab.TrainConfig) -> float:
    """bare_loop in a child of the same forkserver that fastlab.run uses, so both execute the same way."""
    import benchmark_overhead  # this file, by its module name: a child cannot import __main__

    from fastlab import isolation

    ctx = isolation._mp_context()
    here, there = ctx.Pipe(duplex=False)
    child = ctx.Process(target=benchmark_overhead._bare_child, args=(there, cfg))
    with isolation._without_main():
        child.start()
    there.close()
    value = here.recv()
    child.join()
    return value


def isolation_cost(cfg: fastlab.TrainConfig, repeats: int) -> tuple[list[float], list[float]]:
    """Wall seconds of fastlab.run in a fresh process and in a fresh thread, alternating."""
    import os

    process, thread = [], []
    for _ in range(repeats):
        for where, into in (("process", process), ("thread", thread)):
            os.environ["FASTLAB_ISOLATION"] = where
            t = time.perf_counter()
            fastlab.run(cfg, progress=False)
            into.append(time.perf_counter() - t)
    os.environ.pop("FASTLAB_ISOLATION")
    return process, thread


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", default=None)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    cfg = fastlab.config_for(args.profile, loader="device", dataset="synthetic", log_every=10)
    harness, bare = [], []
    for _ in range(args.repeats):
        t = time.perf_counter()
        r = fastlab.run(cfg, progress=False)
        harness.append(r.images_per_step * cfg.steps / r.timed_seconds)
        bare.append(bare_in_fresh_process(cfg))
        print(f"  repeat: harness {harness[-1]:,.0f} images/s, bare loop {bare[-1]:,.0f} images/s "
              f"({time.perf_counter() - t:.0f} s)")
    h, b = statistics.median(harness), statistics.median(bare)
    print(f"profile {cfg.profile}, model {cfg.model}, batch {cfg.batch_size}, {cfg.steps} timed steps, "
          f"device {r.env['device_name']}, SYNTHETIC data")
    print(f"harness {h:,.0f} images/s (range {min(harness):,.0f}-{max(harness):,.0f}); "
          f"bare loop {b:,.0f} images/s (range {min(bare):,.0f}-{max(bare):,.0f})")
    print(f"harness / bare = {h / b:.3f}; overhead {max(0.0, 1 - h / b):.1%} (goal: under 2%)")
    fastlab.run(cfg, progress=False)  # the forkserver is started (about 4 s once per kernel): not counted below
    process, thread = isolation_cost(cfg, args.repeats)
    p, t = statistics.median(process), statistics.median(thread)
    print(f"one run in a fresh process {p:.2f} s (range {min(process):.2f}-{max(process):.2f}), in a fresh thread "
          f"{t:.2f} s (range {min(thread):.2f}-{max(thread):.2f}): isolation costs {p - t:+.2f} s a run")


if __name__ == "__main__":
    main()
