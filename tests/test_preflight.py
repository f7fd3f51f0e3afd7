"""fastlab.preflight: the reader's model and data are checked before any timing; each problem is one sentence."""

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

from fastlab.config import config_for
from fastlab.data import ImageSet
from fastlab.preflight import preflight


class Pairs(Dataset):
    """n items of (3xSxS float image, label); `broken` indices raise, as a user's buggy __getitem__ would."""

    def __init__(self, n=8, size=32, labels=None, broken=(), pil=False):
        self.n, self.size, self.labels, self.broken, self.pil = n, size, labels, set(broken), pil

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i in self.broken:
            raise KeyError(f"no file for image {i}")
        label = self.labels[i] if self.labels is not None else i % 10
        if self.pil:
            from PIL import Image

            return Image.new("RGB", (self.size, self.size)), label
        return torch.rand(3, self.size, self.size), label


def net(classes=10, in_features=3 * 32 * 32):
    return nn.Sequential(nn.Flatten(), nn.Linear(in_features, 16), nn.BatchNorm1d(16), nn.Linear(16, classes))


@pytest.fixture
def cfg():
    return config_for("smoke", batch_size=4)


def test_a_model_and_data_that_fit_pass_and_the_model_is_left_as_it_was(cfg):
    model = net()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    preflight(model, (Pairs(), Pairs()), cfg)
    preflight(net, (Pairs(), Pairs()), cfg)  # a function that builds the model works too
    assert model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # BatchNorm stats untouched


def test_an_image_shape_the_model_cannot_take(cfg):
    with pytest.raises(ValueError, match=r"cannot take images of shape \(3, 28, 28\).*resize the images"):
        preflight(net(), (Pairs(size=28), Pairs(size=28)), cfg)


def test_labels_outside_the_outputs(cfg):
    labels = [0, 1, 2, 3, 4, 5, 6, 12]
    with pytest.raises(ValueError, match=r"item 7 of the train dataset has label 12, outside the model's 10 outputs.*remap the labels"):
        preflight(net(), (Pairs(labels=labels), Pairs()), cfg)
    images = ImageSet(np.zeros((8, 32, 32, 3), np.uint8), np.arange(8), np.zeros((4, 32, 32, 3), np.uint8),
                      np.array([0, 1, 2, 9]), "mine", "test")
    with pytest.raises(ValueError, match=r"item \d+ of ImageSet.(train|eval)_labels has label 9, outside the model's 5 outputs"):
        preflight(net(classes=5), images, cfg)


def test_a_dataset_that_raises_is_named_with_the_index(cfg):
    with pytest.raises(ValueError, match=r"held_out dataset raised KeyError when item 7 was fetched .*no file"):
        preflight(net(), (Pairs(), Pairs(broken={7})), cfg)


def test_other_mistakes_are_one_sentence_each(cfg):
    with pytest.raises(ValueError, match="not a tensor: add torchvision.transforms.ToTensor"):
        preflight(net(), (Pairs(pil=True), Pairs()), cfg)
    with pytest.raises(ValueError, match="fewer than one batch of batch_size=16"):
        preflight(net(), (Pairs(n=8), Pairs()), cfg.replace(batch_size=16))
    with pytest.raises(ValueError, match=r"ImageSet.train_images has shape \(8, 28, 28, 3\)"):
        preflight(net(), ImageSet(np.zeros((8, 28, 28, 3), np.uint8), np.zeros(8, np.int64),
                                  np.zeros((2, 32, 32, 3), np.uint8), np.zeros(2, np.int64), "x", "y"), cfg)
    with pytest.raises(ValueError, match="not .batch, classes. logits"):
        preflight(nn.Conv2d(3, 4, 3), (Pairs(), Pairs()), cfg)


def test_an_unpicklable_dataset_is_caught_when_workers_are_spawned(cfg, monkeypatch):
    monkeypatch.setattr("fastlab.preflight.worker_start_method", lambda: "spawn")
    with pytest.raises(ValueError, match="cannot be rebuilt in a DataLoader worker: .*defined inside a function"):
        class Local(Pairs):
            pass

        preflight(net(), (Local(), Pairs()), cfg.replace(num_workers=1))
    preflight(net(), (Pairs(), Pairs()), cfg.replace(num_workers=1))  # a module-level class is fine
