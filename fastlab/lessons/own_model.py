"""10_your_own_model: fastlab.run on the reader's model and data, with a demo model and Dataset, a Dataset ->
ImageSet converter, and advice on what to try first."""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from .. import budget
from ..comparisons import comparison
from ..config import TrainConfig, config_for
from ..data import ImageSet, spawn_safety, worker_start_method  # noqa: F401  (re-exported: notebook 10 names them)
from ..measure import bf16_supported, resolve_device, usable_cpu_count
from ..profiles import profile_of
from ..results import RunResult
from ..train import run
from ..verdicts import CREDITED, runs_verdict

NAME = "10_your_own_model:first_steps"
IMAGE_SHAPE = (32, 32, 3)  # what fastlab's device loader crops and normalises (CIFAR-shaped, HxWxC)

ModelArg = nn.Module | Callable[[], nn.Module]
DatasetArg = ImageSet | tuple[Dataset, Dataset]


def demo_model(num_classes: int = 10) -> nn.Module:
    """torchvision's MobileNetV3-Small, untrained (weights=None: nothing is downloaded)."""
    import torchvision

    return torchvision.models.mobilenet_v3_small(weights=None, num_classes=num_classes)


class StripesDataset(Dataset):
    """A SYNTHETIC stand-in for "your own data": striped 32x32 RGB images (float32 in [0, 1]) and labels, by index.
    Defined in a module, not the notebook: DataLoader workers started with spawn must import it by name."""

    synthetic = True  # read by fastlab.run and to_imageset: results and plots say SYNTHETIC
    num_classes = 10

    def __init__(self, n: int, split: str = "train", seed: int = 0) -> None:
        if split not in ("train", "held_out"):
            raise ValueError(f"StripesDataset split={split!r} is not allowed: choose 'train' or 'held_out'")
        self.n, self.split, self.seed = n, split, seed
        ar = torch.arange(32, dtype=torch.float32) - 15.5
        self._yy, self._xx = torch.meshgrid(ar, ar, indexing="ij")

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if not 0 <= index < self.n:
            raise IndexError(f"index {index} out of range for StripesDataset of {self.n} images")
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + (0 if self.split == "train" else 500_000) + index)
        label = int(torch.randint(0, self.num_classes, (1,), generator=g))
        r = torch.rand(6, generator=g)
        angle = (label % 5) * math.pi / 5 + (r[0] - 0.5) * 0.3
        freq = 0.35 + 0.4 * r[1]
        wave = 0.5 + 0.5 * torch.sin(freq * (self._xx * math.cos(angle) + self._yy * math.sin(angle)) + 6.283 * r[2])
        warm = torch.tensor([0.9, 0.5, 0.2]) if label < 5 else torch.tensor([0.2, 0.5, 0.9])
        colour = (warm + 0.2 * (r[3:6] - 0.5)).clamp(0, 1)
        img = wave[None] * colour[:, None, None] + 0.12 * torch.randn(3, 32, 32, generator=g)
        return img.clamp(0, 1), label


def notebook_config(profile: str | None = None, **changes: Any) -> tuple[TrainConfig, str]:
    """The notebook's config (the active profile's, shortened where the profile says: Profile.own_model_shortening,
    with the DataLoader its Datasets need) and a sentence saying what changed."""
    cfg = config_for(profile)
    note = f"profile {cfg.profile}: its own sizes"
    short = profile_of(cfg).own_model_shortening
    if short:
        cfg = cfg.replace(**short)
        note = (f"profile {cfg.profile}: shortened to {', '.join(f'{k}={v}' for k, v in short.items())} because "
                "MobileNetV3-Small is several times slower per image than the tiny net on a CPU")
    cfg, switched = for_datasets(cfg)
    return cfg.replace(**changes), note + (f"; {switched}" if switched else "")


def for_datasets(config: TrainConfig) -> tuple[TrainConfig, str]:
    """config as fastlab.run takes it with the reader's torch Datasets, and what was switched ("" if nothing): the
    device loader needs the images as a fastlab.ImageSet (to_imageset makes one), so a Dataset is read by the
    DataLoader instead; first_steps then tries the device loader as a technique, on the converted images."""
    if config.loader != "device":
        return config, ""
    switched = config.replace(loader="dataloader")
    return switched, (f"the profile's loader={config.loader!r} switched to loader={switched.loader!r} for your "
                      "Datasets (the device loader needs a fastlab.ImageSet: to_imageset converts them)")


def demo_datasets(config: TrainConfig, seed: int = 0) -> tuple[StripesDataset, StripesDataset]:
    """(train, held_out) StripesDatasets of the sizes in config (train_images, eval_images)."""
    return (StripesDataset(config.train_images, "train", seed),
            StripesDataset(config.eval_images, "held_out", seed))


# ---------------------------------------------------------------- Dataset -> ImageSet


def _image_to_uint8(img: Any, where: str) -> np.ndarray:
    """One image (CHW tensor, HWC array, or RGB PIL image) as uint8 HxWx3; a clear error otherwise."""
    if hasattr(img, "mode") and hasattr(img, "size") and not isinstance(img, (np.ndarray, torch.Tensor)):
        if img.mode != "RGB":
            raise ValueError(f"{where}: a PIL image in mode {img.mode!r}; to_imageset needs RGB images (3 channels)")
        arr = np.asarray(img)
    elif isinstance(img, torch.Tensor):
        t = img.detach().cpu()
        arr = (t.permute(1, 2, 0) if t.ndim == 3 and t.shape[0] == 3 else t).numpy()
    elif isinstance(img, np.ndarray):
        arr = img.transpose(1, 2, 0) if img.ndim == 3 and img.shape[0] == 3 and img.shape[-1] != 3 else img
    else:
        raise ValueError(f"{where}: an image of type {type(img).__name__}; to_imageset needs a torch tensor (CxHxW), "
                         "a numpy array (HxWxC) or an RGB PIL image")
    if tuple(arr.shape) != IMAGE_SHAPE:
        raise ValueError(f"{where}: an image of shape {tuple(arr.shape)}; fastlab's device loader takes 3x32x32 RGB "
                         "images (resize them first, e.g. torchvision.transforms.Resize((32, 32)))")
    if arr.dtype == np.uint8:
        return arr
    if not np.issubdtype(arr.dtype, np.floating):
        raise ValueError(f"{where}: images of dtype {arr.dtype}; to_imageset takes uint8 (0-255) or float in [0, 1]")
    low, high = float(arr.min()), float(arr.max())
    if low < -1e-6 or high > 1 + 1e-6:
        raise ValueError(f"{where}: float values from {low:.3g} to {high:.3g}; to_imageset takes float images in "
                         "[0, 1] (ToTensor's output). Remove Normalize from the Dataset's transform: the device loader "
                         "normalises whole batches itself")
    return (np.clip(arr, 0, 1) * 255).round().astype(np.uint8)


def _label(value: Any, where: str) -> int:
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{where}: label {value!r}; to_imageset needs integer class labels >= 0")
    return int(value)


def _arrays(ds: Dataset, arg: str) -> tuple[np.ndarray, np.ndarray]:
    n = len(ds)
    if n < 1:
        raise ValueError(f"to_imageset {arg}: the dataset is empty")
    images = np.empty((n, *IMAGE_SHAPE), dtype=np.uint8)
    labels = np.empty(n, dtype=np.int64)
    for i in range(n):
        item = ds[i]
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise ValueError(f"to_imageset {arg}[{i}]: got {type(item).__name__}; the Dataset must yield "
                             "(image, label) pairs")
        images[i] = _image_to_uint8(item[0], f"to_imageset {arg}[{i}]")
        labels[i] = _label(item[1], f"to_imageset {arg}[{i}]")
    return images, labels


def imageset_mb(train: Dataset, held_out: Dataset) -> float:
    """MiB the two datasets take as uint8 32x32x3 arrays (what the device loader holds on the device)."""
    return (len(train) + len(held_out)) * math.prod(IMAGE_SHAPE) / 2**20


def to_imageset(train: Dataset, held_out: Dataset, *, max_mb: float = 2048.0, name: str | None = None) -> ImageSet:
    """Map-style Datasets of (image, label) as a fastlab.ImageSet (for loader="device"), if they fit in max_mb MiB.
    Images: CxHxW tensors, HxWxC arrays or RGB PIL images, 32x32, uint8 or float in [0, 1] (not normalised). A
    dataset with `synthetic = True` becomes an ImageSet named "synthetic", so results and plots say so."""
    if isinstance(max_mb, bool) or not isinstance(max_mb, (int, float)) or not max_mb > 0:
        raise ValueError(f"to_imageset max_mb={max_mb!r} is not allowed: a number of MiB > 0")
    for arg, ds in (("train", train), ("held_out", held_out)):
        if not (hasattr(ds, "__len__") and hasattr(ds, "__getitem__")):
            raise ValueError(f"to_imageset {arg}={type(ds).__name__} is not allowed: a map-style torch Dataset "
                             "(with __len__ and __getitem__)")
    need = imageset_mb(train, held_out)
    if need > max_mb:
        raise ValueError(f"to_imageset: the images take {need:,.0f} MiB as uint8, over max_mb={max_mb:g}. Raise "
                         "max_mb if they fit in host and device memory, or keep loader='dataloader' with the Datasets")
    tx, ty = _arrays(train, "train")
    ex, ey = _arrays(held_out, "held_out")
    synthetic = bool(getattr(train, "synthetic", False))
    label = "synthetic" if synthetic else (name or type(train).__name__)
    source = (f"{type(train).__name__} ({len(train)}) / {type(held_out).__name__} ({len(held_out)}), "
              "converted by to_imageset" + (" (generated: SYNTHETIC)" if synthetic else ""))
    return ImageSet(tx, ty, ex, ey, label, source)


# ---------------------------------------------------------------- what to try first


def _builder(model: ModelArg) -> Callable[[], nn.Module]:
    """A function building a fresh model per run: a module passed twice would carry on from trained weights."""
    if isinstance(model, nn.Module):
        start = copy.deepcopy(model)
        return lambda: copy.deepcopy(start)
    if callable(model):
        return model
    raise ValueError(f"model={type(model).__name__} is not allowed: an nn.Module or a function returning one")


def candidates(base: TrainConfig, dataset: DatasetArg, max_mb: float = 2048.0
               ) -> tuple[dict[str, dict[str, Any]], dict[str, str], ImageSet | None]:
    """The first techniques to try here: (name -> changes, name -> why not tried, the device loader's ImageSet)."""
    device = resolve_device(base.device)
    tried: dict[str, dict[str, Any]] = {}
    skipped: dict[str, str] = {}
    if base.loader == "dataloader" and base.num_workers == 0:
        workers = min(usable_cpu_count(), 8 if device.type == "cuda" else 2)  # affinity-aware, not the host's
        safe, why = (True, "") if isinstance(dataset, ImageSet) else spawn_safety(dataset[0])
        if safe or worker_start_method() == "fork":
            tried["DataLoader workers"] = dict(num_workers=workers, persistent_workers=True,
                                               pin_memory=device.type == "cuda")
        else:
            skipped["DataLoader workers"] = why
    tried["channels_last"] = dict(channels_last=True)
    images = dataset if isinstance(dataset, ImageSet) else None
    if images is None:
        try:
            images = to_imageset(*dataset, max_mb=max_mb)
        except ValueError as e:
            skipped["device-resident loader"] = str(e)
    if images is not None and base.loader != "device":
        tried["device-resident loader"] = dict(loader="device", num_workers=0, pin_memory=False, non_blocking=False,
                                               persistent_workers=False, prefetch_factor=None)
    if device.type == "cuda":
        amp = "bf16" if bf16_supported(device) else "fp16"
        tried[f"{amp} autocast"] = dict(amp=amp)
    else:
        skipped["mixed precision"] = (f"tried here only on a CUDA GPU (tensor cores); this machine runs on "
                                      f"{device.type}: see the ladder in 09 for what autocast does here")
    return tried, skipped, images


def first_steps(base: TrainConfig, *, model: ModelArg, dataset: DatasetArg, progress: bool = True,
                max_mb: float = 2048.0) -> list[RunResult]:
    """[your model and data as they are, then each of `candidates` alone on top]; extras["technique"] names each."""
    if not (isinstance(dataset, ImageSet) or (isinstance(dataset, tuple) and len(dataset) == 2)):
        raise ValueError(f"dataset={type(dataset).__name__} is not allowed: a fastlab.ImageSet or a pair "
                         "(train, held_out) of torch Datasets")
    build = _builder(model)
    if not isinstance(dataset, ImageSet):
        base, switched = for_datasets(base)
        if switched:
            print(f"first_steps: {switched}", flush=True)
    tried, skipped, images = candidates(base, dataset, max_mb)
    plan = [("your model as is", "baseline", base, dataset)] + [
        (f"+ {name}", name, base.replace(**changes), images if changes.get("loader") == "device" else dataset)
        for name, changes in tried.items()]
    results: list[RunResult] = []
    overhead = budget.RUN_OVERHEAD_SECONDS  # a run's wall time beyond its training: measured after each run
    with budget.held(NAME):  # in notebook 10
        for i, (label, technique, cfg, data) in enumerate(plan):
            left = len(plan) - i
            cut = budget.max_seconds_within(NAME, left, left * overhead, cfg.max_seconds)
            started = time.monotonic()
            r = run(cfg if cut is None else cfg.replace(max_seconds=cut), label=label, model=build, dataset=data,
                    progress=progress)
            if r.step_seconds:
                overhead = max(overhead, time.monotonic() - started - r.warmup_seconds - r.timed_seconds)
            r.extras["technique"] = technique
            results.append(r)
            if r.status == "interrupted":
                break
            if i == 0 and cut is not None and r.step_seconds and not r.window_throughput and len(plan) > 1:
                print(f"first_steps: your model as is finished no timed window in the {cut:g} s its share of the "
                      f"notebook's budget left it, so the {len(plan) - 1} techniques are not started: they would have "
                      "nothing to be compared with (run the notebook's first cell again for a new budget, or on a "
                      "quieter machine)", flush=True)
                break
    results[0].extras["skipped_techniques"] = skipped
    return results


@comparison(NAME)
def first_steps_demo(base: TrainConfig, progress: bool = True) -> list[RunResult]:
    """first_steps on the notebook's demo: MobileNetV3-Small on the StripesDataset (SYNTHETIC)."""
    return first_steps(base, model=demo_model, dataset=demo_datasets(base), progress=progress)


def advice(results: list[RunResult]) -> list[str]:
    """first_steps' techniques as numbered advice, from their verdicts against your model as is: gains (largest
    first), no difference, losses, then what was not measured or not tried. What the baseline run itself points at
    (a data wall, per-op overhead) is fastlab.advise(results[0])'s to say: the notebook prints both."""
    if not results or not results[0].window_throughput:
        return ["The baseline did not finish a timed window: fix that first (see its status and error)."]
    base, out, ranked, unmeasured = results[0], [], [], []
    if not base.ok and base.status in CREDITED:
        out.append(f"The baseline ended {base.status} ({base.error}): its figures rest on {len(base.window_throughput)} "
                   "timed window(s), so read the verdicts below as rough; raise max_seconds for firmer ones.")
    elsewhere = "" if base.env.get("device_type") == "cuda" else " (it may still pay on a GPU)"
    said_as = {"better": (0, "try it first"), "noise": (1, f"no measurable difference here{elsewhere}"),
               "worse": (2, "slower here: leave it off on this machine")}
    for r in results[1:]:
        name = r.extras.get("technique", r.label)
        said = runs_verdict(base, r)
        if r.status == "failed":
            ranked.append((2, 0.0, f"{name}: failed here ({r.error}); leave it off"))
        elif not said.comparable:  # diverged, stopped, or no timed window: no speed is credited
            longer = "" if r.window_throughput else "; rerun with a larger max_seconds"
            unmeasured.append(f"{name}: no verdict: {said.reason}{longer}")
        else:
            group, words = (1, "could not tell here") if said.single_pair else said_as[said.direction]
            ranked.append((group, said.ratio, f"{name}: {words} ({said})"))
    out += [text for _, _, text in sorted(ranked, key=lambda t: (t[0], -t[1]))] + unmeasured
    out += [f"{name}: not tried here: {why}" for name, why in base.extras.get("skipped_techniques", {}).items()]
    if any(group == 0 for group, _, _ in ranked):
        out.append("Then stack the ones that paid and measure the stack (notebook 09): effects do not simply "
                   "multiply.")
    return [f"{i}. {line}" for i, line in enumerate(out, 1)]


# ---------------------------------------------------------------- your own loop, watched

def loop_dataset(config: TrainConfig, seed: int = 0) -> StripesDataset:
    """Exactly enough StripesDataset images for the profile's loop_steps batches of config.batch_size (one epoch):
    enough for a warm-up and several timed windows of 5."""
    return StripesDataset(config.batch_size * profile_of(config).loop_steps, "train", seed)

