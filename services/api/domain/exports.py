"""A finished job's checkpoint in a serving format (ONNX, safetensors): made on its first request, kept beside the
checkpoint (``artifacts/<job>/model.onnx``, ``model.safetensors``), its sha256, size and parity figures recorded
in the store and shown with the job.

Contracts:

- made once: concurrent first requests (threads of this process or another API process on the same data
  directory) wait on an exclusive ``flock`` of the job's artifacts folder; the first makes the file, the others
  find it made and recorded;
- nothing half-written: :func:`t3ar.export.export_checkpoint` writes the file whole (temp file, rename) and only
  after its parity check passed on the job's own target images; it is recorded after it is whole. A file without
  its record (a crash in between) is made again; a record without its file likewise;
- bounded: an export whose memory (:func:`t3ar.export.size.export_memory_bytes`: weights, parity images, one
  chunk's activations at the model's image size) is over ``T3AR_API_MAX_EXPORT_MEMORY_BYTES`` is refused before any
  of it is made; one export runs at a time in a process (:func:`t3ar.export.export_checkpoint`);
- errors: an unknown format is InvalidInputError (422), a job not finished 409, a parity failure ExportError
  (422, with the figures), an export over the memory cap ExportTooLargeError (422), onnx/onnxruntime not
  installed MissingDependencyError (503).

Blocking (seconds of CPU on the first request): callers run it off the event loop.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from t3ar.errors import ExportTooLargeError, InvalidInputError
from t3ar_services.api.deps import ApiState
from t3ar_services.api.domain.jobs import checkpoint
from t3ar_services.api.jobs import require_job
from t3ar_services.api.store import ExportRow

if TYPE_CHECKING:
    from t3ar.models.classifier import ModelSpec

log = logging.getLogger(__name__)

#: The formats a job's checkpoint downloads in: the t3ar checkpoint itself, and the two serving formats.
DOWNLOAD_FORMATS = ("pt", "onnx", "safetensors")


@dataclass(frozen=True)
class Download:
    """A file to send: its path, the name to offer, its media type, its sha256 (None: not recorded)."""

    path: Path
    filename: str
    media_type: str
    sha256: str | None


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """An exclusive flock of ``folder`` itself (no lock file to leave behind); blocks until it is free."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the lock


def _check_size(state: ApiState, spec: ModelSpec, n_images: int) -> None:
    from t3ar.export.size import export_memory_bytes
    from t3ar.jobsize import gib

    need, cap = export_memory_bytes(spec, n_images), state.settings.max_export_memory_bytes
    if need > cap:
        raise ExportTooLargeError(
            f"exporting this checkpoint would take about {gib(need)} of memory (its weights, {n_images} parity images "
            f"of {spec.image_size} px and their activations); this API allows {gib(cap)} per export "
            "(T3AR_API_MAX_EXPORT_MEMORY_BYTES): download the .pt checkpoint and run `t3ar export` on a machine "
            "with the memory")


def _make(state: ApiState, job_id: str, fmt: str, src: Path, dest: Path) -> ExportRow:
    from t3ar.export import export_checkpoint
    from t3ar.export.probe import PROBE_COUNT, images_for_parity
    from t3ar.models.checkpoint import read_info

    row = require_job(state.store, job_id)
    spec = read_info(src).spec
    _check_size(state, spec, PROBE_COUNT)  # before the images or the model are loaded
    size = spec.image_size
    images, source = images_for_parity(size, state.settings.data_dir / row.target_dir, name="the job's target")
    report = export_checkpoint(src, fmt, dest, images=images, images_source=source)
    done = ExportRow(job_id, fmt, report.sha256, report.size, _now(), report.parity.as_dict())
    state.store.add_export(done)
    log.info("job %s: checkpoint exported as %s (%d bytes, %.1f s); %s", job_id, fmt, report.size, report.seconds,
             report.parity.line())
    return done


def exported(state: ApiState, job_id: str, fmt: str) -> ExportRow:
    """The job's checkpoint as ``fmt`` (``onnx`` | ``safetensors``), made now if it was not yet (see the module's
    contracts); its record."""
    from t3ar.export import SUFFIXES, check_format

    fmt = check_format(fmt)
    src = checkpoint(state, job_id)  # 404 / 409 before any work
    dest = src.with_suffix(SUFFIXES[fmt])
    known = state.store.exports_of(job_id).get(fmt)
    if known is not None and dest.is_file():
        return known
    with _locked(src.parent):
        known = state.store.exports_of(job_id).get(fmt)  # made while this request waited for the lock
        if known is not None and dest.is_file():
            return known
        return _make(state, job_id, fmt, src, dest)


def download(state: ApiState, job_id: str, fmt: str = "pt") -> Download:
    """What ``GET /jobs/{id}/checkpoint?format=`` sends (and the console's download links): the checkpoint itself
    for ``pt``, else the export (made on first request)."""
    from t3ar.export import MEDIA_TYPES, SUFFIXES

    if fmt not in DOWNLOAD_FORMATS:
        raise InvalidInputError(f"unknown checkpoint format {fmt!r}: use one of {', '.join(DOWNLOAD_FORMATS)}")
    if fmt == "pt":
        return Download(checkpoint(state, job_id), f"t3ar-{job_id}.pt", "application/octet-stream", None)
    done = exported(state, job_id, fmt)
    path = checkpoint(state, job_id).with_suffix(SUFFIXES[done.format])
    return Download(path, f"t3ar-{job_id}{SUFFIXES[done.format]}", MEDIA_TYPES[done.format], done.sha256)
