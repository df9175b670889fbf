"""The t3ar checkpoint as a safetensors file: the same payload, the weights as safetensors tensors and everything
else as header metadata (safetensors metadata values are strings: JSON here).

Header metadata (``__metadata__``)::

    {"format": "t3ar.checkpoint", "version": "1", "container": "safetensors",
     "spec": ModelSpec JSON, "lineage": Lineage JSON, "adapt_config": JSON or "null", "metrics": JSON,
     "source_sha256": the sha256 of the checkpoint it was written from (or "")}

:func:`payload_from_safetensors` turns such a file back into the dict that ``torch.load`` gives for a ``.pt``
checkpoint, so :func:`t3ar.models.checkpoint.load_checkpoint` and ``read_info`` take either file. Reading runs no
code (safetensors holds raw tensors only), like ``weights_only=True`` for the torch file.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import torch

from t3ar.errors import CheckpointError

CONTAINER = "safetensors"
_JSON_KEYS = ("spec", "lineage", "adapt_config", "metrics")
# The safetensors format caps its JSON header at 100 MB; a larger claim is not a safetensors file.
_MAX_HEADER = 100_000_000


def is_safetensors(data: bytes) -> bool:
    """``data`` starts like a safetensors file: a little-endian u64 header length, then a JSON object that fits.
    (A torch checkpoint is a zip: it starts with ``PK``.)"""
    if len(data) < 10 or data[8:9] != b"{":
        return False
    (n,) = struct.unpack("<Q", data[:8])
    return n <= _MAX_HEADER and 8 + n <= len(data)


def to_safetensors(payload: dict[str, Any], *, source_sha256: str = "") -> bytes:
    """The bytes of a safetensors file holding ``payload`` (a t3ar checkpoint dict: ``format``, ``version``,
    ``spec``, ``lineage``, ``adapt_config``, ``metrics``, ``state_dict``). Tensors are written contiguous, on the
    CPU, with their dtype; nothing is lost (the state dict loads back bit for bit)."""
    from safetensors.torch import save

    state = {k: v.detach().cpu().contiguous() for k, v in payload["state_dict"].items()}
    meta = {"format": str(payload["format"]), "version": str(payload["version"]), "container": CONTAINER,
            "source_sha256": source_sha256}
    meta.update({k: json.dumps(payload.get(k), sort_keys=True) for k in _JSON_KEYS})
    return save(state, metadata=meta)


def _header_metadata(data: bytes, name: str) -> dict[str, str]:
    (n,) = struct.unpack("<Q", data[:8])
    try:
        header = json.loads(data[8:8 + n])
    except ValueError as exc:
        raise CheckpointError(f"{name}: unreadable safetensors header: {exc}") from exc
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(meta, dict) or meta.get("container") != CONTAINER:
        raise CheckpointError(f"{name} is a safetensors file without t3ar metadata (spec, lineage): only files "
                              "written by `t3ar export --format safetensors` can be loaded as a model")
    return meta


def payload_from_safetensors(data: bytes, name: str = "the file") -> dict[str, Any]:
    """The checkpoint dict of a file written by :func:`to_safetensors` (``version`` as an int, JSON fields
    decoded, ``state_dict`` the tensors). Raises CheckpointError when it is not one."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    meta = _header_metadata(data, name)
    try:
        payload: dict[str, Any] = {k: json.loads(meta[k]) for k in _JSON_KEYS}
        payload["format"] = meta["format"]
        payload["version"] = int(meta["version"])
    except (KeyError, ValueError) as exc:
        raise CheckpointError(f"{name}: malformed t3ar metadata in its safetensors header: {exc}") from exc
    try:
        state: dict[str, torch.Tensor] = load(data)
    except SafetensorError as exc:
        raise CheckpointError(f"{name}: corrupt safetensors data: {exc}") from exc
    payload["state_dict"] = state
    payload["source_sha256"] = meta.get("source_sha256") or None
    return payload
