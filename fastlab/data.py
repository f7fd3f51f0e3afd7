"""Data: CIFAR-10 from torchvision's on-disk layout, an offline synthetic set of the same shape,
and the two ways of feeding a model (DataLoader with per-image transforms, or device-resident batches).
Every class is importable from here, so spawned DataLoader workers can unpickle them.
"""

from __future__ import annotations

import functools
import itertools
import os
import pickle
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from .profiles import profile_of

if TYPE_CHECKING:
    from .config import TrainConfig

# Per-channel statistics of the CIFAR-10 training set, used for the synthetic set too
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)
NUM_CLASSES = 10
SYNTHETIC_SEED = 1234  # the synthetic set is the same for every run seed
CIFAR_FOLDER = "cifar-10-batches-py"
DOWNLOAD_TIMEOUT_S = 15.0


class DatasetError(RuntimeError):
    """A dataset that is missing or unreadable; the message names the folder and the fix."""


@dataclass(frozen=True)
class ImageSet:
    """Images as uint8 HxWxC (CIFAR's own layout) with int64 labels, plus where they came from."""

    train_images: np.ndarray
    train_labels: np.ndarray
    eval_images: np.ndarray
    eval_labels: np.ndarray
    name: str  # "cifar10" or "synthetic"
    source: str  # a folder, or how the synthetic set was made

    @property
    def synthetic(self) -> bool:
        return self.name == "synthetic"

    def describe(self) -> str:
        kind = "SYNTHETIC data" if self.synthetic else "real CIFAR-10"
        return f"{kind}: {len(self.train_labels)} train / {len(self.eval_labels)} held-out images ({self.source})"


# ---------------------------------------------------------------- synthetic

def make_synthetic(n: int, split: str = "train", seed: int = SYNTHETIC_SEED, noise: float = 1.0,
                   signal: float = 0.25) -> tuple[np.ndarray, np.ndarray]:
    """A CIFAR-shaped (32x32x3 uint8, 10 classes) set that a CNN can learn, but not at a glance.

    Each class owns a smooth random colour pattern. An image is its class pattern, shifted and
    rescaled at random, blended with a weaker pattern of another class, on a smooth random
    background, plus pixel noise. Class identity survives only as a spatial/colour structure that
    convolutions must find through the shifts, the distractor and the noise.
    """
    gen = torch.Generator().manual_seed(seed)
    # Class patterns come from the seed alone, so train and eval share them.
    low = torch.rand(NUM_CLASSES, 3, 6, 6, generator=gen) * 2 - 1
    protos = torch.nn.functional.interpolate(low, size=40, mode="bicubic", align_corners=False)
    protos = protos / protos.flatten(1).std(dim=1).view(-1, 1, 1, 1)
    split_offset = {"train": 1, "eval": 2}[split]
    gen = torch.Generator().manual_seed(seed * 10 + split_offset)
    labels = torch.arange(n) % NUM_CLASSES
    labels = labels[torch.randperm(n, generator=gen)]
    out = np.empty((n, 32, 32, 3), dtype=np.uint8)
    chunk = 4096
    for start in range(0, n, chunk):
        y = labels[start : start + chunk]
        b = len(y)
        dx, dy = torch.randint(0, 9, (2, b), generator=gen)
        other = (y + torch.randint(1, NUM_CLASSES, (b,), generator=gen)) % NUM_CLASSES
        main = _crop(protos[y], dx, dy)
        distractor = _crop(protos[other], torch.randint(0, 9, (b,), generator=gen), torch.randint(0, 9, (b,), generator=gen))
        bg_low = torch.rand(b, 3, 4, 4, generator=gen) * 2 - 1
        background = torch.nn.functional.interpolate(bg_low, size=32, mode="bilinear", align_corners=False)
        amp = signal + 0.4 * torch.rand(b, 1, 1, 1, generator=gen)
        mix = 0.5 * torch.rand(b, 1, 1, 1, generator=gen)
        img = amp * main + mix * amp * distractor + 0.6 * background + noise * torch.randn(b, 3, 32, 32, generator=gen)
        img = (img * 0.22 + 0.48).clamp(0, 1)
        out[start : start + b] = (img * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    return out, labels.numpy().astype(np.int64)


def _crop(patterns: torch.Tensor, dx: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """A 32x32 window of each 40x40 pattern at offsets (dx, dy)."""
    rows = (dy[:, None] + torch.arange(32))[:, None, :, None]
    cols = (dx[:, None] + torch.arange(32))[:, None, None, :]
    b = torch.arange(len(patterns))[:, None, None, None]
    c = torch.arange(3)[None, :, None, None]
    return patterns[b, c, rows, cols]


# ---------------------------------------------------------------- CIFAR-10 on disk

def data_dir() -> Path:
    """FASTLAB_DATA_DIR, else a per-user cache folder."""
    if os.environ.get("FASTLAB_DATA_DIR"):
        return Path(os.environ["FASTLAB_DATA_DIR"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "fastlab" / "data"


def cifar10_on_disk(root: Path) -> bool:
    return (root / CIFAR_FOLDER).is_dir()


def read_cifar10(root: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Read torchvision's CIFAR-10 layout (root/cifar-10-batches-py/data_batch_1..5, test_batch)."""
    folder = root / CIFAR_FOLDER
    fix = (f"delete {folder} and download again (python -m fastlab download), "
           f"or set FASTLAB_DATA=synthetic to use the offline synthetic set")
    if not folder.is_dir():
        raise DatasetError(f"CIFAR-10 not found: {folder} does not exist. Fix: run `python -m fastlab download` "
                           f"while online, point FASTLAB_DATA_DIR at a folder holding {CIFAR_FOLDER}/, "
                           f"or set FASTLAB_DATA=synthetic")

    def read(names: list[str]) -> tuple[np.ndarray, np.ndarray]:
        images, labels = [], []
        for name in names:
            path = folder / name
            if not path.is_file():
                raise DatasetError(f"CIFAR-10 at {folder} is incomplete: {name} is missing. Fix: {fix}")
            try:
                with open(path, "rb") as f:
                    entry = pickle.load(f, encoding="latin1")
                data = np.asarray(entry["data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
                lab = np.asarray(entry["labels"], dtype=np.int64)
            except Exception as e:  # any unreadable batch file means the same thing to the reader
                raise DatasetError(f"CIFAR-10 at {folder} is corrupt: {name} cannot be read ({type(e).__name__}: {e}). "
                                   f"Fix: {fix}") from e
            if len(lab) != len(data) or (len(lab) and (lab.min() < 0 or lab.max() >= NUM_CLASSES)):
                raise DatasetError(f"CIFAR-10 at {folder} is corrupt: {name} has bad labels. Fix: {fix}")
            images.append(data.transpose(0, 2, 3, 1))
            labels.append(lab)
        return np.concatenate(images), np.concatenate(labels)

    return (*read([f"data_batch_{i}" for i in range(1, 6)]), *read(["test_batch"]))


# A failed download is tried once per process: offline, every later run would wait out the timeout again.
_download_failures: dict[str, str] = {}
_said_synthetic: set[str] = set()  # folders whose fallback to the synthetic set was already said


def download_cifar10(root: Path, timeout_s: float = DOWNLOAD_TIMEOUT_S) -> None:
    """Download CIFAR-10 with torchvision into root; raises DatasetError when offline (at once, after one try)."""
    import torchvision

    if str(root) in _download_failures:
        raise DatasetError(_download_failures[str(root)])
    root.mkdir(parents=True, exist_ok=True)
    old = socket.getdefaulttimeout()
    socket.setdefaulttimeout(timeout_s)
    try:
        torchvision.datasets.CIFAR10(str(root), train=True, download=True)
    except Exception as e:  # network errors come in many types; all mean "not downloaded"
        message = (f"could not download CIFAR-10 into {root} ({type(e).__name__}: {e}). "
                   f"Fix: go online and run `python -m fastlab download`, or set FASTLAB_DATA=synthetic")
        _download_failures[str(root)] = message
        raise DatasetError(message) from e
    finally:
        socket.setdefaulttimeout(old)


@functools.lru_cache(maxsize=4)
def load_images(dataset: str, train_images: int, eval_images: int, allow_download: bool = True,
                root: str | None = None) -> ImageSet:
    """The images for a run. dataset is "cifar10", "synthetic" or "auto" (see the README)."""
    folder = Path(root) if root else data_dir()
    if dataset == "auto":
        dataset = "cifar10" if cifar10_on_disk(folder) else "synthetic"
        if dataset == "synthetic" and allow_download:
            try:
                download_cifar10(folder)
                dataset = "cifar10"
            except DatasetError as e:
                if str(folder) not in _said_synthetic:  # said once per process, not at every load
                    _said_synthetic.add(str(folder))
                    print(f"fastlab: CIFAR-10 unavailable ({e}); using the SYNTHETIC set instead (every result "
                          "records which set it used).", file=sys.stderr)
    if dataset == "cifar10":
        if not cifar10_on_disk(folder) and allow_download:
            download_cifar10(folder)
        tx, ty, ex, ey = read_cifar10(folder)
        return ImageSet(tx[:train_images], ty[:train_images], ex[:eval_images], ey[:eval_images],
                        "cifar10", str(folder / CIFAR_FOLDER))
    if dataset == "synthetic":
        tx, ty = make_synthetic(train_images, "train")
        ex, ey = make_synthetic(eval_images, "eval")
        return ImageSet(tx, ty, ex, ey, "synthetic", f"generated offline from seed {SYNTHETIC_SEED}")
    raise ValueError(f"dataset={dataset!r} is not allowed: choose one of 'auto', 'cifar10', 'synthetic'")


# ---------------------------------------------------------------- DataLoader path

def image_transform(train: bool):
    """The classic per-image torchvision pipeline (PIL in, normalised float tensor out)."""
    from torchvision import transforms as T

    steps = [T.RandomCrop(32, padding=4), T.RandomHorizontalFlip()] if train else []
    return T.Compose(steps + [T.ToTensor(), T.Normalize(CIFAR_MEAN, CIFAR_STD)])


class CifarLikeDataset(Dataset):
    """uint8 HxWxC images with labels, transformed one image at a time like torchvision's CIFAR10."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, train: bool = True) -> None:
        self.images = images
        self.labels = labels
        self.train = train
        self.transform = image_transform(train)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        return self.transform(Image.fromarray(self.images[index])), int(self.labels[index])


def make_dataloader(images: np.ndarray, labels: np.ndarray, *, batch_size: int, train: bool, num_workers: int = 0,
                    pin_memory: bool = False, persistent_workers: bool = False, prefetch_factor: int | None = None,
                    seed: int = 0, multiprocessing_context: str | None = None) -> DataLoader:
    """A DataLoader over uint8 images with the classic per-image transforms: shuffled, full batches when training."""
    workers = num_workers > 0
    return DataLoader(CifarLikeDataset(images, labels, train), batch_size=batch_size, shuffle=train, drop_last=train,
                      num_workers=num_workers, pin_memory=pin_memory, persistent_workers=persistent_workers and workers,
                      prefetch_factor=prefetch_factor if workers else None,
                      multiprocessing_context=multiprocessing_context if workers else None,
                      generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- device-resident path

class DeviceLoader:
    """The whole uint8 set on the device; each batch is cropped, flipped and normalised as tensor ops.

    Yields the same shapes and dtypes as the DataLoader path: float32 (B,3,32,32) and int64 (B,).
    No worker processes, no per-image Python, no host-to-device copy per batch.
    """

    def __init__(self, images: np.ndarray, labels: np.ndarray, *, batch_size: int, train: bool,
                 device: torch.device | str = "cpu", seed: int = 0, channels_last: bool = False) -> None:
        self.device = torch.device(device)
        self.images = torch.from_numpy(np.ascontiguousarray(images)).to(self.device).permute(0, 3, 1, 2).contiguous()
        self.labels = torch.from_numpy(np.asarray(labels, dtype=np.int64)).to(self.device)
        self.batch_size = batch_size
        self.train = train
        self.channels_last = channels_last
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.mean = torch.tensor(CIFAR_MEAN, device=self.device).view(1, 3, 1, 1) * 255
        self.std = torch.tensor(CIFAR_STD, device=self.device).view(1, 3, 1, 1) * 255

    def __len__(self) -> int:
        n = len(self.labels)
        return n // self.batch_size if self.train else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        n = len(self.labels)
        order = (torch.randperm(n, device=self.device, generator=self.generator) if self.train
                 else torch.arange(n, device=self.device))
        for i in range(len(self)):
            idx = order[i * self.batch_size : (i + 1) * self.batch_size]
            x = self.images[idx]
            if self.train:
                x = self._augment(x)
            x = (x.float() - self.mean) / self.std
            if self.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            yield x, self.labels[idx]

    def _augment(self, x: torch.Tensor) -> torch.Tensor:
        """Random 32x32 crop of the zero-padded 40x40 image, then a random horizontal flip."""
        b = len(x)
        padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
        dx, dy = torch.randint(0, 9, (2, b), device=self.device, generator=self.generator)
        ar = torch.arange(32, device=self.device)
        rows = (dy[:, None] + ar)[:, None, :, None]
        cols = (dx[:, None] + ar)[:, None, None, :]
        x = padded[torch.arange(b, device=self.device)[:, None, None, None],
                   torch.arange(3, device=self.device)[None, :, None, None], rows, cols]
        flip = torch.rand(b, device=self.device, generator=self.generator) < 0.5
        return torch.where(flip[:, None, None, None], x.flip(3), x)


class forever:  # noqa: N801 (used as a function: for batch in forever(loader))
    """Batches from loader, epoch after epoch; a DistributedSampler is told each epoch (a new shuffle per epoch).
    The loader stays an attribute, so fastlab.watch(forever(loader)) still reads the loader's settings."""

    def __init__(self, loader: Any, sampler: Any = None) -> None:
        self.loader, self.sampler = loader, sampler

    def __iter__(self) -> Iterator:
        for epoch in itertools.count():
            if self.sampler is not None:
                self.sampler.set_epoch(epoch)
            empty = True
            for batch in self.loader:
                empty = False
                yield batch
            if empty:
                raise ValueError("the training set is smaller than one batch: lower batch_size or raise train_images")


# ---------------------------------------------------------------- DataLoader workers: how they start, what they can rebuild

def spawn_safety(dataset: Dataset) -> tuple[bool, str]:
    """(whether a DataLoader worker started with spawn, which imports the class by name, can rebuild it, why)."""
    cls = type(dataset)
    where = f"{cls.__module__}.{cls.__qualname__}"
    if cls.__module__ == "__main__":
        return False, (f"{cls.__qualname__} is defined in __main__ (this notebook or script): a worker started "
                       "with spawn cannot import it. Move the class into a .py module and import it from there, "
                       "or use num_workers=0")
    if "<locals>" in cls.__qualname__:
        return False, f"{where} is defined inside a function: pickle cannot find it by name. Define it at module level"
    try:  # pickle finds each class by name, and checks it is the same object
        pickle.dumps(dataset)
    except (pickle.PicklingError, AttributeError, TypeError) as e:
        return False, f"{where} cannot be pickled ({e}); a lambda in a transform, or a class redefined since?"
    return True, f"{where} is importable by name and pickles: workers started with spawn can rebuild it"


def worker_start_method() -> str:
    """How DataLoader workers start here, without fixing the start method as a side effect."""
    import multiprocessing

    if not sys.platform.startswith("linux"):
        default = "spawn"
    else:
        default = "fork" if sys.version_info < (3, 14) else "forkserver"
    return multiprocessing.get_start_method(allow_none=True) or default


Data = ImageSet | tuple[Dataset, Dataset]  # fastlab.run's images, or the reader's own (train, held_out)


def load_data(cfg: TrainConfig, dataset_arg: Data | None, preloaded: ImageSet | None = None
              ) -> tuple[Data, dict[str, Any]]:
    """The run's images (or the caller's Datasets) and the description every result carries. preloaded: cfg's
    images, already loaded by the caller."""
    if isinstance(dataset_arg, tuple):
        train, held_out = dataset_arg
        if cfg.loader == "device":
            raise ValueError("TrainConfig.loader='device' needs the images as arrays: pass a fastlab.ImageSet, "
                             "or use loader='dataloader' with torch Datasets")
        return dataset_arg, {"name": type(train).__name__, "synthetic": bool(getattr(train, "synthetic", False)),
                             "source": "Datasets passed to fastlab.run", "train_images": len(train),
                             "eval_images": len(held_out)}
    images = dataset_arg or preloaded or load_images(cfg.dataset, cfg.train_images, cfg.eval_images,
                                                     allow_download=profile_of(cfg).downloads)
    return images, {"name": images.name, "synthetic": images.synthetic, "source": images.source,
                    "train_images": len(images.train_labels), "eval_images": len(images.eval_labels)}
