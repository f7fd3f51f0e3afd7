import pickle
from collections import Counter

import numpy as np
import pytest
import torch

from fastlab.data import (
    CIFAR_FOLDER,
    DatasetError,
    DeviceLoader,
    load_images,
    make_dataloader,
    make_synthetic,
    read_cifar10,
)


def test_synthetic_is_deterministic_cifar_shaped_and_balanced():
    x1, y1 = make_synthetic(200, "train")
    x2, y2 = make_synthetic(200, "train")
    assert x1.shape == (200, 32, 32, 3) and x1.dtype == np.uint8 and y1.dtype == np.int64
    assert np.array_equal(x1, x2) and np.array_equal(y1, y2)
    assert set(Counter(y1.tolist()).values()) == {20}
    ex, _ = make_synthetic(200, "eval")
    assert not np.array_equal(ex, x1)
    assert 20 < x1.std() < 120  # real pixel spread, not a flat or saturated image


def test_loaded_synthetic_is_labelled_synthetic():
    images = load_images("synthetic", 100, 50)
    assert images.synthetic and images.name == "synthetic"
    assert "SYNTHETIC" in images.describe()


def _batches(loader, n):
    out = []
    for batch in loader:
        out.append(batch)
        if len(out) == n:
            break
    return out


def test_device_loader_matches_the_dataloader_path():
    x, y = make_synthetic(256, "train")
    dl = make_dataloader(x, y, batch_size=32, train=True)
    dev = DeviceLoader(x, y, batch_size=32, train=True)
    assert len(dl) == len(dev) == 8
    a, b = _batches(dl, 8), _batches(dev, 8)
    for (xa, ya), (xb, yb) in zip(a, b):
        assert xa.shape == xb.shape == (32, 3, 32, 32)
        assert xa.dtype == xb.dtype == torch.float32
        assert ya.dtype == yb.dtype == torch.int64 and ya.shape == yb.shape
    # one epoch of each covers the same labels
    assert Counter(torch.cat([t[1] for t in a]).tolist()) == Counter(torch.cat([t[1] for t in b]).tolist())
    # same normalisation: similar statistics over the epoch
    xa, xb = torch.cat([t[0] for t in a]), torch.cat([t[0] for t in b])
    assert abs(xa.mean() - xb.mean()) < 0.05 and abs(xa.std() - xb.std()) < 0.05


def test_eval_batches_are_identical_on_both_paths():
    x, y = make_synthetic(64, "eval")
    (xa, ya), = _batches(make_dataloader(x, y, batch_size=64, train=False), 1)
    (xb, yb), = _batches(DeviceLoader(x, y, batch_size=64, train=False), 1)
    assert torch.equal(ya, yb)
    assert torch.allclose(xa, xb, atol=1e-5)


def test_device_augmentation_crops_and_flips():
    # every pixel nonzero, brightness rising left to right: zeros reveal a shifted crop, falling rows a flip
    cols = np.arange(32, dtype=np.uint8) * 7 + 10
    x = np.broadcast_to(cols[None, None, :, None], (64, 32, 32, 3)).copy()
    loader = DeviceLoader(x, np.zeros(64, dtype=np.int64), batch_size=64, train=True, seed=3)
    aug = loader._augment(loader.images)
    assert aug.shape == (64, 3, 32, 32) and aug.dtype == torch.uint8
    shifted = (aug == 0).flatten(1).any(dim=1).float().mean()
    assert shifted > 0.8  # only the (4, 4) offset of 81 leaves no padding in view
    row = aug[:, 0, 16, 8:24].int()
    flipped = (row[:, 1:] <= row[:, :-1]).all(dim=1).float().mean()
    assert 0.2 < flipped < 0.8


def test_dataloader_workers_work_under_spawn():
    x, y = make_synthetic(64, "train")
    loader = make_dataloader(x, y, batch_size=16, train=True, num_workers=2, multiprocessing_context="spawn")
    batches = list(loader)
    assert len(batches) == 4 and batches[0][0].shape == (16, 3, 32, 32)


def write_tiny_cifar(root, per_batch=20):
    """A CIFAR-10 folder in torchvision's on-disk layout, made here (no download)."""
    folder = root / CIFAR_FOLDER
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        entry = {"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
                 "labels": list(rng.integers(0, 10, per_batch)), "batch_label": name}
        with open(folder / name, "wb") as f:
            pickle.dump(entry, f)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [str(i) for i in range(10)]}, f)
    return folder


def test_reads_cifar10_from_torchvisions_layout(tmp_path):
    write_tiny_cifar(tmp_path)
    tx, ty, ex, ey = read_cifar10(tmp_path)
    assert tx.shape == (100, 32, 32, 3) and ex.shape == (20, 32, 32, 3) and ty.dtype == np.int64
    images = load_images("cifar10", 50, 10, root=str(tmp_path))
    assert images.name == "cifar10" and not images.synthetic and len(images.train_labels) == 50
    auto = load_images("auto", 50, 10, root=str(tmp_path))
    assert auto.name == "cifar10"


def test_missing_dataset_names_the_folder_and_the_fix(tmp_path):
    with pytest.raises(DatasetError) as err:
        load_images("cifar10", 10, 10, allow_download=False, root=str(tmp_path / "nowhere"))
    assert str(tmp_path / "nowhere") in str(err.value) and "FASTLAB_DATA=synthetic" in str(err.value)


def test_corrupt_dataset_names_the_file_and_the_fix(tmp_path):
    folder = write_tiny_cifar(tmp_path)
    (folder / "data_batch_3").write_bytes(b"not a pickle")
    with pytest.raises(DatasetError, match=r"corrupt: data_batch_3 .*Fix: delete"):
        read_cifar10(tmp_path)
    (folder / "data_batch_3").unlink()
    with pytest.raises(DatasetError, match="incomplete: data_batch_3 is missing"):
        read_cifar10(tmp_path)


def test_auto_falls_back_to_synthetic_with_one_notice_when_offline(tmp_path, monkeypatch, capsys):
    import torchvision

    def offline(*args, **kwargs):
        raise OSError("network unreachable")

    monkeypatch.setattr(torchvision.datasets, "CIFAR10", offline)
    images = load_images("auto", 40, 20, root=str(tmp_path))
    assert images.synthetic
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "SYNTHETIC" in err and "network unreachable" in err
    tries = []
    monkeypatch.setattr(torchvision.datasets, "CIFAR10", lambda *a, **k: tries.append(1) or offline())
    again = load_images("auto", 48, 24, root=str(tmp_path))  # another size: a new load, no new try or notice
    assert again.synthetic and len(again.train_labels) == 48 and tries == [] and capsys.readouterr().err == ""
    with pytest.raises(DatasetError, match="could not download"):
        load_images("cifar10", 40, 20, root=str(tmp_path / "other"))
