"""Validation of uploads before anything is enqueued: size-limited streaming to disk, safe extraction of the
target archive into the job's own folder, every image decoded, labels checked against the model's classes,
and the adaptation config validated.

Contract of :func:`prepare_target`: it either returns a :class:`PreparedTarget` whose folder the worker can
read exactly as validated, or raises an :class:`~t3ar.errors.InvalidInputError` subclass (mapped to a 4xx)
after removing everything it wrote.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

from pydantic import BaseModel, Field, ValidationError

from t3ar.errors import DatasetError, InvalidInputError
from t3ar.method import registry
from t3ar.method.config import AdaptConfig, error_lines, field_info
from t3ar_services.api.errors import ConflictError, PayloadTooLargeError
from t3ar_services.api.settings import ApiSettings
from t3ar_services.common.job_contract import SHA256_PATTERN, resolve_inside, write_json_atomic
from t3ar_services.common.text import parse_json_object

_CHUNK = 1 << 20
#: beside a job's ``target/``: the images it adapts to (:class:`Subsample`), drawn once at submission
SUBSAMPLE_FILE = "subsample.json"


class Subsample(BaseModel):
    """The target images a job adapts to, drawn once at submission from the validated target (the subsample of its
    config's ``fraction``, ``seed`` and ``mode``: t3ar.data.sampling.adapted_rows) and recorded beside it: the
    job spec carries the rows to the worker, and a checkpoint's lineage must name its digest. A readapt shares its
    parent's target and config, so it shares this record too."""

    rows: list[int] = Field(min_length=2, description="indices into the target in read_target's order")
    sha256: str = Field(pattern=SHA256_PATTERN, description="t3ar.pipeline.imageset_sha256 of those images: the "
                                                            "target_sha256 of the lineage of a checkpoint adapted "
                                                            "to them")


def read_subsample(data_dir: Path, target_dir: str) -> Subsample:
    """The :class:`Subsample` recorded beside the target ``target_dir`` (relative to ``data_dir``)."""
    path = resolve_inside(data_dir, target_dir).parent / SUBSAMPLE_FILE
    try:
        return Subsample.model_validate_json(path.read_bytes())
    except (OSError, ValueError) as e:
        raise ConflictError(f"the record of the target images the job adapts to cannot be read "
                            f"({type(e).__name__}); submit the target again") from None


def save_upload(src: BinaryIO, dest: Path, limit: int, what: str, setting: str) -> int:
    """Copy ``src`` to ``dest`` (created exclusively), at most ``limit`` bytes; returns the size."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    size = 0
    try:
        with open(dest, "xb") as out:
            while chunk := src.read(_CHUNK):
                size += len(chunk)
                if size > limit:
                    raise PayloadTooLargeError(f"{what} is larger than {limit} bytes ({setting}); send a smaller one")
                out.write(chunk)
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
    if size == 0:
        dest.unlink(missing_ok=True)
        raise InvalidInputError(f"{what} is empty (0 bytes)")
    return size


def as_sent(message: str, server_path: Path, sent: str) -> str:
    """``message`` with ``server_path`` (where the server keeps an upload) replaced by ``sent`` (what the client
    called it): errors name what the client sent, never where the server keeps it."""
    for path in dict.fromkeys((str(server_path.resolve()), str(server_path))):
        message = message.replace(path, sent)
    return message


def sent_name(filename: str | None, default: str) -> str:
    """The base name of an uploaded file as the client named it (``default`` if it gave none)."""
    return PurePosixPath((filename or "").replace("\\", "/")).name[-200:] or default


def _bounds(cls: type[AdaptConfig] | None, loc: tuple[Any, ...]) -> str:
    """`` (allowed: 0 <= x <= 1000000)`` for a bounded option of ``cls`` named by an error's ``loc`` (without the
    union's method tag)."""
    info = field_info(cls, loc) if cls is not None and loc else None
    if info is None:
        return ""
    parts = [f"{sym} {getattr(m, attr)}" for m in info.metadata for attr, sym in
             (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")) if getattr(m, attr, None) is not None]
    return f" (allowed: {loc[-1]} {' and '.join(parts)})" if parts else ""


def parse_config(raw: str) -> dict[str, Any]:
    """The ``config`` form field (a JSON object of AdaptConfig fields) with a job's defaults
    (:func:`t3ar.method.presets.with_default`): the draft that :func:`prepare_target` completes with the mode and
    validates. Refused here (422), before any upload is read: what is not a JSON object, and a method that is not
    registered."""
    from t3ar.method.presets import with_default

    # strict JSON: Infinity, NaN, 1e999, 5,000-digit integers, lone surrogates and 100,000-deep nesting are 422s
    draft = with_default(parse_json_object(raw, "config", '{"method": "t3ar", "retrieval": {"k": 5}, "epochs": 2}'))
    if not isinstance(draft["method"], str) or draft["method"] not in registry.names():
        validate_config(draft)  # refused, naming the registered methods
    return draft


def validate_config(draft: dict[str, Any]) -> AdaptConfig:
    """``draft`` (options as sent, with a job's defaults) as its method's config; InvalidInputError (422) naming
    each option that does not fit, and its bounds."""
    from t3ar.method.presets import with_default

    try:
        return AdaptConfig.model_validate(with_default(draft))
    except ValidationError as e:
        method = draft.get("method")
        cls = registry.config_class(method) if isinstance(method, str) and method in registry.names() else None
        msgs = "; ".join(f"{line}{_bounds(cls, err['loc'][1:])}"
                         for line, err in zip(error_lines(e), e.errors(), strict=True))
        raise InvalidInputError(f"invalid adaptation config: {msgs}") from e


@dataclass
class PreparedTarget:
    target_dir: Path  # the folder the worker reads (jobs/<id>/target)
    n_images: int
    labelled: bool
    mode: str
    classes: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    subsample: Subsample | None = None  # the images the job adapts to (after ``fraction``), recorded

    @property
    def n_kept(self) -> int:
        return len(self.subsample.rows) if self.subsample is not None else 0


def prepare_target(archive: Path, job_dir: Path, settings: ApiSettings, model_classes: list[str],
                   draft: dict[str, Any], *, skip_bad_images: bool,
                   sent: str = "the archive") -> tuple[PreparedTarget, AdaptConfig]:
    """Extract and validate; returns the prepared target and the job's config: ``draft`` (:func:`parse_config`)
    with its mode resolved, validated once, as the job runs it. Errors call the archive ``sent`` (the client's file
    name) and its members ``<sent>/<member path>``.

    Mode: ``train`` when the archive has ``labels.csv`` and the config does not set ``mode`` (``test`` for a
    method without a train-time mode, e.g. ``adacontrast``); an explicit ``mode: test`` keeps the labels for
    evaluation only (the report then gives accuracy before/after). The config is validated with that mode as soon
    as the archive is extracted, before its images are decoded: an option refused in that mode is a 422 then.
    """
    from t3ar.data.archive import ExtractLimits, archive_kind, safe_extract
    from t3ar.data.datasets import adapted_rows, class_map_check, target_labels_csv
    from t3ar.data.target import read_target
    from t3ar.errors import T3arError, UnsafeArchiveError
    from t3ar.pipeline import imageset_sha256

    if archive_kind(archive) is None:
        raise UnsafeArchiveError("the upload is not a zip or tar(.gz/.bz2/.xz) archive; pack the images into one")
    limits = ExtractLimits(max_files=settings.max_archive_files, max_total_bytes=settings.max_archive_bytes,
                           max_file_bytes=settings.max_image_bytes, max_ratio=settings.max_archive_ratio)
    target_dir = job_dir / "target"
    try:
        safe_extract(archive, target_dir, limits, name=sent)
    except UnsafeArchiveError as e:
        raise UnsafeArchiveError(f"{as_sent(str(e), job_dir, sent)} (limits: T3AR_API_MAX_ARCHIVE_FILES="
                                 f"{settings.max_archive_files}, T3AR_API_MAX_ARCHIVE_BYTES="
                                 f"{settings.max_archive_bytes}, T3AR_API_MAX_ARCHIVE_RATIO="
                                 f"{settings.max_archive_ratio}, T3AR_API_MAX_IMAGE_BYTES={settings.max_image_bytes})"
                                 ) from e
    labelled = target_labels_csv(target_dir) is not None
    # a test-time-only method with labels.csv adapts unlabelled, and the labels score the result
    mode = draft.get("mode") or ("train" if labelled and registry.get(draft["method"]).train_mode else "test")
    config = validate_config({**draft, "mode": mode})  # the one validation: the config the job is enqueued with
    if config.mode == "train" and not labelled:
        raise DatasetError("mode 'train' (train-time adaptation) needs labels: add labels.csv (path,label) at the "
                           "archive root, or use mode 'test'")
    try:
        images = read_target(target_dir, strict=not skip_bad_images, num_workers=settings.validate_threads)
    except T3arError as e:
        raise type(e)(as_sent(str(e), target_dir, sent)) from e
    assert images.root is not None
    for rel, _ in images.skipped:  # the worker must see exactly the validated set
        bad = (images.root / rel).resolve()
        if bad.is_relative_to(target_dir.resolve()):
            bad.unlink(missing_ok=True)
    if len(images) < 2:
        raise DatasetError(f"the archive has {len(images)} usable image(s); adaptation needs at least 2")
    assert images.labelled == labelled, "read_target applies the labels.csv that target_labels_csv finds"
    if images.labelled:
        assert images.classes is not None
        class_map_check(list(images.classes), list(model_classes))
    kept = adapted_rows(images.labels, len(images), config.fraction, config.seed, mode=config.mode)  # test: unlabelled
    subsample = Subsample(rows=kept, sha256=imageset_sha256(images.subset(kept)))
    write_json_atomic(job_dir / SUBSAMPLE_FILE, subsample.model_dump())
    prepared = PreparedTarget(target_dir, len(images), images.labelled, config.mode, list(images.classes or []),
                              [(rel, as_sent(why, target_dir, sent)) for rel, why in images.skipped], subsample)
    return prepared, config


def check_job_size(settings: ApiSettings, config: AdaptConfig, n_kept: int, image_size: int, feature_dim: int | None,
                   num_classes: int) -> None:
    """Refuse (422) a job over the operator's per-job caps: planned optimiser steps
    (``T3AR_API_MAX_JOB_STEPS``) and the memory of its bank, target and pool images
    (``T3AR_API_MAX_JOB_MEMORY_BYTES``); wall time is ``T3AR_API_JOB_TIMEOUT``."""
    from t3ar.jobsize import MEMORY_OPTIONS, STEP_OPTIONS, gib, memory_bytes, planned_steps, terms

    steps = planned_steps(config, n_kept)
    if steps > settings.max_job_steps:
        raise InvalidInputError(f"this job would run {steps} optimiser steps ({n_kept} images, "
                                f"{terms(config, STEP_OPTIONS)}); this API allows "
                                f"{settings.max_job_steps} per job (T3AR_API_MAX_JOB_STEPS): lower epochs, "
                                "min_steps or second_stage_steps")
    need = memory_bytes(config, n_kept, image_size, feature_dim, num_classes)
    if need > settings.max_job_memory_bytes:
        raise InvalidInputError(f"this job would hold {gib(need)} in its memory bank, target and pool images "
                                f"({terms(config, MEMORY_OPTIONS)}, {n_kept} images of {image_size} px); "
                                f"this API allows {gib(settings.max_job_memory_bytes)} per job "
                                "(T3AR_API_MAX_JOB_MEMORY_BYTES): lower bank_size or k, or send fewer images")


def discard(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
