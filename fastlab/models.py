"""The CNNs the workbook trains: ResNet-18 for CIFAR, a compact fast net, and a tiny smoke-test net."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

NUM_CLASSES = 10


def resnet18_cifar(num_classes: int = NUM_CLASSES) -> nn.Module:
    """torchvision's ResNet-18 with the CIFAR stem: a 3x3 stride-1 first conv and no max-pool."""
    import torchvision

    net = torchvision.models.resnet18(num_classes=num_classes)
    net.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    net.maxpool = nn.Identity()
    return net


def _conv_bn(c_in: int, c_out: int, bn_momentum: float) -> list[nn.Module]:
    return [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out, momentum=bn_momentum), nn.GELU()]


# BatchNorm's running statistics as airbench keeps them, in our own two nets: with PyTorch's default 0.1 the running
# averages trail a fast-learning net, so held-out accuracy (eval mode) would measure them catching up.
BN_MOMENTUM = 0.4


class CompactNet(nn.Module):
    """The shape the CIFAR-10 speed records use (airbench): a 2x2 stem conv, then three groups
    (widths 64/256/256) of conv-pool-BN-GELU-conv-BN-GELU, a global max-pool and a linear head."""

    def __init__(self, widths: tuple[int, int, int] = (64, 256, 256), num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        stem = 24
        layers: list[nn.Module] = [nn.Conv2d(3, stem, kernel_size=2, padding=0), nn.GELU()]
        c_in = stem
        for width in widths:
            layers += [nn.Conv2d(c_in, width, 3, padding=1, bias=False), nn.MaxPool2d(2),
                       nn.BatchNorm2d(width, momentum=BN_MOMENTUM), nn.GELU(),
                       *_conv_bn(width, width, BN_MOMENTUM)]
            c_in = width
        # every workbook net is head(features(x)): a loop over its blocks (checkpointing, notebook 12) needs no more
        self.features = nn.Sequential(*layers, nn.AdaptiveMaxPool2d(1), nn.Flatten())
        self.head = nn.Linear(c_in, num_classes, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class TinyNet(nn.Module):
    """Two small conv blocks and a linear head: trains in seconds on a CPU, for smoke runs."""

    def __init__(self, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        self.features = nn.Sequential(*_conv_bn(3, 16, BN_MOMENTUM), nn.MaxPool2d(2), *_conv_bn(16, 32, BN_MOMENTUM),
                                      nn.MaxPool2d(2), *_conv_bn(32, 32, BN_MOMENTUM), nn.AdaptiveAvgPool2d(1),
                                      nn.Flatten())
        self.head = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


MODELS: dict[str, Callable[[], nn.Module]] = {"tiny": TinyNet, "compact": CompactNet, "resnet18": resnet18_cifar}


def build_model(name: str) -> nn.Module:
    if name not in MODELS:
        raise ValueError(f"model={name!r} is not allowed: choose one of {', '.join(repr(m) for m in MODELS)}")
    return MODELS[name]()


ModelArg = nn.Module | Callable[[], nn.Module] | None  # a module, or a function that builds one


def blocks_and_head(net: nn.Module) -> tuple[list[nn.Module], nn.Module]:
    """net's forward as blocks run one after another, then its head: the pieces a loop checkpoints one by one.

    The net's children in order: a Sequential opened into its blocks (a workbook net's `features`, a ResNet's stages),
    other children side by side kept as one block (a ResNet's stem, whose in-place ReLU must be recomputed with the
    layers before it), the last child the head, with a flatten before it (the one line of ResNet's forward that is
    no child; a no-op on a flat input). A net whose forward does more than call its children in order needs its own
    list: check that head applied after the blocks gives net(x).
    """
    *body, head = net.children()
    blocks: list[nn.Module] = []
    loose: list[nn.Module] = []  # children side by side that are no Sequential: one block
    for child in body:
        if isinstance(child, nn.Sequential):
            blocks += [nn.Sequential(*loose)] if loose else []
            blocks += list(child)
            loose = []
        else:
            loose.append(child)
    blocks += [nn.Sequential(*loose)] if loose else []
    return blocks + [nn.Flatten()], head
