"""The code of any run: `code(cfg)` is the training function fastlab.run runs, specialised to cfg, as one script.

The script is fastlab.training's own source rewritten for cfg by fastlab.specialise, with the definitions it needs
(data, loader, model) copied from fastlab's source. It imports torch and torchvision, never fastlab; timing,
Ctrl-C, budgets and the no-op fallbacks stay in the harness (fastlab.harness).
"""

from __future__ import annotations

import ast
import difflib
import html
import inspect
import textwrap
from dataclasses import dataclass

from . import data, models, training
from .config import TrainConfig
from .profiles import profile_of

_STOCK = TrainConfig()  # a knob equal to its default here adds no line
MODEL_CALLS = {"tiny": "TinyNet()", "compact": "CompactNet()", "resnet18": "resnet18_cifar()"}
# what the harness's parameters are in a plain script
PLAIN = {"make_model": "None", "parallel": "None", "eval_every": "0", "log": "print",
         "isinstance(data, tuple)": "False", 'AMP_DTYPES["off"]': "None", 'AMP_DTYPES["fp16"]': "torch.float16",
         'AMP_DTYPES["bf16"]': "torch.bfloat16"}


def _source(*objects: object) -> str:
    return "\n\n\n".join(inspect.getsource(o).rstrip() for o in objects)  # type: ignore[arg-type]


def _dataset(cfg: TrainConfig) -> str:
    """'cifar10' or 'synthetic': 'auto' is resolved as fastlab resolves it offline (CIFAR-10 if on disk)."""
    if cfg.dataset != "auto":
        return cfg.dataset
    return "cifar10" if profile_of(cfg).downloads and data.cifar10_on_disk(data.data_dir()) else "synthetic"


def _device(name: str) -> str:
    if name == "auto":
        return ('torch.device("cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() '
                'else "cpu")')
    return f'torch.device("{name}")'


def training_code(cfg: TrainConfig) -> str:
    """fastlab.training's evaluate, make_optimizer, make_scheduler (with a schedule) and train, specialised to cfg: the code fastlab.run runs for it."""
    from .specialise import specialise  # libcst: only where code is shown

    calls = {"build_model": MODEL_CALLS.__getitem__, "resolve_device": _device}
    drop = {"make_model", "parallel", "log", "eval_every"}
    return "\n\n".join(specialise(fn, cfg, known=PLAIN, calls=calls, drop_params=drop)
                        for fn in (training.evaluate, training.make_optimizer,
                                   *([training.make_scheduler] if cfg.scheduler != "none" else []), training.train))


def _header(cfg: TrainConfig, dataset: str) -> str:
    changed = "Changed from fastlab's TrainConfig defaults: " + (
        ", ".join(f"{k}={v!r}" for k, v in _STOCK.diff(cfg).items()) or "none")
    kind = "SYNTHETIC (CIFAR-shaped, generated offline)" if dataset == "synthetic" else "real CIFAR-10 (torchvision)"
    # every import a script may need: code() drops those this one does not use
    imports = ["import contextlib", "import itertools", "from collections.abc import Iterator",
               "from dataclasses import dataclass", "from typing import Any", "", "import numpy as np", "import torch",
               "import torchvision", "from torch import nn", "from torch.nn import functional as F",
               "from torch.utils.data import DataLoader, Dataset"]
    return "\n".join([
        '"""One fastlab training run as a plain PyTorch script (written by fastlab.code; it does not import fastlab).',
        "", *textwrap.wrap(f"{changed}.", 112, subsequent_indent="    "), f"Data: {kind}.", '"""', "",
        "from __future__ import annotations", "", *imports, ""])


def _constants(dataset: str, cfg: TrainConfig) -> str:
    lines = ["", f"CIFAR_MEAN = {data.CIFAR_MEAN}", f"CIFAR_STD = {data.CIFAR_STD}", f"NUM_CLASSES = {data.NUM_CLASSES}"]
    if dataset == "synthetic":
        lines.append(f"SYNTHETIC_SEED = {data.SYNTHETIC_SEED}  # the synthetic set is the same for every run seed")
    else:
        lines.append(f"DATA_DIR = {str(data.data_dir())!r}  # torchvision's CIFAR-10 folder goes here")
    if cfg.model in ("tiny", "compact"):
        lines.append(f"BN_MOMENTUM = {models.BN_MOMENTUM}  # BatchNorm running statistics that keep up with a fast net")
    return "\n".join(lines) + "\n"


_CIFAR_READER = '''def read_cifar10(split: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The first n images of CIFAR-10's train or test split: uint8 HxWxC and int64 labels."""
    ds = torchvision.datasets.CIFAR10(DATA_DIR, train=split == "train", download=True)
    return ds.data[:n], np.asarray(ds.targets[:n], dtype=np.int64)'''


def _definitions(cfg: TrainConfig, dataset: str) -> str:
    head = "\n\n# ------------------------------------------------------------------ "
    part = head + ("data: SYNTHETIC, CIFAR-shaped (uint8 32x32x3, 10 classes)\n\n\n" + _source(data.make_synthetic, data._crop)
                   if dataset == "synthetic" else
                   "data: real CIFAR-10 through torchvision (downloads once into DATA_DIR)\n\n\n" + _CIFAR_READER)
    part += "\n\n\n" + _source(data.ImageSet)
    if cfg.loader == "dataloader":
        part += "\n\n\n" + _source(data.image_transform, data.CifarLikeDataset)
    part += "\n\n\n" + _source(data.DeviceLoader, data.forever)
    part += head + "the model\n\n\n"
    part += _source(models.resnet18_cifar) if cfg.model == "resnet18" else _source(
        models._conv_bn, models.TinyNet if cfg.model == "tiny" else models.CompactNet)
    return part


def _main(cfg: TrainConfig, dataset: str) -> str:
    if dataset == "synthetic":
        read = [f'train_images, train_labels = make_synthetic({cfg.train_images}, "train")',
                f'eval_images, eval_labels = make_synthetic({cfg.eval_images}, "eval")',
                'data = ImageSet(train_images, train_labels, eval_images, eval_labels, "synthetic", "generated offline")']
    else:
        read = [f'train_images, train_labels = read_cifar10("train", {cfg.train_images})',
                f'eval_images, eval_labels = read_cifar10("test", {cfg.eval_images})',
                'data = ImageSet(train_images, train_labels, eval_images, eval_labels, "cifar10", DATA_DIR)']
    return "\n\nif __name__ == \"__main__\":\n" + "".join(f"    {line}\n" for line in [*read, "train(data)"])


def code(cfg: TrainConfig) -> str:
    """The run `cfg` describes, as one standalone PyTorch script (torch and torchvision only, never fastlab)."""
    if not isinstance(cfg, TrainConfig):
        raise TypeError(f"fastlab.code(cfg): cfg must be a TrainConfig, got {type(cfg).__name__}")
    dataset = _dataset(cfg)
    return _without_unused_imports(
        _header(cfg, dataset) + _constants(dataset, cfg) + _definitions(cfg, dataset)
        + "\n\n\n# ------------------------------------------------------------------ training\n\n\n"
        + training_code(cfg) + _main(cfg, dataset))


def _without_unused_imports(script: str) -> str:
    """The script without the module-level imports (one line each) of names it never uses."""
    tree = ast.parse(script)
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    lines = script.splitlines(keepends=True)
    for node in reversed(tree.body):
        if not isinstance(node, (ast.Import, ast.ImportFrom)) or getattr(node, "module", None) == "__future__":
            continue
        kept = [a for a in node.names if (a.asname or a.name.split(".")[0]) in used]
        if len(kept) < len(node.names):
            line = ast.unparse(node.__class__(**{**node.__dict__, "names": kept})) + "\n" if kept else ""
            lines[node.lineno - 1:node.end_lineno] = [line]
    return "".join(lines)


# ------------------------------------------------------------------ the diff between two runs' scripts


@dataclass(frozen=True)
class CodeDiff:
    """The lines a change adds to and removes from the script; coloured in Jupyter, unified text elsewhere."""

    base: str
    changed: str
    base_name: str = "baseline"
    changed_name: str = "changed"
    context: int = 1  # unchanged lines shown around each change

    @property
    def unified(self) -> list[str]:
        return list(difflib.unified_diff(self.base.splitlines(), self.changed.splitlines(), self.base_name,
                                         self.changed_name, n=self.context, lineterm=""))

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
    if ast.get_docstring(node, clean=False) is not None:
        del lines[body[0].lineno - 1: body[0].end_lineno]
    return "\n".join(lines)


def snippet_diff(base: object, changed: object, *, base_name: str = "plain",
                 changed_name: str | None = None) -> SnippetDiff:
    """What `changed` adds to `base`: the two functions' source without docstrings, whole, under base's name."""
    for label, fn in (("base", base), ("changed", changed)):
        if not callable(fn):
            raise TypeError(f"snippet_diff: {label} must be a function (its source is diffed), got {type(fn).__name__}")
    name = getattr(base, "__name__", "snippet")
    return SnippetDiff(_snippet_source(base, name), _snippet_source(changed, name), base_name,
                       changed_name or getattr(changed, "__name__", "changed"))


def loop_code(cfg: TrainConfig) -> str:
    """train() of code(cfg), as written there: the plain loop a run is (notebook 00 shows it)."""
    script = code(cfg)
    start = script.index("def train(")
    return script[start:script.index('\n\n\nif __name__ == "__main__":', start)] + "\n"


__all__ = ["code", "code_diff", "CodeDiff", "loop_code", "snippet_diff", "SnippetDiff", "training_code"]
