"""Device selection and seeding."""

from __future__ import annotations

import random

import numpy as np
import torch

from t3ar.errors import DeviceUnavailableError


def resolve_device(name: str = "auto") -> torch.device:
    """``auto`` -> CUDA when available, else CPU; ``cuda``/``cuda:N`` must exist (clear error otherwise)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise DeviceUnavailableError(
                f"device {name!r} requested but CUDA is not available on this machine "
                f"(torch {torch.__version__}); use --device cpu or auto"
            )
        dev = torch.device(name)
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise DeviceUnavailableError(f"{name}: only {torch.cuda.device_count()} CUDA device(s) present")
        return dev
    if name == "cpu":
        return torch.device("cpu")
    raise DeviceUnavailableError(f"unknown device {name!r}: use auto, cpu, cuda or cuda:N")


def seed_everything(seed: int) -> torch.Generator:
    """Seed python, numpy and torch; return a CPU generator for the method's own sampling."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)
