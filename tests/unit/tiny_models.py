"""A tiny CPU backbone for tests of the adaptation loop (BatchNorm in every stage, 8-d features)."""

import torch
from torch import nn


class TinyBackbone(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.BatchNorm2d(8), nn.ReLU())
        self.stage = nn.Sequential(nn.Conv2d(8, 8, 3, 1, 1), nn.BatchNorm2d(8), nn.ReLU(),
                                   nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.num_features = 8

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stage(self.stem(x))
