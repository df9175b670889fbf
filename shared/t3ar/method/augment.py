"""Weak t(x) and strong t'(x) views (AdaContrast's recipe) on uint8 image tensors.

Augmentations are drawn from torch's global RNG: seed it (``t3ar.device.seed_everything``) for
reproducible runs on CPU.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torchvision.transforms import v2

View = Callable[[torch.Tensor], torch.Tensor]


def weak_view(size: int) -> View:
    """Random resized crop (scale 0.6-1) and horizontal flip."""
    return v2.Compose([
        v2.RandomResizedCrop(size, scale=(0.6, 1.0), antialias=True),
        v2.RandomHorizontalFlip(),
    ])


def strong_view(size: int) -> View:
    """Random resized crop (0.2-1), flip, colour jitter, grayscale and RandAugment (2 ops, magnitude 9)."""
    return v2.Compose([
        v2.RandomResizedCrop(size, scale=(0.2, 1.0), antialias=True),
        v2.RandomHorizontalFlip(),
        v2.RandomApply([v2.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8),
        v2.RandomGrayscale(p=0.2),
        v2.RandAugment(num_ops=2, magnitude=9),
    ])


def apply_each(view: View, images: torch.Tensor) -> torch.Tensor:
    """Apply ``view`` independently to every image of a uint8 [B,3,H,W] batch (own random draws each)."""
    if len(images) == 0:
        return images
    return torch.stack([view(img) for img in images])


class Normalizer:
    """uint8 [B,3,H,W] -> float, normalised with the model's mean/std, on the target device."""

    def __init__(self, mean: tuple[float, float, float], std: tuple[float, float, float],
                 device: torch.device) -> None:
        self.device = device
        self.mean = torch.tensor(mean, device=device).view(1, 3, 1, 1)
        self.std = torch.tensor(std, device=device).view(1, 3, 1, 1)

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        x = images.to(self.device, non_blocking=True).float().div_(255)
        return (x - self.mean) / self.std
