"""Normalisation of uint8 image batches (the models' input contract). The random views are in
:mod:`t3ar.method.views`.
"""

from __future__ import annotations

import torch


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
