"""The worker's memory pre-check: before a job adapts, the memory its bank, target and pool images
will hold (:func:`t3ar.jobsize.memory_bytes`, with the model's real feature width) must fit what the job's
device has free; otherwise the job fails at once with a message saying what to lower, instead of failing
hours later in an allocation (or driving the machine into swap)."""

from __future__ import annotations

from typing import Any

from t3ar.errors import T3arError
from t3ar.method.config import AdaptConfig


class JobTooLargeError(T3arError):
    """The job would need more memory than its device has free."""


def available_bytes(device: Any) -> int | None:
    """Free memory of ``device`` (a torch device): CUDA's free memory, or the machine's ``MemAvailable``;
    None when it cannot be told."""
    if getattr(device, "type", str(device)) == "cuda":
        import torch

        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_job_memory(config: AdaptConfig, n_kept: int, image_size: int, feature_dim: int, num_classes: int, device: Any,
                     available: int | None = None) -> int:
    """Raise :class:`JobTooLargeError` when the job's fixed tensors do not fit ``available`` (default: what
    ``device`` has free); the bytes needed otherwise."""
    from t3ar.jobsize import MEMORY_OPTIONS, gib, memory_bytes, terms

    need = memory_bytes(config, n_kept, image_size, feature_dim, num_classes)
    have = available if available is not None else available_bytes(device)
    if have is not None and need > have:
        raise JobTooLargeError(f"this job needs {gib(need)} for its memory bank, target and pool images "
                               f"({terms(config, MEMORY_OPTIONS)}, {n_kept} images of {image_size} px) "
                               f"but {device} has {gib(have)} free: lower bank_size or k, send fewer images, or run "
                               "it on a worker with more memory")
    return need
