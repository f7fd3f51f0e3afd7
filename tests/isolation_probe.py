"""Models for tests/test_isolation.py, in a module a run's child process can import (not a test file's locals).

Each reports what it saw in the process that built it by appending a JSON line to the file named by
FASTLAB_PROBE_FILE (the child gets the caller's environment)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import torch
from torch import nn


def _report(**seen) -> None:
    with open(os.environ["FASTLAB_PROBE_FILE"], "a") as f:
        f.write(json.dumps({"pid": os.getpid(), **seen}) + "\n")


class TinyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                  nn.Linear(8, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def globals_now() -> dict:
    from fastlab.data import worker_start_method

    return {"cudnn_benchmark": torch.backends.cudnn.benchmark,
            "matmul_precision": torch.get_float32_matmul_precision(), "threads": torch.get_num_threads(),
            "worker_start_method": worker_start_method()}


def meddling_net() -> nn.Module:
    """Reports the globals it found, then sets three of them, as a run that changes them would."""
    _report(**globals_now())
    torch.backends.cudnn.benchmark = True
    torch.set_float32_matmul_precision("medium")
    torch.set_num_threads(1)
    return TinyNet()


class DiesAtForward(TinyNet):
    """Kills its own process at its `at`-th training forward pass: a crash no Python code can catch."""

    def __init__(self, at: int = 6) -> None:
        super().__init__()
        self.at, self.calls = at, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.calls += 1
            if self.calls == self.at:
                os.kill(os.getpid(), signal.SIGKILL)
        return super().forward(x)


def dies_at_forward() -> nn.Module:
    return DiesAtForward()


def refusing_net() -> nn.Module:
    raise ValueError("refusing_net: a clear message from the reader's own model")


class FlagReporter(TinyNet):
    """Reports the backend flags in force at its first training forward pass (inside the run)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and not getattr(self, "reported", False):
            self.reported = True
            _report(conv_fp32_precision=torch.backends.cudnn.conv.fp32_precision, matmul_precision=torch.get_float32_matmul_precision())
        return super().forward(x)


def flag_reporting_net() -> nn.Module:
    return FlagReporter()


class SlowNet(TinyNet):
    """Sleeps 0.3 s at every training forward pass: a step slow enough to run into a time budget."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            time.sleep(0.3)
        return super().forward(x)


def slow_net() -> nn.Module:
    return SlowNet()


def where_a_large_array_lands() -> int:
    """The address of a 4 MB array (mapped pages, as a run's activations and images are)."""
    return torch.empty(1 << 20).data_ptr()


class HangsAtForward(TinyNet):
    """Reports, then hangs for a minute at its first training forward pass, deaf to any stop: a child stuck in a
    CUDA call or a DataLoader deadlock."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            _report(hanging=True)
            time.sleep(60)
        return super().forward(x)


def hangs_at_forward() -> nn.Module:
    return HangsAtForward()


class SleepsAtThirdStep(TinyNet):
    """Reports its process, then sleeps SLEEP_AT_THIRD_STEP_S inside its third training step: a step far longer
    than any time budget (a trap's 35-47 s step on a CPU without fast kernels for its dtype)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.calls += 1
            if self.calls == 3:
                _report(sleeping=True, run_pid=os.getpid())
                time.sleep(SLEEP_AT_THIRD_STEP_S)
        return super().forward(x)


SLEEP_AT_THIRD_STEP_S = 20.0


def sleeps_at_third_step() -> nn.Module:
    return SleepsAtThirdStep()


RELEASE = threading.Event()  # set by a test to let an item blocked in the test's own process return


class HangsAfter(torch.utils.data.Dataset):
    """CIFAR-shaped random items, 10 classes; in a process other than the one that built it (a run's process, a
    DataLoader worker), once it has served `after` items there, every further item blocks (a hung network file
    system, a stuck decoder). The building process (which checks a sample before any timing) is served at once,
    unless `anywhere`: then it blocks there too (a run in the caller's process), until RELEASE is set."""

    def __init__(self, items: int = 512, after: int = 10**9, anywhere: bool = False) -> None:
        self.items, self.after, self.served, self.home = items, after, 0, -1 if anywhere else os.getpid()

    def __getstate__(self) -> dict:
        return {**self.__dict__, "served": 0}  # each process counts its own

    def __len__(self) -> int:
        return self.items

    def __getitem__(self, i: int):
        if os.getpid() != self.home:
            self.served += 1
            if self.served > self.after:
                RELEASE.wait(3600)
        g = torch.Generator().manual_seed(i)
        return torch.rand(3, 32, 32, generator=g), int(i % 10)


def hung_run_main() -> None:
    """A script's whole run (tests/test_isolation.py starts it, then kills this process): two workers, both hung
    once the run's process has checked its sample of the items (fastlab.preflight)."""
    import fastlab
    from fastlab.preflight import sampled_indices

    cfg = fastlab.config_for("smoke").replace(loader="dataloader", num_workers=2)
    fastlab.run(cfg, dataset=(HangsAfter(after=len(sampled_indices(512))), HangsAfter()), progress=False)
