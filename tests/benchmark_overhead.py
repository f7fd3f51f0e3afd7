"""Benchmark (not a test): fastlab.run against a bare hand-written loop of the same configuration.

Both train the same model on the same batches in this one process, alternating, several times;
prints each one's median throughput and the ratio. The harness's own cost (timers, memory
samples, progress bookkeeping) should stay under 5% of throughput.

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
        bare.append(bare_loop(cfg))
        print(f"  repeat: harness {harness[-1]:,.0f} images/s, bare loop {bare[-1]:,.0f} images/s "
              f"({time.perf_counter() - t:.0f} s)")
    h, b = statistics.median(harness), statistics.median(bare)
    print(f"profile {cfg.profile}, model {cfg.model}, batch {cfg.batch_size}, {cfg.steps} timed steps, "
          f"device {r.env['device_name']}, SYNTHETIC data")
    print(f"harness {h:,.0f} images/s (range {min(harness):,.0f}-{max(harness):,.0f}); "
          f"bare loop {b:,.0f} images/s (range {min(bare):,.0f}-{max(bare):,.0f})")
    print(f"harness / bare = {h / b:.3f}; overhead {max(0.0, 1 - h / b):.1%} (target: under 5%)")


if __name__ == "__main__":
    main()
