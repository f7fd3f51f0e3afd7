"""The code of any run: `code(cfg)` writes the run as one standalone PyTorch script; `code_diff` shows a change.

The script imports torch and torchvision (and numpy, which they need), never fastlab. It holds the run's data
(the synthetic set, or CIFAR-10 through torchvision), its model, optimiser, schedule and the training loop with
each technique's lines, and prints images/s (median over timed windows, warm-up excluded, synchronised on CUDA),
the final loss and the held-out accuracy. A knob at its TrainConfig default adds no line.

Which kind of "the code shown is the code that runs": a template, proven by running it. fastlab's loop is spread
over loop.py, builders.py, clocks.py and data.py, and carries the measuring (clocks, stop events, divergence
checks, DDP hooks) that a reader's script does not need; cutting untaken branches out of that source would leave
a script that still calls those helpers. So the loop here is a template written from the same knobs, and
tests/test_code.py proves it: the script of every configuration the bench ladders and the notebooks' registered
comparisons run is run in a fresh process (forked from a `python -I` interpreter that has imported only torch,
torchvision and numpy, with fastlab blocked and checked unimportable): exit 0, a finite and falling loss. On the
CPU a few scripts print the same first loss, final loss and held-out accuracy as `fastlab.run` of the same config
(same seed, same data, same random augmentations: equal to the printed digits). The pieces that are plain
definitions (the synthetic set, the per-image Dataset, the device-resident loader, the models) are fastlab's own
source, copied with `inspect.getsource`, so they cannot drift. Left out of the script: the harness (max_seconds,
Ctrl-C, OOM, divergence checks, progress bars) and the no-op fallbacks (an optimiser implementation or bf16 this
machine lacks is an error here, not a recorded no-op).
"""

from __future__ import annotations

import difflib
import html
import inspect
import textwrap
from dataclasses import dataclass

from . import data, models
from .config import TrainConfig

_STOCK = TrainConfig()  # a knob equal to its default here adds no line
_CHANGED = "Changed from fastlab's TrainConfig defaults:"


def _source(*objects: object) -> str:
    return "\n\n".join(inspect.getsource(o).rstrip() for o in objects)  # type: ignore[arg-type]


def _dataset(cfg: TrainConfig) -> str:
    """'cifar10' or 'synthetic': 'auto' is resolved as fastlab resolves it offline (CIFAR-10 if on disk)."""
    if cfg.dataset != "auto":
        return cfg.dataset
    return "cifar10" if cfg.profile != "smoke" and data.cifar10_on_disk(data.data_dir()) else "synthetic"


# ------------------------------------------------------------------ the parts above main()


def _header(cfg: TrainConfig, dataset: str) -> str:
    changed = ", ".join(f"{k}={v!r}" for k, v in _STOCK.diff(cfg).items()) or "none"
    kind = "SYNTHETIC (CIFAR-shaped, generated offline)" if dataset == "synthetic" else "real CIFAR-10 (torchvision)"
    imports = ["import statistics", "import time", "from collections.abc import Iterator", "",
               "import numpy as np", "import torch"]
    if cfg.loader == "dataloader" or cfg.model == "resnet18" or dataset == "cifar10":
        imports.append("import torchvision")
    imports += ["from torch import nn", "from torch.nn import functional as F"]
    if cfg.loader == "dataloader":
        imports.append("from torch.utils.data import DataLoader, Dataset")
    return "\n".join([
        '"""One fastlab training run as a plain PyTorch script (written by fastlab.code; it does not import fastlab).',
        "", *textwrap.wrap(f"{_CHANGED} {changed}.", 112, subsequent_indent="    "), f"Data: {kind}.", '"""', "",
        "from __future__ import annotations", "", *imports, ""])


def _settings(cfg: TrainConfig, dataset: str) -> str:
    if cfg.device == "auto":
        device = ('torch.device("cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() '
                  'else "cpu")')
    else:
        device = f"torch.device({cfg.device!r})"
    lines = ["", "# ------------------------------------------------------------------ the run's settings",
             f"DEVICE = {device}",
             f"BATCH_SIZE = {cfg.batch_size}  # images per micro-batch"]
    if cfg.grad_accum_steps > 1:
        lines.append(f"GRAD_ACCUM_STEPS = {cfg.grad_accum_steps}  # micro-batches per optimiser step")
    images = "BATCH_SIZE * GRAD_ACCUM_STEPS" if cfg.grad_accum_steps > 1 else "BATCH_SIZE"
    lines += [f"IMAGES_PER_STEP = {images}",
              f"WARMUP_STEPS = {cfg.warmup_steps}  # untimed first steps: compilation, autotuning, allocator warm-up",
              f"STEPS = {cfg.steps}  # timed optimiser steps, split into WINDOWS windows",
              f"WINDOWS = {cfg.windows}",
              f"TRAIN_IMAGES, EVAL_IMAGES = {cfg.train_images}, {cfg.eval_images}",
              f"SEED = {cfg.seed}"]
    if cfg.log_every > 1:
        lines.append(f"LOG_EVERY = {cfg.log_every}  # steps between loss reads: each .item() is a host-device sync")
    lines += [f"CIFAR_MEAN = {data.CIFAR_MEAN}", f"CIFAR_STD = {data.CIFAR_STD}", f"NUM_CLASSES = {data.NUM_CLASSES}"]
    if dataset == "synthetic":
        lines.append(f"SYNTHETIC_SEED = {data.SYNTHETIC_SEED}  # the synthetic set is the same for every run seed")
    else:
        lines.append(f"DATA_DIR = {str(data.data_dir())!r}  # torchvision's CIFAR-10 folder goes here")
    if cfg.model in ("tiny", "compact"):
        lines.append(f"BN_MOMENTUM = {models.BN_MOMENTUM}  # BatchNorm running statistics that keep up with a fast net")
    return "\n".join(lines) + "\n"


def _data_part(cfg: TrainConfig, dataset: str) -> str:
    head = "\n\n# ------------------------------------------------------------------ data: "
    if dataset == "synthetic":
        part = head + "SYNTHETIC, CIFAR-shaped (uint8 32x32x3, 10 classes)\n\n\n"
        part += _source(data.make_synthetic, data._crop)
    else:
        part = head + "real CIFAR-10 through torchvision (downloads once into DATA_DIR)\n\n\n" + _CIFAR_READER
    if cfg.loader == "dataloader":
        part += "\n\n\n" + _source(data.image_transform, data.CifarLikeDataset)
    else:
        part += "\n\n\n" + _source(data.DeviceLoader)
    return part + "\n\n\n" + _source(data.forever)


_CIFAR_READER = '''def read_cifar10(split: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The first n images of CIFAR-10's train or test split: uint8 HxWxC and int64 labels."""
    ds = torchvision.datasets.CIFAR10(DATA_DIR, train=split == "train", download=True)
    return ds.data[:n], np.asarray(ds.targets[:n], dtype=np.int64)'''

def _model_part(cfg: TrainConfig) -> str:
    head = "\n\n# ------------------------------------------------------------------ the model\n\n\n"
    if cfg.model == "resnet18":
        return head + _source(models.resnet18_cifar)
    net = models.TinyNet if cfg.model == "tiny" else models.CompactNet
    return head + _source(models._conv_bn, net)


_MODEL_CALL = {"tiny": "TinyNet()", "compact": "CompactNet()", "resnet18": "resnet18_cifar()"}


def _evaluate_part(cfg: TrainConfig) -> str:
    decorator = {"no_grad": "@torch.no_grad()  # no graph is recorded: less memory, less time",
                 "inference_mode": "@torch.inference_mode()  # like no_grad, and tensors skip autograd's bookkeeping",
                 "autograd": "# no torch.no_grad(): autograd records every op of evaluation (the pitfall)"}[cfg.eval_mode]
    lines = ["", "", "", "def sync() -> None:",
             '    """Wait for queued GPU work: a clock read without it would time only the launches."""',
             '    if DEVICE.type == "cuda":', "        torch.cuda.synchronize(DEVICE)", "", "",
             "def per_second(rate: float) -> str:",
             '    """A rate to print: whole numbers from 100 up, three significant digits below (never "0")."""',
             '    return f"{rate:.0f}" if rate >= 100 else f"{rate:.3g}"', "", "", decorator,
             "def evaluate(model: nn.Module, images: np.ndarray, labels: np.ndarray) -> float:",
             '    """Held-out accuracy: the images normalised on the device, no augmentation."""',
             "    model.eval()",
             "    mean = torch.tensor(CIFAR_MEAN, device=DEVICE).view(1, 3, 1, 1) * 255",
             "    std = torch.tensor(CIFAR_STD, device=DEVICE).view(1, 3, 1, 1) * 255",
             "    correct = 0",
             "    for i in range(0, len(labels), BATCH_SIZE):",
             "        x = torch.from_numpy(images[i : i + BATCH_SIZE]).to(DEVICE).permute(0, 3, 1, 2).contiguous()",
             "        x = (x.float() - mean) / std",
             "        y = torch.from_numpy(labels[i : i + BATCH_SIZE]).to(DEVICE)"]
    if cfg.channels_last:
        lines.append("        x = x.contiguous(memory_format=torch.channels_last)")
    lines += _autocast_block(cfg, "logits = model(x)", indent=8)
    lines += ["        correct += int((logits.argmax(1) == y).sum())", "    model.train()",
              "    return correct / len(labels)", ""]
    return "\n".join(lines)


_AMP_DTYPE = {"fp16": "torch.float16", "bf16": "torch.bfloat16"}


def _autocast_block(cfg: TrainConfig, line: str, indent: int) -> list[str]:
    pad = " " * indent
    if cfg.amp == "off":
        return [pad + line]
    return [f"{pad}with torch.autocast(DEVICE.type, dtype={_AMP_DTYPE[cfg.amp]}):  # per op: convolutions, matmuls in {cfg.amp}",
            f"{pad}    {line}"]


# ------------------------------------------------------------------ main(): setup, loop, report


def _backend_lines(cfg: TrainConfig) -> list[str]:
    lines = []
    if cfg.cudnn_benchmark:
        lines.append("torch.backends.cudnn.benchmark = True  # cuDNN times its algorithms per input shape, keeps the fastest")
    if cfg.tf32 != _STOCK.tf32:
        lines.append(f"torch.backends.cudnn.allow_tf32 = {cfg.tf32}  # TensorFloat-32 in cuDNN convolutions "
                     f"(torch's default: True)")
    if cfg.matmul_precision != _STOCK.matmul_precision:
        lines.append(f'torch.set_float32_matmul_precision("{cfg.matmul_precision}")  # fp32 matmuls may use '
                     f'{"TF32" if cfg.matmul_precision == "high" else "TF32 on CUDA, bf16 on a CPU with it"}')
    return lines


def _data_lines(cfg: TrainConfig, dataset: str) -> list[str]:
    if dataset == "synthetic":
        lines = ['train_x, train_y = make_synthetic(TRAIN_IMAGES, "train")',
                 'eval_x, eval_y = make_synthetic(EVAL_IMAGES, "eval")',
                 'print(f"data: SYNTHETIC, {len(train_y)} train / {len(eval_y)} held-out images")']
    else:
        lines = ['train_x, train_y = read_cifar10("train", TRAIN_IMAGES)',
                 'eval_x, eval_y = read_cifar10("test", EVAL_IMAGES)',
                 'print(f"data: real CIFAR-10, {len(train_y)} train / {len(eval_y)} held-out images")']
    return lines


def _model_lines(cfg: TrainConfig) -> list[str]:
    lines = ["torch.manual_seed(SEED)", f"model = {_MODEL_CALL[cfg.model]}.to(DEVICE)"]
    if cfg.channels_last:
        lines.append("model = model.to(memory_format=torch.channels_last)  # NHWC weights: what tensor cores want")
    return lines


_OPTIMIZERS = {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW"}
_OPT_IMPL = {"default": "", "for-loop": "foreach=False", "foreach": "foreach=True", "fused": "fused=True"}
_OPT_IMPL_WHY = {"for-loop": "one parameter at a time", "foreach": "one multi-tensor kernel per operation",
                 "fused": "the whole update in one kernel"}


def _optimizer_lines(cfg: TrainConfig) -> list[str]:
    args = [f"lr={cfg.lr!r}", f"weight_decay={cfg.weight_decay!r}"]
    if cfg.optimizer == "sgd":
        args += [f"momentum={cfg.momentum!r}", "nesterov=True"]
    call = f"optimizer = torch.optim.{_OPTIMIZERS[cfg.optimizer]}(model.parameters(), {', '.join(args)}"
    if cfg.opt_impl == "default":
        lines = [call + ")"]
    else:
        pad = " " * len(f"optimizer = torch.optim.{_OPTIMIZERS[cfg.optimizer]}(")
        lines = [call + ",", f"{pad}{_OPT_IMPL[cfg.opt_impl]})  # {_OPT_IMPL_WHY[cfg.opt_impl]}"]
    total = "WARMUP_STEPS + STEPS"
    if cfg.scheduler == "cosine":
        lines.append(f"scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max={total})")
    elif cfg.scheduler == "onecycle":
        lines.append(f"scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr={cfg.lr!r}, "
                     f"total_steps={total})")
    if cfg.compile != "off":
        mode = "" if cfg.compile == "default" else f'mode="{cfg.compile}"'
        lines.append(f"compiled = torch.compile(model{', ' + mode if mode else ''})  # the same weights; "
                     f"compiled on the first steps (warm-up)")
    if cfg.amp == "fp16":
        lines.append("scaler = torch.amp.GradScaler(DEVICE.type)  # scales the loss so fp16 gradients do not "
                     "underflow")
    return lines


def _loader_lines(cfg: TrainConfig) -> list[str]:
    if cfg.loader == "device":
        return ["loader = DeviceLoader(train_x, train_y, batch_size=BATCH_SIZE, train=True, device=DEVICE, seed=SEED"
                + (", channels_last=True)" if cfg.channels_last else ")"),
                "batches = forever(loader)  # the whole set on the device, augmented a batch at a time"]
    lines = ["loader = DataLoader(CifarLikeDataset(train_x, train_y, train=True), batch_size=BATCH_SIZE, shuffle=True,",
             "                    drop_last=True, generator=torch.Generator().manual_seed(SEED),"]
    knobs = []
    if cfg.num_workers:
        knobs.append(f"num_workers={cfg.num_workers},  # worker processes decode and augment in parallel")
    if cfg.pin_memory:
        knobs.append('pin_memory=DEVICE.type == "cuda",  # page-locked batches: asynchronous copies to the GPU')
    if cfg.persistent_workers:
        knobs.append("persistent_workers=True,  # workers live on between epochs")
    if cfg.prefetch_factor is not None:
        knobs.append(f"prefetch_factor={cfg.prefetch_factor},  # batches each worker loads ahead")
    lines += ["                    " + k for k in knobs]
    lines[-1] = lines[-1].replace(",  #", ")  #", 1) if knobs else lines[-1].rstrip(",") + ")"
    return lines + ["batches = forever(loader)"]


def _step_lines(cfg: TrainConfig) -> list[str]:
    """One optimiser step: zero the gradients, forward and backward per micro-batch, then step."""
    accum = cfg.grad_accum_steps > 1
    pad = "        " if accum else "    "
    zero = "optimizer.zero_grad()" if cfg.set_to_none else \
        "optimizer.zero_grad(set_to_none=False)  # writes zeros into every gradient instead of freeing it"
    lines = ["    " + zero]
    if accum:
        lines.append("    for micro in range(GRAD_ACCUM_STEPS):  # gradients add up over the micro-batches")
    lines.append(pad + "x, y = next(batches)")
    if cfg.non_blocking and cfg.pin_memory and cfg.loader == "dataloader":  # as the run copies (copies_async)
        lines.append(pad + "x, y = x.to(DEVICE, non_blocking=True), y.to(DEVICE, non_blocking=True)  # from pinned "
                           "memory: the host queues the copy and runs on")
    elif cfg.non_blocking:
        why = ("the device loader's batches are on the device already: no copy" if cfg.loader == "device" else
               "non_blocking only from pinned memory (pin_memory is off): the copy blocks, as in the run")
        lines.append(pad + f"x, y = x.to(DEVICE), y.to(DEVICE)  # {why}")
    else:
        lines.append(pad + "x, y = x.to(DEVICE), y.to(DEVICE)")
    if cfg.channels_last and cfg.loader == "dataloader":
        lines.append(pad + "x = x.contiguous(memory_format=torch.channels_last)")
    net = "compiled" if cfg.compile != "off" else "model"
    scale = " / GRAD_ACCUM_STEPS" if accum else ""
    lines += _autocast_block(cfg, f"loss = F.cross_entropy({net}(x), y){scale}", indent=len(pad))
    lines.append(pad + ("scaler.scale(loss).backward()" if cfg.amp == "fp16" else "loss.backward()"))
    lines += ["    scaler.step(optimizer)", "    scaler.update()"] if cfg.amp == "fp16" else ["    optimizer.step()"]
    if cfg.scheduler != "none":
        lines.append("    scheduler.step()")
    return lines


def _log_lines(cfg: TrainConfig) -> list[str]:
    if cfg.log_loss == "tensor":  # every step's tensor is kept, as `total_loss += loss` would keep it
        return ["    kept.append(loss)  # the pitfall: each kept tensor holds its step's whole graph alive"]
    times = " * GRAD_ACCUM_STEPS" if cfg.grad_accum_steps > 1 else ""
    line = f"losses.append(loss.item(){times})  # a host-device sync"
    if cfg.log_every > 1:
        return ["    if (step + 1) % LOG_EVERY == 0:", "        " + line]
    return ["    " + line]


def _loop_lines(cfg: TrainConfig) -> list[str]:
    lines = ["", "model.train()", "losses: list[float] = []"]
    if cfg.log_loss == "tensor":
        lines.append("kept: list[torch.Tensor] = []")
    lines += ["# the timed steps in WINDOWS windows (the last takes the remainder); images/s: the median window",
              "ends = [WARMUP_STEPS + (i + 1) * (STEPS // WINDOWS) for i in range(WINDOWS - 1)] + [WARMUP_STEPS + STEPS]",
              "throughputs: list[float] = []",
              "sync()", "t_window, window_start = time.perf_counter(), 0",
              "for step in range(WARMUP_STEPS + STEPS):"]
    lines += _step_lines(cfg) + _log_lines(cfg)
    lines += ["    done = step + 1",
              "    if done == WARMUP_STEPS or done in ends:  # the clock is read only here, after a sync",
              "        sync()",
              "        t = time.perf_counter()",
              "        if done in ends:",
              "            throughputs.append(IMAGES_PER_STEP * (done - window_start) / (t - t_window))",
              "        t_window, window_start = t, done"]
    times = " * GRAD_ACCUM_STEPS" if cfg.grad_accum_steps > 1 else ""
    if cfg.log_loss == "tensor":
        every = "[LOG_EVERY - 1 :: LOG_EVERY]" if cfg.log_every > 1 else ""
        lines.append(f"losses = [v.item(){times} for v in kept{every}]  # read after the run: no sync per step")
    if cfg.log_every > 1:
        lines += ["if (WARMUP_STEPS + STEPS) % LOG_EVERY:  # the last step's loss too, read after the clock stopped",
                  f"    losses.append(loss.item(){times})"]
    return lines


_REPORT = [
    "",
    'print(f"{per_second(statistics.median(throughputs))} images/s: median of {len(throughputs)} timed windows "',
    '      f"(min {per_second(min(throughputs))}, max {per_second(max(throughputs))}), warm-up excluded")',
    'print(f"first loss {losses[0]:.4f}, final loss {statistics.mean(losses[-3:]):.4f} (mean of the last 3 logged)")',
    'print(f"held-out accuracy {evaluate(model, eval_x, eval_y):.3f}")',
]


def code(cfg: TrainConfig) -> str:
    """The run `cfg` describes, as one standalone PyTorch script (torch and torchvision only, never fastlab)."""
    if not isinstance(cfg, TrainConfig):
        raise TypeError(f"fastlab.code(cfg): cfg must be a TrainConfig, got {type(cfg).__name__}")
    dataset = _dataset(cfg)
    body = (_backend_lines(cfg) + _data_lines(cfg, dataset) + _model_lines(cfg) + _optimizer_lines(cfg)
            + _loader_lines(cfg) + _loop_lines(cfg) + _REPORT)
    main = "\n".join(["", "", "def main() -> None:"] + [("    " + line).rstrip() for line in body])
    tail = '\n\n\nif __name__ == "__main__":\n    main()\n'
    return (_header(cfg, dataset) + _settings(cfg, dataset) + _data_part(cfg, dataset) + _model_part(cfg)
            + _evaluate_part(cfg) + main + tail)


# ------------------------------------------------------------------ the diff between two runs' scripts


@dataclass(frozen=True)
class CodeDiff:
    """The lines a change adds to and removes from the script; coloured in Jupyter, unified text elsewhere."""

    base: str
    changed: str
    base_name: str = "baseline"
    changed_name: str = "changed"

    @property
    def unified(self) -> list[str]:
        return list(difflib.unified_diff(self.base.splitlines(), self.changed.splitlines(), self.base_name,
                                         self.changed_name, n=1, lineterm=""))

    @property
    def added(self) -> list[str]:
        return [line[1:] for line in self.unified if line.startswith("+") and not line.startswith("+++")]

    @property
    def removed(self) -> list[str]:
        return [line[1:] for line in self.unified if line.startswith("-") and not line.startswith("---")]

    def __str__(self) -> str:
        return "\n".join(self.unified) or "(no difference: the two configurations write the same script)"

    def _repr_html_(self) -> str:
        colours = {"+": "#e6ffec", "-": "#ffebe9", "@": "#ddf4ff"}
        rows = []
        for line in self.unified or [str(self)]:
            bg = colours.get(line[:1], "transparent") if not line.startswith(("+++", "---")) else "transparent"
            rows.append(f'<div style="background:{bg};white-space:pre">{html.escape(line) or "&nbsp;"}</div>')
        return '<div style="font-family:monospace;font-size:90%">' + "".join(rows) + "</div>"


def code_diff(base: TrainConfig, changed: TrainConfig) -> CodeDiff:
    """What changes in the script when `base` becomes `changed` (for example, a technique switched on)."""
    changes = ", ".join(f"{k}={v!r}" for k, v in base.diff(changed).items()) or "no change"
    return CodeDiff(_body(code(base)), _body(code(changed)), "baseline", changes)


def _body(script: str) -> str:
    """The script without its docstring (which lists the changed knobs), so a diff shows the technique's lines."""
    lines = script.splitlines()
    return "\n".join(lines[lines.index('"""') + 1:])


# ------------------------------------------------------------------ the diff between two runnable snippets
# (the techniques without a TrainConfig knob: the profiler's schedule, activation checkpointing, torch.export, DDP)


@dataclass(frozen=True)
class SnippetDiff(CodeDiff):
    """A CodeDiff of two short functions, shown whole (a snippet is short: every line is context)."""

    context: int = 1000

    @property
    def unified(self) -> list[str]:
        return list(difflib.unified_diff(self.base.splitlines(), self.changed.splitlines(), self.base_name,
                                         self.changed_name, n=self.context, lineterm=""))


def _snippet_source(fn: object, name: str) -> str:
    """fn's own source, dedented, its docstring dropped and its name replaced by `name` (so only code differs)."""
    import ast

    source = textwrap.dedent(inspect.getsource(fn))  # type: ignore[arg-type]
    lines = source.splitlines()
    node = ast.parse(source).body[0]
    body = getattr(node, "body", [])
    first_body = body[0].lineno - 1 if body else node.lineno  # the signature is the lines before it
    own = getattr(fn, "__name__", "")
    shift = len(name) - len(own)
    for i in range(node.lineno - 1, first_body):
        if i == node.lineno - 1:
            lines[i] = lines[i].replace(f"def {own}(", f"def {name}(", 1)
        elif shift > 0:  # continuation lines stay aligned under the renamed def's parenthesis
            lines[i] = " " * shift + lines[i]
        elif shift < 0:
            lines[i] = lines[i][min(-shift, len(lines[i]) - len(lines[i].lstrip())):]
    doc = body[0] if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) else None
    if doc is not None and isinstance(doc.value.value, str):
        del lines[doc.lineno - 1: doc.end_lineno]
    return "\n".join(lines)


def snippet_diff(base: object, changed: object, *, base_name: str = "plain",
                 changed_name: str | None = None) -> SnippetDiff:
    """What `changed` adds to `base`: two runnable functions' own source (inspect.getsource), diffed whole.

    The code shown is the code that ran: pass the functions the notebook calls. Both are shown under base's name
    and without their docstrings, so the diff holds only the technique's lines."""
    for label, fn in (("base", base), ("changed", changed)):
        if not callable(fn):
            raise TypeError(f"snippet_diff: {label} must be a function (its source is diffed), got {type(fn).__name__}")
    name = getattr(base, "__name__", "snippet")
    return SnippetDiff(_snippet_source(base, name), _snippet_source(changed, name), base_name,
                       changed_name or getattr(changed, "__name__", "changed"))


__all__ = ["code", "code_diff", "CodeDiff", "snippet_diff", "SnippetDiff"]


def loop_code(cfg: TrainConfig) -> str:
    """The main() of code(cfg), as it is written there: data, model, optimiser, the timed loop (the step and the
    loss logging) and the report. Notebook 00 shows it: the plain loop a run is."""
    script = code(cfg)
    start = script.index("def main() -> None:")
    return script[start:script.index('\n\n\nif __name__ == "__main__":', start)] + "\n"


__all__ += ["loop_code"]
