"""The cheat sheet (docs/cheatsheet.md): each claim C1-C15 beside its PyTorch lines (fastlab.code_diff against the
baseline, else its own lines) and the docstrings of the functions that decide its verdict.

    python -m fastlab.cheatsheet > docs/cheatsheet.md
"""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import claim_map, claims, export, outcomes, verdicts
from .code import code_diff
from .config import TrainConfig
from .lessons import (
    all_together,
    batch_size,
    compile_export,
    data_loading,
    hygiene,
    kernels,
    mixed_precision,
    optimizers,
)
from .verdicts import is_noise

BASE = TrainConfig(dataset="synthetic")  # synthetic: the same page on every machine
REGENERATE = "python -m fastlab.cheatsheet > docs/cheatsheet.md"

# The verdict helpers a deciding function may call; the sheet quotes each one it calls.
RULES: dict[str, Callable[..., Any]] = {
    "verdict_speedup": claims.verdict_speedup, "verdict_faster": claims.verdict_faster,
    "verdict_less": claims.verdict_less, "verdict_conditions": claims.verdict_conditions,
    "tta_finding": optimizers.tta_finding, "runs_verdict": verdicts.runs_verdict, "verdict": verdicts.verdict,
    "tta_verdict": outcomes.tta_verdict, "is_noise": is_noise,
}


@dataclass(frozen=True)
class Entry:

    claim: str
    decides: Callable[..., Any]  # the function whose Judgement is the claim's verdict
    weighs: str  # what outcome the verdict weighs, in a phrase
    changes: dict[str, Any] = field(default_factory=dict)  # the technique's knobs...
    start: dict[str, Any] = field(default_factory=dict)  # ...against the baseline with these (a pitfall), if any
    own: tuple[Callable[..., Any], tuple[str, ...]] | None = None  # no knob: (function, markers of its lines)


_C12 = optimizers.c12_changes(BASE)  # its first and last variants: Adam, then AdamW with cosine (as notebook 06)
_C12_START, _C12_END = BASE.diff(_C12[0].config), BASE.diff(_C12[-1].config)
_CHECKLIST = dict(num_workers=4, pin_memory=True, non_blocking=True, persistent_workers=True, amp="fp16",
                  cudnn_benchmark=True, optimizer="adamw", weight_decay=0.05)

ENTRIES: tuple[Entry, ...] = (
    Entry("C1", data_loading.judge_workers, "training images/s at each num_workers of the sweep",
          changes={"num_workers": 4}),
    Entry("C2", data_loading.judge_pinning, "the copy's time and training images/s, pinned against not",
          changes={"pin_memory": True, "non_blocking": True}),
    Entry("C3", mixed_precision.judge_speed_and_quality,
          "training images/s, and quality: final loss and held-out accuracy over seeds", changes={"amp": "fp16"}),
    Entry("C4", mixed_precision.judge_memory, "peak memory per dtype (or the memory summed from tensor sizes)",
          changes={"amp": "bf16"}),
    Entry("C5", mixed_precision.judge_underflow, "how many gradients are zero in fp16 without and with the scaler",
          own=(mixed_precision.scaler_history, ("GradScaler(", "for step in", "torch.autocast", "_loss(", "scaler."))),
    Entry("C6", kernels.judge_benchmark, "training images/s with fixed shapes; step time with changing shapes",
          changes={"cudnn_benchmark": True}),
    Entry("C7", batch_size.judge_powers, "training images/s of each power of two against its neighbours' line",
          changes={"batch_size": 96}),
    Entry("C8", batch_size.judge_largest, "training images/s, and training seconds to the target accuracy",
          changes={"batch_size": 512}),
    Entry("C9", hygiene.judge_eval, "evaluation images/s and the memory evaluation holds",
          start={"eval_mode": "autograd"}, changes={"eval_mode": "no_grad"}),
    Entry("C10", hygiene.judge_detach, "the activations and graph nodes still alive after the loop",
          own=(hygiene.kept_graph_memory, ("for _ in range", "loss = nn.functional", "if backward:", "loss.backward()",
                                          "kept.append"))),
    Entry("C11", hygiene.judge_logging, "memory over the steps, and the cost of .item() as a sync",
          start={"log_loss": "tensor"}, changes={"log_loss": "item"}),
    Entry("C12", optimizers.judge_c12, "training seconds (and steps) to the target accuracy over seeds",
          start=_C12_START, changes=_C12_END),
    Entry("C13", data_loading.judge_swing, "GPU utilisation over time and data wait, starved against fed",
          changes={"num_workers": 4}),
    Entry("C14", compile_export.judge_export, "torch's own warnings about TorchScript; ONNX answers against eager",
          own=(export.export_model, ("torch.export.", "catch_warnings()", "torch.onnx.export", "input_names="))),
    Entry("C15", all_together.judge_c15, "training images/s, and training seconds to the target over seeds",
          changes=_CHECKLIST),
)


def _doc(fn: Callable[..., Any]) -> str:
    """A function's docstring as one paragraph."""
    return " ".join((inspect.getdoc(fn) or "").split())


def _rule(name: str) -> str:
    """A verdict helper with its docstring's first paragraph (the noise rule is stated once, at the top)."""
    if RULES[name] is is_noise:
        return "`is_noise`: the noise rule above"
    first = (inspect.getdoc(RULES[name]) or "").split("\n\n")[0]
    return f"`{name}`: {' '.join(first.split())}"


def own_lines(fn: Callable[..., Any], markers: tuple[str, ...]) -> str:
    """The lines of fastlab's own source of `fn` that hold any marker, at their relative indentation."""
    picked = [line for line in inspect.getsource(fn).splitlines() if any(m in line for m in markers)]
    if not picked:
        raise ValueError(f"no line of {fn.__qualname__} holds any of {markers}")
    indent = min(len(line) - len(line.lstrip()) for line in picked)
    return "\n".join(line[indent:] for line in picked)


def _rules_used(fn: Callable[..., Any]) -> list[str]:
    """The verdict helpers `fn` calls, directly or through functions of its own module."""
    module = sys.modules[fn.__module__]
    source = inspect.getsource(fn)
    sources = [source] + [inspect.getsource(obj) for name, obj in vars(module).items()
                          if inspect.isfunction(obj) and obj is not fn and obj.__module__ == module.__name__
                          and f"{name}(" in source]
    return [name for name in RULES if any(re.search(rf"(?<!def )\b{name}\(", s) for s in sources)]


def code_block(entry: Entry) -> tuple[str, str]:
    """(where the lines come from, the lines as a fenced markdown block)."""
    if entry.own is not None:
        fn, markers = entry.own
        return (f"its own lines, from `{fn.__module__}.{fn.__qualname__}`",
                "```python\n" + own_lines(fn, markers) + "\n```")
    start = BASE.replace(**entry.start)
    diff = code_diff(start, start.replace(**entry.changes))
    if not diff.unified:
        raise ValueError(f"{entry.claim}: the changes {entry.changes} write the same script")
    said = ", ".join(f"{k}={v!r}" for k, v in entry.changes.items())
    since = f" with {', '.join(f'{k}={v!r}' for k, v in entry.start.items())}" if entry.start else ""
    return f"`fastlab.code_diff`: {said} against the baseline{since}", "```diff\n" + str(diff) + "\n```"


def section(entry: Entry) -> str:
    c = claims.get(entry.claim)
    where, block = code_block(entry)
    fn = entry.decides
    registered = [j.comparison.name for j in claim_map.JUDGES if j.claim == c.id]
    on = (" on the comparison " + ", ".join(f"`{r}`" for r in registered)) if registered else \
        " on the measurements its notebook makes"
    rules = _rules_used(fn)
    lines = [f"## {c.id}, tested in `{c.notebook}` ({c.section})", "", claims.quote(c.id), "",
             f"**The code**, {where}:", "", block, "",
             f"**The verdict**: `{fn.__module__}.{fn.__qualname__}`{on}. {_doc(fn)}", "",
             f"Weighed: {entry.weighs}."]
    if rules:
        lines += ["", "Rules it applies:", ""] + [f"* {_rule(name)}" for name in rules]
    return "\n".join(lines)


def generate() -> str:
    """The whole cheat sheet as markdown."""
    head = ["# Cheat sheet: the claims C1-C15, their PyTorch lines, and how each verdict is decided", "",
            f"Generated by `fastlab.cheatsheet` (regenerate: `{REGENERATE}`); do not edit by hand.", "",
            "Each claim is quoted (a `>` blockquote) as `fastlab.claims` holds it: under test, not a result. Its code is the diff of "
            "its technique against the baseline, TrainConfig's defaults (`fastlab.code` writes each side as a plain "
            "PyTorch script), or the technique's own lines from the fastlab function that runs them. Its verdict "
            "is decided by the named function, from the measurement; a notebook prints it, never types it.", "",
            f"**The noise rule** (`fastlab.verdicts.is_noise`, one rule everywhere): {_doc(is_noise)}", ""]
    return "\n".join(head + [section(e) + "\n" for e in ENTRIES]).rstrip() + "\n"


def show() -> None:
    """Display the cheat sheet as markdown in a notebook, else print it."""
    try:
        from IPython.display import Markdown, display
    except ImportError:
        print(generate())
        return
    display(Markdown(generate()))


__all__ = ["ENTRIES", "Entry", "generate", "own_lines", "show"]

if __name__ == "__main__":
    sys.stdout.write(generate())
