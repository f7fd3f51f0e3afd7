"""Notebook 07: torch.compile modes against eager (compile time lands in the untimed warm-up), the recompilation
pitfall, and export for deployment."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import psutil
import torch
from torch import nn

from .. import claims
from ..claims import Judgement
from ..comparisons import comparison
from ..config import TrainConfig, time_sizing
from ..data import DeviceLoader, load_images
from ..measure import now, resolve_device
from ..models import build_model
from ..plots import ShownFigure
from ..profiles import profile_of
from ..results import RunResult
from ..train import run
from ..verdicts import verdict

MODES_COMPARISON = "07_compile_and_export:modes"
COMPILE_MODES = ("off", "default", "max-autotune", "reduce-overhead")


def modes_plan(base: TrainConfig) -> tuple[list[str], dict[str, str]]:
    """Which compile modes this profile runs (Profile.all_compile_modes), and why each other one is not run."""
    if not profile_of(base).all_compile_modes:
        name = base.profile
        return ["off", "default"], {
            "max-autotune": f"not under {name}: it benchmarks many kernel variants while compiling (minutes on a CPU)",
            "reduce-overhead": f"not under {name}: it adds CUDA graphs to default (a recorded no-op without CUDA)"}
    cuda = resolve_device(base.device).type == "cuda"
    modes, why = list(COMPILE_MODES), {} if cuda else {
        "reduce-overhead": "runs, but CUDA graphs need a CUDA GPU: here it compiles like default (a recorded no-op)"}
    if not (time_sizing(base.profile) or {}).get("max_autotune_in_fast", 1):
        modes.remove("max-autotune")
        why["max-autotune"] = ("in the thorough version only (FASTLAB_THOROUGH=1): it benchmarks many kernel variants "
                               "while compiling, minutes that would not fit this notebook's budget")
    return modes, why


@comparison(MODES_COMPARISON, arms=lambda base: len(modes_plan(base)[0]), repeated=False)
def modes(base: TrainConfig, progress: bool = True, eager_model: nn.Module | None = None) -> list[RunResult]:
    """Eager, then each compile mode of modes_plan; eager_model: a module the eager run trains in place (for export)."""
    to_run, _ = modes_plan(base)
    results = []
    for mode in to_run:
        label = "eager" if mode == "off" else f"compile {mode}"
        model = eager_model if mode == "off" else None
        results.append(run(base.replace(compile=mode), label=label, model=model, progress=progress,
                           comparison=MODES_COMPARISON))
        if results[-1].status == "interrupted":
            break
    return results


def step_ms(result: RunResult) -> float:
    """Steady-state milliseconds per optimiser step: images per step / median images per second."""
    return 1000 * result.images_per_step / result.throughput.median


def break_even_steps(eager: RunResult, compiled: RunResult) -> float | None:
    """Steps after which the compiled run's steady-state saving repays its compile (its warm-up seconds beyond
    eager's); None where it is not measurably faster (a single pair, or inside the spread) or is slower."""
    steady = verdict(eager.throughput, compiled.throughput)
    saving = step_ms(eager) - step_ms(compiled)
    if steady.single_pair or steady.noise or saving <= 0:
        return None
    return 1000 * (compiled.warmup_seconds - eager.warmup_seconds) / saving


def graphs_compiled() -> int:
    """Graphs dynamo has compiled in this process; torch._dynamo.reset keeps the count, so diff it over a run."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def recompile_reasons() -> list[str]:
    """The guard failures that triggered recompiles since the last torch._dynamo.reset(), first line of each."""
    from torch._dynamo.utils import guard_failures

    texts = (str(getattr(f, "reason", f)).strip().splitlines() for fs in guard_failures.values() for f in fs)
    return list(dict.fromkeys(t[0] for t in texts if t))


# eager: capture and guards only; aot_eager: also traces the backward; inductor: the real compiler.
DEMO_BACKENDS = ("eager", "aot_eager", "inductor")
RECOMPILE_VARIANTS = ("ragged last batch", "fix: drop_last", "fix: mark_dynamic", "fix: pad to full batch")


@dataclass
class RecompileResult:
    variant: str
    backend: str
    graphs: int  # graphs compiled over the whole run; 1 means no recompile
    batch_sizes: list[int] = field(default_factory=list)  # distinct batch sizes the model saw
    compile_step_seconds: list[float] = field(default_factory=list)  # steps during which a graph was compiled
    steady_step_seconds: list[float] = field(default_factory=list)  # steps that compiled nothing (full batches)
    images_trained: int = 0
    reasons: list[str] = field(default_factory=list)  # dynamo's guard failures that caused the recompiles

    @property
    def recompiles(self) -> int:
        return max(self.graphs - 1, 0)


def _batches(variant: str, loader: DeviceLoader, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor, int]]:
    """(images, labels, real images in the batch) as the variant feeds them to the model."""
    for x, y in loader:
        n = len(y)
        if variant == "fix: mark_dynamic":
            torch._dynamo.mark_dynamic(x, 0)  # compile for any batch size up front: one graph
        elif variant == "fix: pad to full batch" and n < batch_size:
            x = torch.cat([x, x.new_zeros(batch_size - n, *x.shape[1:])])
            y = torch.cat([y, y.new_zeros(batch_size - n)])
        yield x, y, n


def recompile_demo(cfg: TrainConfig, variant: str, *, backend: str = "eager", epochs: int = 2,
                   full_batches: int = 3) -> RecompileResult:
    """Train cfg.model with torch.compile(backend=...) on full_batches batches plus a ragged one, counting graphs.
    The fixes: drop the ragged batch, mark the batch dimension dynamic, or pad it and mask the padding out of the loss."""
    if variant not in RECOMPILE_VARIANTS:
        raise ValueError(f"variant={variant!r} is not allowed: choose one of "
                         f"{', '.join(map(repr, RECOMPILE_VARIANTS))}")
    if backend not in DEMO_BACKENDS:
        raise ValueError(f"backend={backend!r} is not allowed: choose one of {', '.join(map(repr, DEMO_BACKENDS))}")
    dev = resolve_device(cfg.device)
    bs = cfg.batch_size
    n_images = bs * full_batches + max(bs // 3, 1)
    images = load_images(cfg.dataset, max(cfg.train_images, n_images), cfg.eval_images,
                         allow_download=profile_of(cfg).downloads)
    x_all, y_all = images.train_images[:n_images], images.train_labels[:n_images]
    # train=True drops the ragged batch (and augments); train=False keeps it, in a fixed order.
    loader = DeviceLoader(x_all, y_all, batch_size=bs, train=variant == "fix: drop_last", device=dev, seed=cfg.seed)
    torch.manual_seed(cfg.seed)
    net = build_model(cfg.model).to(dev).train()
    opt = torch.optim.SGD(net.parameters(), lr=cfg.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss(reduction="none")
    torch._dynamo.reset()  # a fresh cache and fresh counters: graphs counted are this run's
    compiled = torch.compile(net, backend=backend)
    result = RecompileResult(variant=variant, backend=backend, graphs=0)
    sizes: set[int] = set()
    start = graphs_compiled()
    try:
        for _ in range(epochs):
            for x, y, n in _batches(variant, loader, bs):
                before = graphs_compiled()
                t0 = now(dev)
                opt.zero_grad(set_to_none=True)
                per_image = loss_fn(compiled(x), y)
                mask = (torch.arange(len(y), device=dev) < n).float()  # padded rows count for nothing
                ((per_image * mask).sum() / n).backward()
                opt.step()
                seconds = now(dev) - t0
                sizes.add(len(y))
                result.images_trained += n
                if graphs_compiled() > before:
                    result.compile_step_seconds.append(seconds)
                elif len(y) == bs:
                    result.steady_step_seconds.append(seconds)
        result.graphs = graphs_compiled() - start
        result.reasons = recompile_reasons()
    finally:
        torch._dynamo.reset()
    result.batch_sizes = sorted(sizes)
    return result


def held_out_batch(cfg: TrainConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The first batch of the held-out images, normalised like evaluation sees it, on the CPU."""
    images = load_images(cfg.dataset, cfg.train_images, cfg.eval_images, allow_download=profile_of(cfg).downloads)
    loader = DeviceLoader(images.eval_images, images.eval_labels, batch_size=cfg.batch_size, train=False, device="cpu")
    return next(iter(loader))


@dataclass
class ExportComparison:
    """Eager, torch.export and onnxruntime on one held-out batch: latency, parity, memory, file sizes, export time."""

    batch_size: int
    runtimes: list  # fastlab.export.RuntimeResult, eager first
    sizes_kib: dict[str, float]  # "state_dict", "torch.export", "onnx"
    export_seconds: dict[str, float]
    memory_mb: dict[str, float]  # runtime name -> process RSS rise while it was built and first ran (approximate)
    files: dict[str, str] = field(default_factory=dict)


def export_comparison(net: nn.Module, batch: torch.Tensor, folder: str, *, repeats: int = 20,
                      warmup: int = 3) -> ExportComparison:
    """Export `net` (torch.export, then ONNX) and compare the three runtimes on `batch`. Memory is each one's RSS rise
    while built and first run (approximate: the allocator may reuse memory an earlier one freed)."""
    # here: fastlab.export is the optional `export` extra's (onnx, onnxruntime), needed only by this demo
    from ..export import compare_runtimes, export_model, onnx_runner, onnx_session

    exported = export_model(net, batch, folder)
    memory: dict[str, float] = {}
    builders = {"eager PyTorch": lambda: net.cpu().eval(),
                "torch.export program": lambda: exported.program.module(),
                "onnxruntime": lambda: onnx_runner(onnx_session(exported.files["onnx"]))}
    keep = []  # each stays alive, so the next one's RSS rise is its own
    for name, build in builders.items():
        before = psutil.Process().memory_info().rss
        fn = build()
        with torch.inference_mode():
            fn(batch.cpu())
        memory[name] = (psutil.Process().memory_info().rss - before) / 2**20
        keep.append(fn)
    runtimes = compare_runtimes(net, batch, exported, repeats=repeats, warmup=warmup)
    return ExportComparison(batch_size=len(batch), runtimes=runtimes, sizes_kib=exported.sizes_kib(),
                            export_seconds=dict(exported.seconds), memory_mb=memory,
                            files={k: str(v) for k, v in exported.files.items()})


def plot_export(comparisons: list[ExportComparison], title: str = ""):
    """Latency per runtime for each batch size compared, file sizes, and memory added; parity with eager on top."""
    fig = ShownFigure(figsize=(12, 3.8))
    ax_l, ax_s, ax_m = fig.subplots(1, 3)
    names = [r.name for r in comparisons[0].runtimes]
    width = 0.8 / len(comparisons)
    for i, c in enumerate(comparisons):
        lat = [r.latency for r in c.runtimes]
        xs = [j + i * width for j in range(len(lat))]
        ax_l.bar(xs, [s.median for s in lat], width, yerr=[[s.median - s.low for s in lat],
                                                          [s.high - s.median for s in lat]], capsize=3,
                 label=f"batch {c.batch_size}")
    ax_l.set_xticks([j + width * (len(comparisons) - 1) / 2 for j in range(len(names))])
    ax_l.set_xticklabels([n.replace(" ", "\n", 1) for n in names], fontsize=8)
    ax_l.set_ylabel("ms per batch (median, min-max)")
    ax_l.set_title("latency", fontsize=9)
    ax_l.legend(fontsize=7)
    last = comparisons[-1]
    ax_s.bar(list(last.sizes_kib), list(last.sizes_kib.values()), color="tab:gray")
    ax_s.set_ylabel("KiB")
    ax_s.set_title("file size", fontsize=9)
    ax_m.bar([n.replace(" ", "\n", 1) for n in last.memory_mb], list(last.memory_mb.values()), color="tab:purple")
    ax_m.set_ylabel("MiB (process RSS rise, approximate)")
    ax_m.set_title("memory added by building and first run", fontsize=9)
    for ax in (ax_s, ax_m):
        ax.tick_params(axis="x", labelsize=8)
    parity = "; ".join(f"{r.name}: {r.parity}" for r in last.runtimes[1:])
    fig.suptitle(f"{title + ' - ' if title else ''}eager vs torch.export vs ONNX Runtime on the CPU\n"
                 f"parity with eager: {parity}", fontsize=9)
    fig.tight_layout()
    return fig


def judge_export(comparison: ExportComparison, torchscript: dict[str, list[str]]) -> Judgement:
    """C14: TorchScript as a route (judged by torch's own warnings) and ONNX through torch.export (judged by a
    parity check against eager: the same top-1 class on every image, logits within PARITY_TOLERANCE)."""
    ts_words = [m for messages in torchscript.values() for m in messages]
    deprecated = [m for m in ts_words if "deprecat" in m.lower()]
    onnx = next(r for r in comparison.runtimes if r.name == "onnxruntime")
    ok = onnx.parity.top1_agreement == 1.0 and onnx.parity.max_abs_diff <= PARITY_TOLERANCE
    return claims.verdict_conditions({
        "the route is TorchScript":
            Judgement("does not hold here (torch deprecates it: its own warning is printed above)", deprecated[0])
            if deprecated else Judgement("holds (this PyTorch gives no deprecation warning)",
                                       "; ".join(ts_words) or "no warning"),
        "the route is ONNX (through torch.export)":
            Judgement("holds" if ok else "does not hold here (the ONNX model's answers differ from eager's)",
                    str(onnx.parity))})


PARITY_TOLERANCE = 1e-3  # largest |logit difference| an export may have and still count as the same model


def export_runner(net: nn.Module, cfg: TrainConfig, folder: str):
    """A Panel runner: export and compare at the panel's batch_size; the comparison is in extras["export"]."""

    def runner(config: TrainConfig, *, label: str = "export", progress: bool = False, stop=None, on_step=None):
        x, _ = held_out_batch(cfg.replace(batch_size=config.batch_size,
                                          eval_images=max(cfg.eval_images, config.batch_size)))
        comparison = export_comparison(net, x, folder)
        return as_result(comparison, config, label)

    return runner


def as_result(comparison: ExportComparison, config: TrainConfig, label: str) -> RunResult:
    """An ExportComparison packed as a RunResult (for the panel's list of results)."""
    r = RunResult(config=config.to_dict(), label=label, images_per_step=comparison.batch_size)
    r.extras["export"] = comparison
    return r
