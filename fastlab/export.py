"""Deployment export: torch.export, ONNX through the dynamo exporter, inference in onnxruntime (the optional
`export` extra, imported when used), and what the deprecated TorchScript APIs warn."""

from __future__ import annotations

import contextlib
import copy
import io
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from .measure import Spread, synchronize
from .verdicts import Comparison, verdict


def torchscript_warnings(model: nn.Module, example: torch.Tensor) -> dict[str, list[str]]:
    """The distinct warnings torch.jit.script and torch.jit.trace emit on `model`; a failure is an "error:" entry."""
    out: dict[str, list[str]] = {}
    model = copy.deepcopy(model).to(example.device).eval()  # scripting must not touch the caller's module
    apis = {"torch.jit.script": torch.jit.script, "torch.jit.trace": lambda m: torch.jit.trace(m, example)}
    for api, fn in apis.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                fn(model)
                error = None
            except (RuntimeError, TypeError, NotImplementedError) as e:  # TorchScript's own failures
                error = f"error: {type(e).__name__}: {str(e).splitlines()[0]}"
        messages = list(dict.fromkeys(f"{w.category.__name__}: {w.message}" for w in caught))
        out[api] = messages + ([error] if error else [])
    return out


def _check_example(example: torch.Tensor) -> None:
    if not isinstance(example, torch.Tensor) or example.dim() != 4:
        shape = tuple(example.shape) if isinstance(example, torch.Tensor) else type(example).__name__
        raise ValueError(f"example={shape} is not allowed: a 4-d image batch (N, C, H, W) is needed")
    if example.shape[0] < 2:
        raise ValueError(f"example batch size {example.shape[0]} is not allowed: use at least 2 images, so the "
                         f"exported batch dimension stays dynamic (torch.export specialises sizes 0 and 1)")


@dataclass
class ExportResult:
    """Where the exported files are, how big they are, and how long each export took."""

    folder: Path
    program: torch.export.ExportedProgram
    files: dict[str, Path] = field(default_factory=dict)  # kind -> path: "state_dict", "torch.export", "onnx"
    seconds: dict[str, float] = field(default_factory=dict)  # kind -> wall time of the export

    def sizes_kib(self) -> dict[str, float]:
        return {kind: path.stat().st_size / 1024 for kind, path in self.files.items()}

    def summary(self) -> str:
        lines = []
        for kind, size in self.sizes_kib().items():
            took = f", exported in {self.seconds[kind]:.1f} s" if kind in self.seconds else ""
            lines.append(f"{kind:<13} {size:8.1f} KiB  {self.files[kind].name}{took}")
        return "\n".join(lines)


def export_model(model: nn.Module, example: torch.Tensor, folder: str | Path, *, name: str = "model",
                 opset: int | None = None) -> ExportResult:
    """Export `model` (eval mode, on the CPU) with a dynamic batch dimension into folder: name.pt (state_dict, for
    the size comparison), name.pt2 (torch.export) and name.onnx (dynamo exporter, weights embedded)."""
    _check_example(example)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model = copy.deepcopy(model).cpu().eval()
    example = example.detach().cpu()
    files: dict[str, Path] = {"state_dict": folder / f"{name}.pt", "torch.export": folder / f"{name}.pt2",
                              "onnx": folder / f"{name}.onnx"}
    torch.save(model.state_dict(), files["state_dict"])
    batch = torch.export.Dim("batch", min=1)
    seconds = {}
    t0 = time.perf_counter()
    program = torch.export.export(model, (example,), dynamic_shapes=({0: batch},))
    seconds["torch.export"] = time.perf_counter() - t0
    torch.export.save(program, files["torch.export"])
    t0 = time.perf_counter()
    # The exporter narrates its passes on stdout; keep the notebook's output to what we print.
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kwargs = {} if opset is None else {"opset_version": opset}
        torch.onnx.export(program, (example,), str(files["onnx"]), dynamo=True, external_data=False,
                          input_names=["images"], output_names=["logits"], **kwargs)
    seconds["onnx"] = time.perf_counter() - t0
    return ExportResult(folder=folder, program=program, files=files, seconds=seconds)


def onnx_session(path: str | Path, threads: int | None = None):
    """An onnxruntime CPU session; threads defaults to torch's intra-op thread count (a fair comparison)."""
    try:
        import onnxruntime as ort
    except ImportError as e:
        raise ImportError("onnxruntime is not installed: pip install 'fastlab[export]'") from e
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or torch.get_num_threads()
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def onnx_runner(session) -> Callable[[torch.Tensor], torch.Tensor]:
    """A function images -> logits running the onnxruntime session."""
    input_name = session.get_inputs()[0].name

    def run(x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(session.run(None, {input_name: x.detach().cpu().numpy()})[0])

    return run


def latency_ms(fn: Callable[[torch.Tensor], object], x: torch.Tensor, *, repeats: int = 30,
               warmup: int = 5) -> Spread:
    """Milliseconds per call of fn(x): `warmup` calls excluded, then each of `repeats` calls timed alone."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats={repeats!r}, warmup={warmup!r} is not allowed: repeats >= 1, warmup >= 0")
    device = x.device
    times = []
    with torch.inference_mode():
        for _ in range(warmup):
            fn(x)
        for _ in range(repeats):
            synchronize(device)
            t0 = time.perf_counter()
            fn(x)
            synchronize(device)
            times.append(1000 * (time.perf_counter() - t0))
    return Spread.of(times)


def latency_verdict(base: Spread, other: Spread) -> Comparison:
    """Two latencies in ms (lower is better), by the one noise rule; printed, "0.52x the latency (lower); ..."."""
    return verdict(base, other, "ms", higher_is_better=False, quantity="latency", fmt=".2f")


@dataclass
class Parity:
    max_abs_diff: float  # largest |logit - eager logit| over the batch
    top1_agreement: float  # share of images whose argmax class matches eager's

    def __str__(self) -> str:
        return f"max |diff| {self.max_abs_diff:.2e}, same top-1 on {self.top1_agreement:.0%} of the batch"


def parity(reference: torch.Tensor, other: torch.Tensor) -> Parity:
    """How closely `other` logits match `reference` logits of the same batch."""
    if reference.shape != other.shape:
        raise ValueError(f"logits shapes differ: {tuple(reference.shape)} vs {tuple(other.shape)}")
    ref, oth = reference.detach().float().cpu(), other.detach().float().cpu()
    agree = (ref.argmax(1) == oth.argmax(1)).float().mean().item()
    return Parity(max_abs_diff=(ref - oth).abs().max().item(), top1_agreement=agree)


@dataclass
class RuntimeResult:
    name: str
    latency: Spread  # ms per batch
    parity: Parity  # against eager PyTorch
    batch_size: int

    def summary(self) -> str:
        t = self.latency
        return (f"{self.name:<22} {t.median:7.2f} ms per batch of {self.batch_size} (min {t.low:.2f}, max {t.high:.2f},"
                f" {t.n} calls); {self.parity}")


def compare_runtimes(model: nn.Module, batch: torch.Tensor, exported: ExportResult, *, repeats: int = 30,
                     warmup: int = 5, threads: int | None = None) -> list[RuntimeResult]:
    """Eager PyTorch, the torch.export program and onnxruntime on one batch, all on the CPU."""
    model = copy.deepcopy(model).cpu().eval()
    batch = batch.detach().cpu()
    runners: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "eager PyTorch": model,
        "torch.export program": exported.program.module(),
        "onnxruntime": onnx_runner(onnx_session(exported.files["onnx"], threads)),
    }
    with torch.inference_mode():
        reference = model(batch)
    out = []
    for name, fn in runners.items():
        with torch.inference_mode():
            logits = fn(batch)
        out.append(RuntimeResult(name=name, latency=latency_ms(fn, batch, repeats=repeats, warmup=warmup),
                                 parity=parity(reference, logits), batch_size=len(batch)))
    return out
