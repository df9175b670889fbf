"""Export a t3ar checkpoint to a serving format, checked before it is written.

Contract of :func:`export_checkpoint`: the file at ``out`` appears whole (temp file, fsync, rename) and only after
the parity check passed; on any failure nothing is written there (an earlier file stays as it was). Pure library
code: a checkpoint file in, a file out, no services.

* ``onnx``: the whole classifier with its preprocessing (:mod:`t3ar.export.onnx_graph` says what it takes),
  checked in onnxruntime: logits within :data:`~t3ar.export.parity.TOLERANCE` and the same top-1 on every image.
* ``safetensors``: the state dict plus spec, lineage, adaptation config and metrics as header metadata
  (:mod:`t3ar.models.safetensors_io`); t3ar loads it as a checkpoint. Checked by reading it back: every tensor
  bit for bit, the same metadata, and the logits of the model it loads to.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from t3ar.errors import ExportError, InvalidInputError
from t3ar.export.parity import TOLERANCE, Parity, ParityError, compare, onnx_logits, reference_logits
from t3ar.export.probe import images_for_parity
from t3ar.models.checkpoint import (
    CheckpointInfo,
    classifier_from_payload,
    info_from_payload,
    read_payload,
    write_atomic,
)

log = logging.getLogger(__name__)

ExportFormat = Literal["onnx", "safetensors"]
FORMATS: tuple[ExportFormat, ...] = ("onnx", "safetensors")
SUFFIXES: dict[str, str] = {"onnx": ".onnx", "safetensors": ".safetensors"}
# ONNX and safetensors have no registered media type: both go as bytes, named by their file suffix
MEDIA_TYPES: dict[str, str] = {"onnx": "application/octet-stream", "safetensors": "application/octet-stream"}
#: one export at a time in a process: ``torch.onnx.export`` keeps process-global state (two at once fail with
#: "GLOBALS.in_onnx_export must be False"), and a server's memory cap is per export
_ONE_AT_A_TIME = threading.Lock()


@dataclass(frozen=True)
class ExportReport:
    """What was written: where, its sha256 and size, and the parity figures it passed."""

    format: str
    path: Path
    sha256: str
    size: int
    parity: Parity
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return {"format": self.format, "path": str(self.path), "sha256": self.sha256, "size": self.size,
                "seconds": round(self.seconds, 2), "parity": self.parity.as_dict()}


def check_format(fmt: str) -> ExportFormat:
    """``fmt`` as an export format, or InvalidInputError naming the ones there are."""
    for known in FORMATS:
        if fmt == known:
            return known
    raise InvalidInputError(f"unknown export format {fmt!r}: use one of {', '.join(FORMATS)}")


def _safetensors(payload: dict[str, Any], info: CheckpointInfo, images: torch.Tensor, source: str,
                 reference: np.ndarray) -> tuple[bytes, Parity]:
    from t3ar.models.safetensors_io import payload_from_safetensors, to_safetensors

    data = to_safetensors(payload, source_sha256=info.sha256)
    back = payload_from_safetensors(data)
    # compared as JSON text: tuples come back as lists and a NaN metric equals itself there
    same_meta = all(json.dumps(back[k], sort_keys=True) == json.dumps(payload.get(k), sort_keys=True)
                    for k in ("spec", "lineage", "adapt_config", "metrics"))
    want, got = payload["state_dict"], back["state_dict"]
    same_tensors = want.keys() == got.keys() and all(
        want[k].dtype == got[k].dtype and torch.equal(want[k].cpu(), got[k]) for k in want)
    if not (same_meta and same_tensors):
        raise ExportError("the safetensors file does not read back to the same checkpoint "
                          f"(metadata {'equal' if same_meta else 'differs'}, tensors "
                          f"{'equal' if same_tensors else 'differ'}); nothing was written")
    loaded = classifier_from_payload(back, info, Path("<safetensors>"))
    return data, compare(reference, reference_logits(loaded, info.spec, images), source)


def export_checkpoint(checkpoint: Path, fmt: str, out: Path, *, images: torch.Tensor | None = None,
                      images_source: str = "", tolerance: float = TOLERANCE) -> ExportReport:
    """Export ``checkpoint`` (a t3ar ``.pt`` or safetensors file) as ``fmt`` to ``out``.

    ``images``: uint8 ``[n, 3, s, s]`` at the checkpoint's image size to check on (a target's; ``images_source``
    says which), else :func:`t3ar.export.probe.images_for_parity`'s generated set. Raises ParityError (an
    ExportError, with the figures) when the export does not reproduce the checkpoint, CheckpointError for a file
    that is not a checkpoint, InvalidInputError for an unknown format, MissingDependencyError when onnx or
    onnxruntime is not installed. Nothing is written at ``out`` in every one of those cases. Exports of one process
    run one at a time (a second call waits for the first).
    """
    with _ONE_AT_A_TIME:
        return _export(checkpoint, fmt, out, images, images_source, tolerance)


def _export(checkpoint: Path, fmt: str, out: Path, images: torch.Tensor | None, images_source: str,
            tolerance: float) -> ExportReport:
    from t3ar.export.onnx_graph import inference_classifier, onnx_bytes, require_onnx

    fmt = check_format(fmt)
    if fmt == "onnx":
        require_onnx()  # before the work, not after it
    started = time.perf_counter()
    payload, sha = read_payload(checkpoint)
    info = info_from_payload(payload, sha, checkpoint)
    size = info.spec.image_size
    if images is None:
        images, images_source = images_for_parity(size)
    if images.dtype != torch.uint8 or tuple(images.shape[1:]) != (3, size, size) or not len(images):
        raise InvalidInputError(f"parity images must be uint8 [n, 3, {size}, {size}], got {images.dtype} "
                                f"{tuple(images.shape)}")
    source = images_source or f"{len(images)} given images"
    # the reference is the model as t3ar loads and evaluates it (weight-normalised head and all)
    reference = reference_logits(classifier_from_payload(payload, info, checkpoint), info.spec, images)
    if fmt == "onnx":
        data = onnx_bytes(inference_classifier(info.spec, payload["state_dict"]), info)
        parity = compare(reference, onnx_logits(data, images), source)
    else:
        data, parity = _safetensors(payload, info, images, source, reference)
    parity = Parity(parity.images, parity.images_source, parity.max_abs_diff, parity.top1_agreement, tolerance)
    if not parity.ok:
        raise ParityError(fmt, parity)
    digest = write_atomic(Path(out), data)
    report = ExportReport(fmt, Path(out), digest, len(data), parity, time.perf_counter() - started)
    log.info("exported %s as %s to %s (%d bytes); %s", checkpoint, fmt, out, len(data), parity.line())
    return report
