"""Benchmark (not a test): a loop watched by fastlab.watch against the same loop unwatched.

Both train the same model on the same device-resident batches in this one process, alternating, several
times, and each is timed by the same outside clock (synchronised, from the end of warm-up to the last step).
Prints each one's median throughput, the ratio of the medians and the spread of the paired ratios. Watching
(a clock read and a memory sample per step, a sync every window_steps steps) should cost under 2%.

On a machine shared with other work the A/B ratio carries that work's noise, so the benchmark also times the
watch's own bookkeeping alone (the two touches around an empty step, thousands of times) and prints it as a
share of the unwatched loop's median step: a bound that load does not blur the way it blurs the ratio.

--short-step times a ~3 ms step instead: the network of PyTorch's CIFAR-10 tutorial at batch 4 on batches in
memory, the loop on which watch's per-step memory read was about 1% of the step (issue 29); the step's own
median time is printed beside the ratio.

    python tests/benchmark_watch.py [--profile smoke] [--steps 100] [--repeats 7] [--threads N] [--short-step]
    (about a minute on 2 idle cores)
"""

from __future__ import annotations

import argparse
import statistics
import time
from itertools import islice

import torch
from test_watch_real_loops import TutorialNet  # the tutorial's net, defined once, beside its tests
from torch import nn

import fastlab
from fastlab.data import DeviceLoader, ImageSet, forever, load_images
from fastlab.measure import now, resolve_device
from fastlab.models import build_model


def loop(cfg: fastlab.TrainConfig, images: ImageSet, watched: bool) -> tuple[float, fastlab.RunResult | None]:
    """One plain training loop, with or without the two touches; images/s over the steps after warm-up."""
    device = resolve_device(cfg.device)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    loader = DeviceLoader(images.train_images, images.train_labels, batch_size=cfg.batch_size, train=True,
                          device=device, seed=cfg.seed)
    batches = islice(forever(loader), cfg.warmup_steps + cfg.steps)
    w = fastlab.watch("watched", device=device, warmup_steps=cfg.warmup_steps) if watched else None
    model.train()
    for step, (x, y) in enumerate(w(batches) if w is not None else batches):
        if step == cfg.warmup_steps:
            t0 = now(device)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if (step + 1) % cfg.log_every == 0:
            loss.item()
        if w is not None:
            w.step_done(len(x))
    rate = cfg.batch_size * cfg.steps / (now(device) - t0)
    return rate, (w.result() if w is not None else None)




def short_loop(batches: list, warmup: int, watched: bool) -> tuple[float, float, fastlab.RunResult | None]:
    """The tutorial's loop (batch 4, SGD with momentum) on batches in memory: (images/s, median step s, result)."""
    torch.manual_seed(0)
    net = TutorialNet()
    opt = torch.optim.SGD(net.parameters(), lr=0.001, momentum=0.9)
    w = fastlab.watch("watched, short step", device="cpu", warmup_steps=warmup) if watched else None
    steps, t_prev = [], 0.0
    for i, (x, y) in enumerate(w(batches) if w is not None else batches):
        if i == warmup:
            t0 = t_prev = time.perf_counter()
        opt.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
        if w is not None:
            w.step_done(len(x))
        if i >= warmup:
            t = time.perf_counter()
            steps.append(t - t_prev)
            t_prev = t
    rate = len(batches[0][0]) * (len(batches) - warmup) / (time.perf_counter() - t0)
    return rate, statistics.median(steps), (w.result() if w is not None else None)


def short_step_main(steps: int, repeats: int) -> None:
    gen = torch.Generator().manual_seed(0)
    warmup = 10
    batches = [(torch.randn(4, 3, 32, 32, generator=gen), torch.randint(0, 10, (4,), generator=gen))
               for _ in range(warmup + steps)]
    short_loop(batches, warmup, True)  # a first pass of each kind, not counted
    short_loop(batches, warmup, False)
    watched, plain, step_s = [], [], []
    for i in range(repeats):
        for kind in (("watched", "plain") if i % 2 == 0 else ("plain", "watched")):
            rate, step, r = short_loop(batches, warmup, watched=kind == "watched")
            (watched if kind == "watched" else plain).append(rate)
            if kind == "plain":
                step_s.append(step)
            else:
                sampled = len(r.extras["watch"]["memory_steps"])
        print(f"  repeat {i + 1}: watched {watched[-1]:,.0f} images/s, unwatched {plain[-1]:,.0f} images/s")
    w, p = statistics.median(watched), statistics.median(plain)
    ratios = [a / b for a, b in zip(watched, plain)]
    print(f"short step: the CIFAR-10 tutorial's net, batch 4, {steps} timed steps, median unwatched step "
          f"{statistics.median(step_s) * 1000:.2f} ms, memory sampled on {sampled} of {warmup + steps} steps, "
          f"torch threads {torch.get_num_threads()}, SYNTHETIC data")
    print(f"watched {w:,.0f} images/s (range {min(watched):,.0f}-{max(watched):,.0f}); "
          f"unwatched {p:,.0f} images/s (range {min(plain):,.0f}-{max(plain):,.0f})")
    print(f"watched / unwatched = {w / p:.3f} (paired ratios {min(ratios):.3f}-{max(ratios):.3f}, median "
          f"{statistics.median(ratios):.3f}); overhead {max(0.0, 1 - w / p):.1%} (target: under 2%)")


def bookkeeping_seconds(device: torch.device, steps: int = 2000, blocks: int = 5) -> float:
    """Median seconds per step that watch adds around an empty step (loader touch + step_done)."""
    per_step = []
    for _ in range(blocks):
        w = fastlab.watch("bookkeeping", device=device, warmup_steps=3)
        t = time.perf_counter()
        for _ in w(range(steps)):
            w.step_done(32)
        per_step.append((time.perf_counter() - t) / steps)
        w.result()
    return statistics.median(per_step)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", default="smoke", help="smoke (tiny net, short steps: strictest), cpu, gpu")
    parser.add_argument("--steps", type=int, default=100, help="timed steps per loop")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's own)")
    parser.add_argument("--short-step", action="store_true", help="a ~3 ms step: the CIFAR-10 tutorial's net, batch 4")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.short_step:
        short_step_main(args.steps * 5, args.repeats)  # 5x the steps: each is ~20x shorter than the smoke net's
        return
    cfg = fastlab.config_for(args.profile, dataset="synthetic", log_every=10, steps=args.steps)
    images = load_images(cfg.dataset, cfg.train_images, cfg.eval_images, allow_download=False)
    _, result = loop(cfg, images, watched=True)  # a first pass of each kind, not counted: lazy set-up, caches
    loop(cfg, images, watched=False)
    watched, plain = [], []
    for i in range(args.repeats):
        t = time.perf_counter()
        # alternate which goes first, so a drift in the machine's load falls on both alike
        for kind in (("watched", "plain") if i % 2 == 0 else ("plain", "watched")):
            rate, r = loop(cfg, images, watched=kind == "watched")
            (watched if kind == "watched" else plain).append(rate)
            result = r or result
        print(f"  repeat {i + 1}: watched {watched[-1]:,.0f} images/s, unwatched {plain[-1]:,.0f} images/s "
              f"({time.perf_counter() - t:.0f} s)")
    w, p = statistics.median(watched), statistics.median(plain)
    ratios = [a / b for a, b in zip(watched, plain)]
    print(f"profile {cfg.profile}, model {cfg.model}, batch {cfg.batch_size}, {cfg.steps} timed steps, "
          f"window_steps {result.config['window_steps']}, device {result.env['device_name']}, SYNTHETIC data")
    print(f"watched {w:,.0f} images/s (range {min(watched):,.0f}-{max(watched):,.0f}); "
          f"unwatched {p:,.0f} images/s (range {min(plain):,.0f}-{max(plain):,.0f})")
    print(f"watched / unwatched = {w / p:.3f} (paired ratios {min(ratios):.3f}-{max(ratios):.3f}, median "
          f"{statistics.median(ratios):.3f}); overhead {max(0.0, 1 - w / p):.1%} (target: under 2%)")
    own, step = bookkeeping_seconds(resolve_device(cfg.device)), cfg.batch_size / p
    print(f"watch's own bookkeeping: {own * 1e6:.0f} us per step = {own / step:.2%} of the unwatched loop's median "
          f"step ({step * 1000:.1f} ms), torch threads {torch.get_num_threads()}")


if __name__ == "__main__":
    main()
