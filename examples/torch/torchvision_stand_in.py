"""What the peer examples take from torchvision, in small synthetic form: torchvision is not installed here.

The four programs of this folder came from Horovod and BytePS (see each file's header). They
import ``datasets`` and ``transforms`` (the MNIST trainers) or ``models`` (the synthetic
benchmarks) from torchvision; their import line names this module instead, and nothing else
of theirs changes:

* ``datasets.MNIST(root, train=, download=, transform=)`` — 28x28 one-channel images of ten
  classes, drawn once from a fixed seed (its own generator: the program's ``torch.manual_seed``
  sequence is left as it is). Each class is a random prototype plus noise, so a model learns.
  Nothing is downloaded or written; ``root`` is ignored. Small: :data:`TRAIN_SIZE` and
  :data:`TEST_SIZE` images.
* ``transforms.Compose``, ``ToTensor``, ``Normalize`` — torchvision's semantics for these images.
* ``models.<name>(num_classes=1000)`` — :data:`MODELS`: small CNNs for the benchmarks' 3x224x224
  fake images, with batch norm so that ``broadcast_parameters(model.state_dict())`` carries
  buffers as a ResNet's does. A torchvision name (``resnet50``) raises, naming these.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

TRAIN_SIZE = 256
TEST_SIZE = 128
_SEED = 20260620


class MNIST(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """torchvision's ``MNIST`` signature; synthetic images (uint8, 28x28) and int labels."""

    def __init__(self, root: str, train: bool = True, transform: Callable[[Any], Any] | None = None,
                 target_transform: Callable[[Any], Any] | None = None, download: bool = False) -> None:
        gen = torch.Generator().manual_seed(_SEED)
        prototypes = torch.rand(10, 28, 28, generator=gen) * 255
        if not train:
            gen.manual_seed(_SEED + 1)
        n = TRAIN_SIZE if train else TEST_SIZE
        self.targets = torch.randint(0, 10, (n,), generator=gen)
        noise = torch.randn(n, 28, 28, generator=gen) * 40
        self.data = (prototypes[self.targets] + noise).clamp(0, 255).to(torch.uint8)
        self.root, self.train = root, train
        self.transform, self.target_transform = transform, target_transform

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        image: Any = self.data[index]
        target: Any = int(self.targets[index])
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target


class Compose:
    """Applies the transforms in order."""

    def __init__(self, transforms: Sequence[Callable[[Any], Any]]) -> None:
        self.transforms = list(transforms)

    def __call__(self, x: Any) -> Any:
        for t in self.transforms:
            x = t(x)
        return x


class ToTensor:
    """A uint8 HxW image to a float 1xHxW tensor in [0, 1], as torchvision's for a grey image."""

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        return image.unsqueeze(0).float().div(255)


class Normalize:
    """``(x - mean) / std`` per channel."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


def small_cnn(num_classes: int = 1000) -> nn.Module:
    """Two strided convolutions with batch norm, global pooling and a linear head (~20k parameters)."""
    return nn.Sequential(
        nn.Conv2d(3, 8, kernel_size=7, stride=4, padding=3, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, kernel_size=3, stride=2, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, num_classes))


def tiny_mlp(num_classes: int = 1000) -> nn.Module:
    """A pooled image through two linear layers: the cheapest model, for quick runs."""
    return nn.Sequential(nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(48, 32), nn.ReLU(),
                         nn.Linear(32, num_classes))


MODELS = {"small_cnn": small_cnn, "tiny_mlp": tiny_mlp}


class _Models(types.SimpleNamespace):
    def __getattr__(self, name: str) -> Any:  # only called for names it does not have
        raise AttributeError(f"torchvision's model {name!r} is not available here (torchvision is not installed); "
                             f"pass --model with one of {sorted(MODELS)}")


datasets = types.SimpleNamespace(MNIST=MNIST)
transforms = types.SimpleNamespace(Compose=Compose, ToTensor=ToTensor, Normalize=Normalize)
models = _Models(**MODELS)
