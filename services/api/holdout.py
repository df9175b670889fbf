"""A job's acceptance holdout, as uploaded (the ``holdout`` part of ``POST /adapt``): saved, safely extracted into
the job's folder next to its target, read and checked before anything is enqueued (:mod:`t3ar.data.holdout`), and
the job's acceptance options beside it.

The job's folder::

    jobs/<id>/target/           the validated target
    jobs/<id>/holdout/          the validated holdout (class folders, or images + labels.csv)
    jobs/<id>/acceptance.json   the job's AcceptanceOptions (candidates, require_gain, rule)

A readapt shares its parent's target folder, so it finds the same holdout and options next to it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import BinaryIO

from t3ar.acceptance_options import AcceptanceOptions
from t3ar.errors import InvalidInputError, UnsafeArchiveError
from t3ar_services.api.settings import ApiSettings
from t3ar_services.api.uploads import as_sent, save_upload
from t3ar_services.common.job_contract import resolve_inside, write_json_atomic

HOLDOUT_DIR = "holdout"
OPTIONS_FILE = "acceptance.json"


def prepare_holdout(upload: BinaryIO, sent: str, job_dir: Path, target_dir: Path, settings: ApiSettings,
                    model_classes: list[str], options: AcceptanceOptions) -> dict[str, str]:
    """Save, count its images from the archive's headers (before extracting or decoding any), extract, read and
    check the holdout (labels of the model, no empty class, no image of the target,
    at most ``T3AR_API_MAX_HOLDOUT_IMAGES``); write the options beside it. Returns the sha256 of each of its images
    by id. Raises an InvalidInputError (a 4xx) naming what the client sent; the caller removes the job's folder."""
    from t3ar.data.archive import ExtractLimits, archive_kind, safe_extract
    from t3ar.data.holdout import check_holdout, count_listed, image_digests, pixel_digests, read_holdout
    from t3ar.data.images import is_image_name
    from t3ar.digest import file_sha256
    from t3ar.errors import T3arError

    archive = job_dir / "holdout.upload"
    save_upload(upload, archive, settings.max_upload_bytes, "the holdout archive", "T3AR_API_MAX_UPLOAD_BYTES")
    if archive_kind(archive) is None:
        raise UnsafeArchiveError("the holdout is not a zip or tar(.gz/.bz2/.xz) archive; pack its class folders (or "
                                 "its images and a labels.csv of path,label) into one")
    folder = job_dir / HOLDOUT_DIR
    limits = ExtractLimits(max_files=min(settings.max_archive_files, 2 * settings.max_holdout_images + 64),
                           max_total_bytes=settings.max_archive_bytes, max_file_bytes=settings.max_image_bytes,
                           max_ratio=settings.max_archive_ratio)
    try:
        safe_extract(archive, folder, limits, name=sent,  # counted from the headers, decoded last
                     on_listed=lambda files: count_listed(files, settings.max_holdout_images,
                                                          "T3AR_API_MAX_HOLDOUT_IMAGES"))
        archive.unlink()
        holdout = read_holdout(folder, num_workers=settings.validate_threads)
        files = [p for p in sorted(target_dir.rglob("*")) if p.is_file() and not p.is_symlink()]
        target = [file_sha256(p) for p in files]
        images = [p for p in files if is_image_name(p)]
        check_holdout(holdout, model_classes, target_digests=target,
                      max_images=settings.max_holdout_images, setting="T3AR_API_MAX_HOLDOUT_IMAGES",
                      target_pixels=pixel_digests(images, num_workers=settings.validate_threads))
        digests = dict(zip(holdout.images.ids, image_digests(holdout.images), strict=True))
    except T3arError as e:
        raise type(e)(as_sent(str(e), folder, sent)) from e
    write_json_atomic(job_dir / OPTIONS_FILE, options.model_dump(mode="json"))
    return digests


def holdout_of(data_dir: Path, target_dir: str) -> tuple[str, AcceptanceOptions] | None:
    """The holdout folder (relative to ``data_dir``) and the options of the job whose target is ``target_dir``;
    None for a job without a holdout."""
    folder = resolve_inside(data_dir, target_dir).parent
    if not (folder / HOLDOUT_DIR).is_dir():
        return None
    try:
        options = AcceptanceOptions.model_validate(json.loads((folder / OPTIONS_FILE).read_text()))
    except (OSError, ValueError) as e:
        raise InvalidInputError(f"the job's acceptance options cannot be read ({type(e).__name__}); submit it "
                                "again") from e
    return (Path(target_dir).parent / HOLDOUT_DIR).as_posix(), options
