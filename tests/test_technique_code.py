"""fastlab.lessons.technique_code and fastlab.code.snippet_diff: the lines notebooks 07-12 show for the techniques
without a config knob, and the learner's path in those notebooks.

The notebooks' "The code" and "Write it yourself" sections are checked by tests/test_the_code_sections.py
(CODE_CALLS_07_12). Here: each snippet pair differs exactly by its technique's calls, the snippets run and do what
the notebooks say (the same gradients checkpointed, nothing recorded without prof.step(), a group of one left
cleanly), and the guard rails sit collapsed at the end of each notebook.
"""

from __future__ import annotations

import copy
import json
import re
import warnings
from pathlib import Path

import pytest
import torch

from fastlab import code_diff
from fastlab.code import snippet_diff
from fastlab.config import config_for
from fastlab.lessons import technique_code as tc
from fastlab.models import build_model

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"

NAMES = ["07_compile_and_export", "08_profiling", "09_all_together", "10_your_own_model", "11_multi_gpu_ddp", "12_memory"]


def cells(name: str) -> list[dict]:
    return json.loads((NOTEBOOKS / f"{name}.ipynb").read_text())["cells"]


def source(cell: dict) -> str:
    return "".join(cell["source"])


# ------------------------------------------------------------------ the diffs themselves


def test_compile_diff_adds_torch_compile_and_calls_it():
    cfg = config_for("smoke")
    diff = code_diff(cfg, cfg.replace(compile="default"))
    assert any("model = torch.compile(model)" in line for line in diff.added)  # the loop then calls the compiled one


SNIPPET_PAIRS = [
    (tc.fp16_step, tc.fp16_step_clipped, ["scaler.unscale_(opt)", "clip_grad_norm_("]),
    (tc.train_steps, tc.train_steps_profiled, ["torch.profiler.profile(", "schedule=", "on_trace_ready=", "prof.step()"]),
    (tc.train_steps_profiled, tc.train_steps_profiled_unstepped, []),
    (tc.train_steps, tc.train_steps_watched, ["for x, y in w(batches):", "with w.step(len(x)) as s:", "s.loss = loss"]),
    (tc.train_step, tc.train_step_checkpointed, ["checkpoint(block, h, use_reentrant=False)"]),
    (tc.train_step_checkpointed, tc.train_step_reentrant, ["use_reentrant=True"]),
    (tc.train_compiled, tc.train_compiled_drop_last, ["drop_last=True"]),
    (tc.train_compiled, tc.train_compiled_dynamic, ["torch._dynamo.mark_dynamic(x, 0)"]),
    (tc.save_model, tc.save_model_exported, ["torch.export.export(", "torch.onnx.export(", "torch.export.Dim("]),
    (tc.train_epoch, tc.train_epoch_ddp, ["init_process_group(", "DistributedDataParallel(", "DistributedSampler(",
                                         "set_epoch(", "destroy_process_group()"]),
]


@pytest.mark.parametrize("plain, changed, calls", SNIPPET_PAIRS, ids=lambda v: getattr(v, "__name__", "calls"))
def test_snippet_pairs_differ_by_the_technique_only(plain, changed, calls):
    diff = snippet_diff(plain, changed)
    added = "\n".join(diff.added)
    assert all(call in added for call in calls), (calls, added)
    assert '"""' not in str(diff), "docstrings are left out of the diff"
    shared = [line for line in diff.unified if line.startswith(" ")]
    assert len(shared) >= 2, "the rest of the function is shown as context, unchanged"
    if not calls:  # the unstepped pitfall: one line removed, nothing added
        assert diff.removed and all("prof.step()" in line for line in diff.removed) and not diff.added


def test_snippet_diff_shows_whole_functions_and_can_be_empty():
    same = snippet_diff(tc.train_step, tc.train_step)
    assert same.unified == [] and "no difference" in str(same)
    whole = snippet_diff(tc.train_step, tc.train_step_checkpointed)
    assert len([line for line in whole.unified if line.startswith(" ")]) >= 7  # every unchanged line as context
    assert whole.unified[2].startswith("@@") and "def train_step(" in str(whole)  # the names made equal
    with pytest.raises(TypeError, match="must be a function"):
        snippet_diff("def f(): pass", tc.train_step)


# ------------------------------------------------------------------ the snippets run and do what the prose says


def test_checkpointed_step_gives_the_plain_gradients_and_reentrant_loses_them():
    x, y = tc.tiny_batches(1, 8)[0]
    plain = build_model("tiny")
    ckpt = copy.deepcopy(plain)
    tc.train_step(plain, x, y, torch.optim.SGD(plain.parameters(), lr=0.0))
    tc.train_step_checkpointed(ckpt, x, y, torch.optim.SGD(ckpt.parameters(), lr=0.0))
    for a, b in zip(plain.parameters(), ckpt.parameters()):
        torch.testing.assert_close(a.grad, b.grad)
    assert tc.params_without_grad(ckpt) == 0
    reentrant = build_model("tiny")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tc.train_step_reentrant(reentrant, x, y, torch.optim.SGD(reentrant.parameters(), lr=0.0))
    assert tc.params_without_grad(reentrant) == len(list(reentrant.features.parameters())) > 0


def test_clipping_under_grad_scaler_unscales_first_so_max_norm_is_in_the_gradients_own_units():
    x, y = tc.tiny_batches(1, 8)[0]
    norms = []
    for step in (tc.fp16_step, tc.fp16_step_clipped):
        torch.manual_seed(0)
        net = build_model("tiny")
        opt = torch.optim.SGD(net.parameters(), lr=0.0)
        scaler = torch.amp.GradScaler("cpu")
        kwargs = {"max_norm": 1e-3} if step is tc.fp16_step_clipped else {}
        step(net, x, y, opt, scaler, **kwargs)
        norms.append(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in net.parameters()])).item())
        assert scaler.get_scale() > 1.0  # the loss was scaled (a clip of those would land far below max_norm)
    plain, clipped = norms
    assert plain > 1e-3 and clipped == pytest.approx(1e-3, rel=1e-3)
    added = snippet_diff(tc.fp16_step, tc.fp16_step_clipped).added
    assert [i for i, line in enumerate(added) if "unscale_" in line] < [i for i, line in enumerate(added)
                                                                         if "clip_grad_norm_" in line]


def test_the_ragged_last_batch_compiles_a_second_graph_and_each_fix_keeps_one(monkeypatch):
    from fastlab.lessons.compile_export import graphs_compiled

    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model: real(model, backend="eager"))  # dynamo's guards, no codegen
    data = tc.tiny_dataset(20)  # batches of 8: 8, 8 and a ragged 4
    graphs = {}
    for loop in (tc.train_compiled, tc.train_compiled_drop_last, tc.train_compiled_dynamic):
        torch._dynamo.reset()
        before = graphs_compiled()
        loop(build_model("tiny"), data, 8)
        graphs[loop.__name__] = graphs_compiled() - before
    torch._dynamo.reset()
    assert graphs == {"train_compiled": 2, "train_compiled_drop_last": 1, "train_compiled_dynamic": 1}


def test_profiled_loop_records_and_writes_a_trace_and_the_unstepped_one_does_not(tmp_path):
    net = build_model("tiny")
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    stepped = tc.train_steps_profiled(net, tc.tiny_batches(5, 4), opt, tmp_path)
    assert tc.recorded_ops(stepped) > 0 and "traceEvents" in json.loads((tmp_path / "trace.json").read_text())
    (tmp_path / "trace.json").unlink()
    unstepped = tc.train_steps_profiled_unstepped(net, tc.tiny_batches(5, 4), opt, tmp_path)
    assert tc.recorded_ops(unstepped) == 0 and not list(tmp_path.iterdir())


def test_no_profiler_snippet_or_08_cell_uses_the_deprecated_tensorboard_plugin():
    import inspect

    assert "tensorboard_trace_handler" not in inspect.getsource(tc)
    assert not [i for i, c in enumerate(cells("08_profiling")) if "tensorboard_trace_handler" in source(c)]


def test_ddp_epoch_runs_in_a_group_of_one_and_leaves_the_environment_as_it_was():
    import os

    import torch.distributed as dist

    before = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_PORT")}
    loss = tc.run_one_process_group(tc.train_epoch_ddp, lambda: build_model("tiny"), tc.tiny_dataset(32), 8)
    assert torch.isfinite(torch.tensor(loss)) and not dist.is_initialized()
    assert {k: os.environ.get(k) for k in before} == before


def test_ddp_epoch_on_a_simulated_gpu_drives_its_local_rank_and_reshuffles_each_epoch(monkeypatch, capsys):
    """torch.cuda.is_available() says True (this torch has no CUDA): every CUDA-only call is recorded instead."""
    import torch.distributed as dist

    seen: dict[str, list] = {"set_device": [], "backend": [], "to": [], "epochs": []}
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", seen["set_device"].append)
    monkeypatch.setattr(dist, "init_process_group", lambda backend: seen["backend"].append(backend))
    monkeypatch.setattr(dist, "get_backend", lambda: seen["backend"][-1])
    monkeypatch.setattr(dist, "get_rank", lambda: 0)
    monkeypatch.setattr(dist, "get_world_size", lambda: 1)
    monkeypatch.setattr(dist, "destroy_process_group", lambda: None)
    monkeypatch.setattr(torch.Tensor, "to", lambda t, device, *a, **k: seen["to"].append(torch.device(device)) or t)

    class FakeDDP(torch.nn.Module):
        def __init__(self, module, device_ids=None):
            super().__init__()
            self.module, self.device_ids = module, device_ids

        def forward(self, x):
            return self.module(x)

    class Sampler(tc.DistributedSampler):
        def set_epoch(self, epoch):
            seen["epochs"].append(epoch)
            super().set_epoch(epoch)

    made = []
    monkeypatch.setattr(tc, "DistributedDataParallel", lambda m, device_ids=None: made.append(FakeDDP(m, device_ids))
                        or made[-1])
    monkeypatch.setattr(tc, "DistributedSampler", Sampler)
    tc.train_epoch_ddp(lambda: build_model("tiny"), tc.tiny_dataset(32), 8, epochs=2)
    assert seen["set_device"] == [1] and seen["backend"] == ["nccl"]
    assert made[0].device_ids == [1]
    assert seen["to"] and set(seen["to"]) == {torch.device("cuda", 1)}, "the model and every batch go to cuda:1"
    assert seen["epochs"] == [0, 1], "set_epoch once per epoch, inside the epoch loop"
    assert "backend nccl" in capsys.readouterr().out, "the backend printed is the one the group started with"


def test_exported_snippet_writes_a_program_that_matches_eager(tmp_path):
    import contextlib
    import io

    net = build_model("tiny").eval()
    x = tc.tiny_batches(1, 4)[0][0]
    with contextlib.redirect_stdout(io.StringIO()):
        path = tc.save_model_exported(net, x, tmp_path)
    assert path.with_suffix(".onnx").stat().st_size > 0
    program = torch.export.load(path).module()
    with torch.inference_mode():
        torch.testing.assert_close(program(x[:3]), net(x[:3]), atol=1e-4, rtol=1e-4)
    assert tc.save_model(net, x, tmp_path).stat().st_size > 0


# ------------------------------------------------------------------ write it yourself, and the learner's path


@pytest.mark.parametrize("name", sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb")))
def test_guard_rails_are_collapsed_at_the_end(name):
    nb = cells(name)
    code = [c for c in nb if c["cell_type"] == "code"]
    last = code[-1]
    assert source(last).startswith("# NBVAL_CHECK_OUTPUT") and nb[-1] is last
    assert last["metadata"].get("jupyter", {}).get("source_hidden") is True
    assert re.match(r"## Guard rails", source(nb[-2])), "the heading the scaffolding test looks for, just above it"


@pytest.mark.parametrize("name", ["tiny", "compact", "resnet18"])
def test_checkpointing_snippets_run_on_every_profile_model(name):
    """12 under the gpu profile (issue 53): ResNet-18 has no features/head, yet the three checkpointing steps run on
    it, the checkpointed one with the plain gradients, and the blocks with the head are the model's own forward."""
    net = build_model(name)
    x, y = tc.tiny_batches(1, 4)[0]
    ckpt, reentrant, plain = copy.deepcopy(net), copy.deepcopy(net), copy.deepcopy(net).eval()
    tc.train_step(net, x, y, torch.optim.SGD(net.parameters(), lr=0.0))
    tc.train_step_checkpointed(ckpt, x, y, torch.optim.SGD(ckpt.parameters(), lr=0.0))
    for a, b in zip(net.parameters(), ckpt.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tc.train_step_reentrant(reentrant, x, y, torch.optim.SGD(reentrant.parameters(), lr=0.0))
    assert 0 < tc.params_without_grad(reentrant) < len(list(reentrant.parameters()))
    blocks, head = tc.blocks_and_head(plain)
    h = x
    for block in blocks:
        h = block(h)
    torch.testing.assert_close(head(h), plain(x))  # the blocks, then the head: the model's own forward
