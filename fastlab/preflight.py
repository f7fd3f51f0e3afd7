"""Before any timing, check that the reader's own model and data fit together (fastlab.run(model=, dataset=)): a
one-sentence ValueError naming the problem and the fix, not a raw torch error mid-run. The model is left as it was."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from .config import TrainConfig
from .data import ImageSet, spawn_safety, worker_start_method
from .measure import is_out_of_memory

IMAGESET_SHAPE = (32, 32, 3)  # what fastlab's loaders crop and normalise (CIFAR's HxWxC layout)


def preflight(model: nn.Module | Callable[[], nn.Module], dataset_or_images: ImageSet | tuple[Dataset, Dataset],
              config: TrainConfig) -> None:
    """Raise ValueError (one sentence: the problem and the fix) if `model` cannot train on `dataset_or_images`."""
    if isinstance(dataset_or_images, ImageSet):
        images, labels = _imageset_batch(dataset_or_images, config)
    elif isinstance(dataset_or_images, tuple) and len(dataset_or_images) == 2:
        images, labels = _datasets_batch(dataset_or_images, config)
    else:
        raise ValueError(f"dataset={type(dataset_or_images).__name__} is not allowed: pass a fastlab.ImageSet or a "
                         f"pair (train, held_out) of map-style torch Datasets")
    net = model() if callable(model) and not isinstance(model, nn.Module) else model
    if not isinstance(net, nn.Module):
        raise ValueError(f"model={type(net).__name__} is not a torch nn.Module: pass a module or a function that "
                         f"returns one")
    classes = _output_classes(net, images)
    bad = [(where, int(y)) for where, y in labels if not 0 <= int(y) < classes]
    if bad:
        high = max(y for _, y in bad)  # the worst: the highest over the outputs, else the lowest below 0
        where, label = next(b for b in bad if b[1] == (high if high >= classes else min(y for _, y in bad)))
        more = f" ({len(bad) - 1} more of the sampled labels too)" if len(bad) > 1 else ""
        raise ValueError(f"{where} has label {label}, outside the model's {classes} outputs (labels must be "
                         f"0..{classes - 1}){more}: give the model's last layer as many outputs as the dataset has "
                         f"classes, or remap the labels")


def _imageset_batch(images: ImageSet, config: TrainConfig) -> tuple[torch.Tensor, list[int]]:
    """Two training images as the loaders give them (float NCHW), and every label of the set."""
    for part in ("train_images", "eval_images"):
        arr = getattr(images, part)
        if arr.ndim != 4 or tuple(arr.shape[1:]) != IMAGESET_SHAPE or arr.dtype != np.uint8:
            raise ValueError(f"ImageSet.{part} has shape {tuple(arr.shape)} and dtype {arr.dtype}, but fastlab's "
                             f"loaders take uint8 images of shape (N, 32, 32, 3): resize them to 32x32 RGB, or pass "
                             f"a pair of torch Datasets for other sizes")
    if len(images.train_labels) < config.batch_size:
        raise ValueError(f"the training set has {len(images.train_labels)} images, fewer than one batch of "
                         f"batch_size={config.batch_size}: lower batch_size or add images")
    for part in ("train_labels", "eval_labels"):
        arr = np.asarray(getattr(images, part))
        if not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"ImageSet.{part} has dtype {arr.dtype}, not integer class indices: give the labels as "
                             f"int64 (0..classes-1)")
    batch = torch.from_numpy(np.ascontiguousarray(images.train_images[:2])).permute(0, 3, 1, 2).float() / 255
    labels = []
    for part in ("train_labels", "eval_labels"):
        arr = np.asarray(getattr(images, part))
        for y in np.unique(arr):  # every label of the set: the first item holding each named
            labels.append((f"item {int(np.argmax(arr == y))} of ImageSet.{part}", int(y)))
    return batch, labels


SAMPLED_ITEMS = 64  # items of each Dataset checked before timing: every one of a small set, else spread evenly


def sampled_indices(n: int, most: int = SAMPLED_ITEMS) -> list[int]:
    """The items checked of a Dataset of n: all when n <= most, else `most` spread evenly, the first two and the
    last among them. A sample, not the whole set: a large Dataset's __getitem__ may read from disk."""
    if n <= most:
        return list(range(n))
    return sorted({0, 1, n - 1} | {round(i * (n - 1) / (most - 1)) for i in range(most)})


def _datasets_batch(pair: tuple[Dataset, Dataset], config: TrainConfig
                    ) -> tuple[torch.Tensor, list[tuple[str, int]]]:
    """A sample of each Dataset's items fetched in this process (sampled_indices), checked for integer labels and
    one image shape (each problem named by its item); two training images stacked into a batch."""
    images: list[torch.Tensor] = []
    labels: list[tuple[str, int]] = []
    first: tuple[int, torch.Size] | None = None
    for name, ds in zip(("train", "held_out"), pair):
        try:
            n = len(ds)
        except TypeError as e:
            raise ValueError(f"the {name} dataset has no length ({e}): fastlab needs map-style Datasets with "
                             f"__len__ and __getitem__") from None
        if n == 0:
            raise ValueError(f"the {name} dataset is empty: give it at least one image")
        if name == "train" and n < config.batch_size:
            raise ValueError(f"the train dataset has {n} images, fewer than one batch of "
                             f"batch_size={config.batch_size}: lower batch_size or add images")
        for index in sampled_indices(n):
            image, label = _fetch(ds, name, index)
            labels.append((f"item {index} of the {name} dataset", label))
            if first is None:
                first = (index, image.shape)
            elif image.shape != first[1]:
                raise ValueError(f"item {index} of the {name} dataset has an image of shape {tuple(image.shape)}, "
                                 f"item {first[0]} of the train dataset {tuple(first[1])}: a batch needs one shape, "
                                 f"so resize or crop every image to the same size in the Dataset")
            if name == "train" and len(images) < 2:
                images.append(image)
        _check_workers(ds, name, config)
    return torch.stack(images[:2]).float(), labels


def _fetch(ds: Dataset, name: str, index: int) -> tuple[torch.Tensor, int]:
    try:
        item = ds[index]
    except Exception as e:  # any error of the user's code: name it, with the index
        raise ValueError(f"the {name} dataset raised {type(e).__name__} when item {index} was fetched ({e}): fix "
                         f"its __getitem__ (try {type(ds).__name__}()[{index}] directly)") from e
    if not (isinstance(item, (tuple, list)) and len(item) == 2):
        raise ValueError(f"item {index} of the {name} dataset is a {type(item).__name__}, not an (image, label) "
                         f"pair: make __getitem__ return (image tensor, int label)")
    image, label = item
    if isinstance(label, torch.Tensor) and label.numel() == 1 and not label.is_floating_point():
        label = label.item()
    if isinstance(label, (bool, np.bool_)) or not isinstance(label, (int, np.integer)):
        raise ValueError(f"item {index} of the {name} dataset has label {label!r} ({type(label).__name__}), not an "
                         f"integer class index: return an int (0..classes-1) as the label (the loss needs int64)")
    if not isinstance(image, torch.Tensor):
        raise ValueError(f"item {index} of the {name} dataset holds a {type(image).__name__} image, not a tensor: "
                         f"add torchvision.transforms.ToTensor() (or return a float tensor) in the Dataset")
    return image, int(label)


def _check_workers(ds: Dataset, name: str, config: TrainConfig) -> None:
    """DataLoader workers started with spawn (macOS, Windows) must rebuild the Dataset from its class name."""
    if config.num_workers == 0 or worker_start_method() == "fork":
        return
    safe, why = spawn_safety(ds)
    if not safe:
        raise ValueError(f"the {name} dataset cannot be rebuilt in a DataLoader worker: {why}")


def _output_classes(net: nn.Module, images: torch.Tensor) -> int:
    """Run a batch of 2 under no_grad on the model's own device, in eval mode (restored after): its class count."""
    param = next(iter(net.parameters()), None)
    device = param.device if param is not None else torch.device("cpu")
    was_training = net.training
    net.eval()  # BatchNorm's running statistics must not learn from the probe
    try:
        with torch.no_grad():
            out = net(images.to(device))
    except Exception as e:  # shape mismatches come as RuntimeError, ValueError, IndexError...
        if is_out_of_memory(e):
            raise  # not a wrong input: the run reports it as out of memory
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"the model cannot take images of shape {tuple(images.shape[1:])} (a batch of 2 failed: "
                         f"{first}): change the model's input layer (channels, or the size its flatten/linear "
                         f"layer expects) or resize the images") from e
    finally:
        net.train(was_training)
    if not isinstance(out, torch.Tensor) or out.ndim != 2 or out.shape[0] != len(images):
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"the model returned {shape} for a batch of {len(images)}, not (batch, classes) logits: "
                         f"make forward() return one row of class scores per image")
    return int(out.shape[1])
