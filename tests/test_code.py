"""fastlab.code / code_diff: every script a ladder or a notebook runs renders, runs without fastlab, and learns;
a few log the very losses fastlab.run logs; each knob's lines appear only when the knob is set."""

from __future__ import annotations

import ast
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from reference_run import REPEATED_ON_A_GPU

import fastlab
from fastlab import train
from fastlab.__main__ import main as cli_main
from fastlab.bench import ladder
from fastlab.code import CodeDiff, code, code_diff
from fastlab.config import TrainConfig, config_for
from fastlab.data import load_data

# The sizes every script runs at here: a few hundred images in all (the render covers the real sizes). Enough steps
# for the loss to fall: about 192 images (at least 4 steps), and two loss reads when it is read every few steps.
SMOKE_SIZES = dict(warmup_steps=1, windows=2, train_images=256, eval_images=64, seed=0, max_seconds=0.0)


def smoke_sized(cfg: TrainConfig) -> TrainConfig:
    steps = max(4, 192 // (cfg.batch_size * cfg.grad_accum_steps), 2 * cfg.log_every - 1)
    return cfg.replace(**SMOKE_SIZES, steps=steps)


ALLOWED_IMPORTS = {"__future__", "itertools", "contextlib", "dataclasses", "typing", "collections.abc", "numpy", "torch",
                   "torchvision", "torch.nn",
                   "torch.nn.functional", "torch.utils.data", "torchvision.transforms", "PIL"}


def smoke_base() -> TrainConfig:
    return config_for("smoke", device="cpu")


# ------------------------------------------------------------------ the configurations to cover


def ladder_configs(base: TrainConfig) -> list[TrainConfig]:
    """Every rung of the ladder, cumulative as run_ladder builds them; the time-to-accuracy ladder trains the same
    rungs over seeds 0-2 (outcomes.DEFAULT_SEEDS), so those are rendered too."""
    out, kept = [], {}
    for rung in ladder(base):
        kept.update(rung.changes)
        out += [base.replace(**kept, seed=seed) for seed in (0, 1, 2)]
    return out


def _fake_result(self: train.TrainingRun) -> fastlab.RunResult:
    """A plausible result without training: enough for every comparison function to go on to its next run."""
    cfg, r = self.cfg, self.result
    n = cfg.warmup_steps + cfg.steps
    r.window_throughput, r.steps_done, r.timed_seconds = [100.0] * cfg.windows, n, 1.0
    r.step_seconds, r.data_wait_seconds, r.memory_trace_mb = [0.01] * n, [0.001] * n, [1.0] * n
    r.losses = [(i, 2.3 - 0.01 * i) for i in range(n)]
    r.eval_accuracy, r.eval_seconds, r.peak_memory_mb = 0.99, 0.1, 10.0
    r.optimizer_step_seconds, r.sampled_step_seconds = [0.001], [0.01]
    r.dataset = {"name": "synthetic", "synthetic": True, "source": "fake", "train_images": 1, "eval_images": 1}
    if self.checkpoints:
        r.tta_curve = [[0.5, self.checkpoints.every, 0.99]]
    return r


def comparison_configs(base: TrainConfig) -> list[TrainConfig]:
    """The configuration of every run each registered comparison (the notebooks' runs) makes, recorded by
    replacing the training itself. Runs on the reader's own model or Datasets (10_your_own_model, slow storage)
    cannot be written out and are left out; so is DDP (several processes under torchrun)."""
    seen: list[TrainConfig] = []

    def record(self: train.TrainingRun) -> fastlab.RunResult:
        own_data = self.dataset_arg is None or self.dataset_arg is load_data(self.cfg, None)[0]
        if self.model_arg is None and own_data:  # time to accuracy passes the config's own images (cached): kept
            seen.append(self.cfg)
        return _fake_result(self)

    original, isolation = train.TrainingRun.execute, os.environ.get("FASTLAB_ISOLATION")
    train.TrainingRun.execute = record  # type: ignore[method-assign]
    os.environ["FASTLAB_ISOLATION"] = "thread"  # runs in this process, where the replaced execute is
    try:
        for name, fn in REPEATED_ON_A_GPU.items():  # every comparison a notebook runs and reads back
            if not name.startswith("11_multi_gpu_ddp"):
                fn(base, progress=False)
    finally:
        train.TrainingRun.execute = original  # type: ignore[method-assign]
        if isolation is None:
            os.environ.pop("FASTLAB_ISOLATION")
        else:
            os.environ["FASTLAB_ISOLATION"] = isolation
    return seen


@pytest.fixture(scope="module")
def every_config() -> list[TrainConfig]:
    base = smoke_base()
    configs = ladder_configs(base) + comparison_configs(base)
    assert len(configs) > 80  # the ladder's 27 and the registry's runs: a collector that missed some fails here
    return configs


# ------------------------------------------------------------------ running scripts without fastlab

# One `python -I` process, in an empty folder, with fastlab blocked (the venv holds it as an editable install, so
# -I alone does not hide it) and checked unimportable; it imports what the scripts import, then forks a fresh child
# per script (runpy as __main__): each script starts from a process that has run nothing, at a second a script
# instead of the four seconds torch and torchvision take to import on a loaded 2-core machine.
RUNNER = textwrap.dedent('''
    import importlib.abc, json, os, runpy, sys, time, traceback
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "fastlab" or name.startswith("fastlab."):
                raise ModuleNotFoundError("fastlab is hidden from standalone scripts", name=name)
    sys.meta_path.insert(0, Block())
    try:
        import fastlab  # noqa
        print(json.dumps({"fastlab_importable": True})); sys.exit(3)
    except ImportError:
        pass
    import numpy, torch, torchvision, torchvision.transforms, PIL.Image  # noqa
    for path in sys.argv[1:]:
        t0 = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            fd = os.open(path + ".out", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 1); os.dup2(fd, 2)
            try:
                runpy.run_path(path, run_name="__main__")
                code = 0
            except BaseException:
                traceback.print_exc(); code = 1
            sys.stdout.flush(); sys.stderr.flush(); os._exit(code)
        deadline = t0 + 240
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                rc = os.waitstatus_to_exitcode(status); break
            if time.perf_counter() > deadline:
                os.kill(pid, 9); os.waitpid(pid, 0); rc = "timeout"; break
            time.sleep(0.02)
        print(json.dumps({"path": path, "rc": rc, "seconds": round(time.perf_counter() - t0, 2)}), flush=True)
''')


# The instruction-set caps this suite runs under (FASTLAB_CPU_KIND, fastlab.cpu_kind): a script rounds as fastlab does.
KERNEL_CAPS = {k: os.environ[k] for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "TORCHINDUCTOR_CACHE_DIR")
               if k in os.environ}


def run_scripts(scripts: list[str], folder: Path) -> list[tuple[int | str, str]]:
    """(exit status, output) of each script, run as described above."""
    paths = []
    for i, text in enumerate(scripts):
        path = folder / f"script_{i:02d}.py"
        path.write_text(text)
        paths.append(str(path))
    out = subprocess.run([sys.executable, "-I", "-c", RUNNER, *paths], cwd=folder, capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(folder), "OMP_NUM_THREADS": "2", **KERNEL_CAPS},
                         timeout=1200)
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert rows and "fastlab_importable" not in rows[0], f"fastlab was importable for the scripts: {out.stderr}"
    assert len(rows) == len(paths), out.stderr[-3000:]
    return [(row["rc"], Path(row["path"] + ".out").read_text()) for row in rows]


def logged(output: str) -> tuple[list[tuple[int, float]], float]:
    """The (step, loss) pairs and the held-out accuracy a script printed (one dict a line, as train() logs)."""
    rows = [ast.literal_eval(line) for line in output.splitlines() if line.startswith("{")]
    losses = [(row["step"], row["loss"]) for row in rows if "loss" in row]
    accuracy = [row["held_out_accuracy"] for row in rows if "held_out_accuracy" in row]
    assert losses and accuracy, output[-2000:]
    return losses, accuracy[0]


def losses_of(output: str) -> tuple[float, float]:
    """First loss, and the mean of the last three."""
    losses = [v for _, v in logged(output)[0]]
    return losses[0], sum(losses[-3:]) / len(losses[-3:])


# ------------------------------------------------------------------ the tests that run scripts


def test_every_script_renders_as_standalone_pytorch(every_config):
    for cfg in every_config:
        script = code(cfg)
        tree = ast.parse(script)  # a syntax error names the config below
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert imported <= ALLOWED_IMPORTS, (imported - ALLOWED_IMPORTS, cfg)
        assert "fastlab" not in {name.split(".")[0] for name in imported}
        train_fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "train")
        names = {n.id for n in ast.walk(train_fn) if isinstance(n, ast.Name)}
        assert not names & {"w", "cfg", "p", "parallel", "make_model", "eval_every", "log"}, (names, cfg)
        constant_tests = [n.lineno for n in ast.walk(tree) if isinstance(n, (ast.If, ast.IfExp))
                          and isinstance(n.test, ast.Constant)]
        assert not constant_tests, (constant_tests, cfg)  # a branch not taken is gone, a taken one unwrapped
        assert len(script.splitlines()) < 400, cfg


# A comment word that names something the specialiser can remove, and what the script's code must then hold for
# the comment to be true (None: nothing of it is ever in a printed script).
COMMENT_NEEDS = {"watch": None, "non_blocking": "non_blocking=True", "set_to_none": "set_to_none=",
                 "replica": "DistributedDataParallel", "all-reduce": "DistributedDataParallel", "rank": None,
                 "checkpoint": None, "micro-batch": "micro", "GradScaler": "GradScaler", "scheduler": "scheduler"}


def test_every_printed_script_passes_ruff_and_keeps_no_comment_about_what_it_lacks(every_config, tmp_path):
    """No unused name or import (ruff's F rules), and no comment about a line the specialiser removed."""
    scripts = list(dict.fromkeys(code(cfg) for cfg in every_config))
    for i, script in enumerate(scripts):
        (tmp_path / f"script_{i:03d}.py").write_text(script)
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--select", "F", "--no-cache", "--isolated",
                          "--output-format", "concise", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-5000:]
    for script in scripts:
        lines = script.splitlines()
        code_part = "\n".join(line.split("#", 1)[0] for line in lines)
        for line in lines:
            comment = line.split("#", 1)[1] if "#" in line else ""
            for word, needs in COMMENT_NEEDS.items():
                if word in comment:
                    assert needs is not None and needs in code_part, (line, script[:600])


@pytest.mark.slow  # about 40 scripts: two minutes of CPU on 2 cores
def test_every_ladder_and_notebook_script_runs_without_fastlab_and_learns(every_config, tmp_path):
    scripts = list(dict.fromkeys(code(smoke_sized(cfg)) for cfg in every_config))  # identical ones once
    assert len(scripts) > 30
    results = run_scripts(scripts, tmp_path)
    failures = []
    for script, (rc, output) in zip(scripts, results):
        if rc != 0:
            failures.append(f"exit {rc}:\n{output[-1500:]}")
            continue
        first, final = losses_of(output)
        if not (math.isfinite(first) and math.isfinite(final) and final < first):
            header = script.split('"""')[1]
            failures.append(f"loss {first} -> {final} (not finite and falling) for:{header}")
    assert not failures, "\n\n".join(failures)


def test_scripts_log_the_losses_fastlab_run_logs(tmp_path):
    """The script is the function fastlab.run runs: on the CPU, same seed, data and augmentations, it logs the very
    losses and held-out accuracy fastlab.run records."""
    base = smoke_base().replace(steps=6, warmup_steps=1, windows=2, train_images=256, eval_images=64)
    configs = [base,
               base.replace(loader="device", channels_last=True, optimizer="adamw", opt_impl="fused", amp="bf16",
                            scheduler="cosine", eval_mode="inference_mode"),
               base.replace(grad_accum_steps=2, optimizer="sgd", scheduler="onecycle", log_every=2, steps=7,
                            log_loss="tensor", set_to_none=False, model="compact", batch_size=16)]
    results = run_scripts([code(c) for c in configs], tmp_path)
    for cfg, (rc, output) in zip(configs, results):
        assert rc == 0, output
        run = fastlab.run(cfg, progress=False)
        losses, accuracy = logged(output)
        assert losses == [(s, v) for s, v in run.losses if s in dict(losses)], (cfg.diff(base), output)
        assert accuracy == run.eval_accuracy


# ------------------------------------------------------------------ each knob's lines

KNOB_LINES = [
    (dict(num_workers=2), "num_workers=2,"),
    (dict(num_workers=2, pin_memory=True), 'pin_memory=device.type == "cuda",'),
    (dict(pin_memory=True, non_blocking=True), "x.to(device, non_blocking=True)"),
    (dict(num_workers=2, persistent_workers=True), "persistent_workers=True"),
    (dict(num_workers=2, prefetch_factor=4), "prefetch_factor=4"),
    (dict(loader="device"), "loader = DeviceLoader(images, labels"),
    (dict(amp="fp16"), "scaler = torch.amp.GradScaler(device.type)"),
    (dict(amp="fp16"), "scaler.scale(loss).backward()"),
    (dict(amp="fp16"), "with torch.autocast(device.type, dtype=torch.float16)"),
    (dict(amp="bf16"), "with torch.autocast(device.type, dtype=torch.bfloat16)"),
    (dict(tf32=False), 'torch.backends.cudnn.conv.fp32_precision = "ieee"'),
    (dict(matmul_precision="high"), 'torch.set_float32_matmul_precision("high")'),
    (dict(cudnn_benchmark=True), "torch.backends.cudnn.benchmark = True"),
    (dict(channels_last=True), "raw_model = raw_model.to(memory_format=torch.channels_last)"),
    (dict(channels_last=True), "\n        x = x.contiguous(memory_format=torch.channels_last)"),  # the loop's
    (dict(compile="default"), "model = torch.compile(model)"),
    (dict(compile="reduce-overhead"), 'model = torch.compile(model, mode="reduce-overhead")'),
    (dict(compile="max-autotune"), 'mode="max-autotune"'),
    (dict(grad_accum_steps=4), "if micro < 4:"),
    (dict(grad_accum_steps=4), "(loss / 4).backward()"),
    (dict(optimizer="sgd"), "torch.optim.SGD(params, lr=0.003, momentum=0.9, nesterov=True"),
    (dict(optimizer="adamw"), "torch.optim.AdamW(params"),
    (dict(opt_impl="fused"), 'impl["fused"] = True'),
    (dict(opt_impl="foreach"), 'impl["foreach"] = True'),
    (dict(opt_impl="for-loop"), 'impl["foreach"] = False'),
    (dict(scheduler="cosine"), "CosineAnnealingLR(optimizer, T_max=total_steps)"),
    (dict(scheduler="onecycle"), "OneCycleLR(optimizer, max_lr=0.003, total_steps=total_steps)"),
    (dict(scheduler="cosine"), "scheduler.step()"),
    (dict(set_to_none=False), "optimizer.zero_grad(set_to_none=False)"),
    (dict(log_loss="tensor"), "kept_losses.append(loss)"),
    (dict(log_every=10), "if (step + 1) % 10 == 0:"),
    (dict(eval_mode="inference_mode"), "torch.inference_mode()"),
    (dict(eval_mode="autograd"), "contextlib.nullcontext()  # the pitfall"),
    (dict(model="resnet18"), "def resnet18_cifar("),
    (dict(model="compact"), "class CompactNet(nn.Module):"),
]


@pytest.mark.parametrize("changes,line", KNOB_LINES, ids=[f"{'-'.join(c)}:{line[:30]}" for c, line in KNOB_LINES])
def test_a_knob_adds_its_line_and_its_default_adds_none(changes, line):
    base = smoke_base()
    assert line in code(base.replace(**changes))
    assert line not in code(base)


def test_default_script_is_plain():
    script = code(smoke_base())
    for absent in ("autocast", "GradScaler", "torch.compile", "channels_last = True", "cudnn", "scheduler",
                   "num_workers", "pin_memory", "micro", "log_every", "loader = DeviceLoader(images"):
        assert absent not in script.split("def train")[1], absent
    # set_to_none left at its default: the call is bare, and the comment that spoke of it went with the argument
    assert "optimizer.zero_grad()\n" in script and "set_to_none" not in script and "torch.no_grad()" in script
    assert "data: SYNTHETIC" in script and "make_synthetic" in script


def test_real_cifar10_is_read_through_torchvision():
    script = code(smoke_base().replace(dataset="cifar10"))
    assert "torchvision.datasets.CIFAR10(DATA_DIR" in script and "make_synthetic" not in script
    assert "real CIFAR-10" in script


def test_code_rejects_what_is_not_a_config():
    with pytest.raises(TypeError, match="cfg must be a TrainConfig"):
        code({"amp": "bf16"})  # type: ignore[arg-type]


# ------------------------------------------------------------------ code_diff


def test_code_diff_names_the_lines_a_change_adds_and_removes():
    base = smoke_base()
    diff = code_diff(base, base.replace(amp="bf16", channels_last=True))
    added = "\n".join(diff.added)
    assert "torch.autocast(device.type, dtype=torch.bfloat16)" in added and "memory_format=torch.channels_last" in added
    assert any("loss = F.cross_entropy(model(x), y)" in line for line in diff.removed)
    assert not any("Changed from" in line for line in diff.added + diff.removed)  # the technique's lines only
    text = str(diff)
    assert text.startswith("--- baseline\n+++ amp='bf16', channels_last=True")
    assert "\n+        with torch.autocast" in text and "\n-            logits = model(x)" in text


def test_code_diff_is_coloured_html_in_jupyter_and_escaped():
    base = smoke_base()
    page = code_diff(base, base.replace(log_loss="tensor"))._repr_html_()
    assert "background:#e6ffec" in page and "background:#ffebe9" in page  # added green, removed red
    assert "kept_losses.append(loss)" in page
    page = CodeDiff("a = 1\n", "if a < b & c:\n")._repr_html_()
    assert "if a &lt; b &amp; c:" in page and "a < b" not in page


def test_code_diff_of_one_config_says_there_is_no_difference():
    base = smoke_base()
    diff = code_diff(base, base.replace(steps=base.steps))
    assert diff.added == diff.removed == [] and "no difference" in str(diff)


# ------------------------------------------------------------------ the command line


def test_cli_prints_the_script_and_the_diff(capsys):
    assert cli_main(["code", "--profile", "smoke", "--amp", "bf16"]) == 0
    out = capsys.readouterr().out
    assert out.startswith('"""One fastlab training run') and "dtype=torch.bfloat16" in out
    assert cli_main(["code", "--profile", "smoke", "--amp", "bf16", "--diff"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("--- baseline") and "\n+" in out and "dtype=torch.bfloat16" in out


def test_cli_code_rejects_a_bad_knob(capsys):
    assert cli_main(["code", "--profile", "smoke", "--batch-size", "0"]) == 2
    assert "TrainConfig.batch_size=0" in capsys.readouterr().err


def test_the_script_evaluates_in_the_layout_it_trains_in():
    import numpy as np
    import torch

    base = smoke_base()
    layouts: list[bool] = []

    class Recorder(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            layouts.append(x.is_contiguous())
            return torch.zeros(len(x), 10)

    for cfg in (base, base.replace(channels_last=True)):
        namespace: dict = {}
        exec(compile(code(cfg), "script", "exec"), namespace)  # the definitions; train() is not called
        held_out = namespace["DeviceLoader"](np.zeros((4, 32, 32, 3), np.uint8), np.zeros(4, np.int64), batch_size=4,
                                             train=False)
        namespace["evaluate"](Recorder(), held_out, torch.device("cpu"))
    assert layouts == [True, False]  # NCHW unless channels_last is on, as fastlab's evaluation


def test_the_script_copies_as_the_run_copies():
    base = smoke_base()
    unpinned = code(base.replace(non_blocking=True))  # the pitfall shows: asked for, and from pageable memory
    assert "x.to(device, non_blocking=True)" in unpinned and "pin_memory" not in unpinned.split("def train")[1]
    on_device = code(base.replace(loader="device", non_blocking=True, pin_memory=True))
    assert "pin_memory" not in on_device.split("def train")[1].split("# ---- model")[0]
    assert 'torch.set_float32_matmul_precision("medium")' in code(base.replace(matmul_precision="medium"))
