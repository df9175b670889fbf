"""Turning multipart uploads (images and zip/tar archives of images) into named byte strings.

No decoding here (and no torch): see :mod:`t3ar_services.retriever.ingest`. An unsafe or corrupt archive rejects
the whole request (:class:`~t3ar.errors.UnsafeArchiveError`: traversal, links, too many members, too large
unpacked); a single unusable member or file only rejects that item.
"""

from __future__ import annotations

import logging
import re
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import IO

from t3ar.data.archive import ExtractLimits, safe_extract
from t3ar.data.pool_labels import hidden_problem
from t3ar.errors import UnsafeArchiveError
from t3ar_services.retriever.errors import PayloadTooLargeError
from t3ar_services.retriever.pool import AddOutcome
from t3ar_services.retriever.settings import RetrieverSettings

log = logging.getLogger(__name__)

Item = tuple[str, bytes] | AddOutcome

_ARCHIVE_MAGIC = (b"PK\x03\x04", b"PK\x05\x06", b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00")
IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff"})


def looks_like_archive(head: bytes) -> bool:
    return head.startswith(_ARCHIVE_MAGIC) or (len(head) >= 262 and head[257:262] == b"ustar")


def _too_large(name: str, size: int, limit: int) -> AddOutcome:
    return AddOutcome.rejected(name, "too_large", f"{name}: {size} bytes exceeds the per-image limit of {limit} "
                               "bytes (T3AR_RETRIEVER_MAX_IMAGE_BYTES); downscale or recompress it")


def _read_capped(f: IO[bytes], limit: int) -> bytes:
    return f.read(limit + 1)


def expand_uploads(files: Sequence[tuple[str, IO[bytes]]], settings: RetrieverSettings) -> list[Item]:
    """Items in upload order; archive members in sorted path order, named ``<archive>/<member path>``."""
    out: list[Item] = []
    tmp_root = settings.data_dir / "tmp"
    for name, f in files:
        name = name or "upload"
        head = f.read(512)
        f.seek(0)
        if looks_like_archive(head):
            out += _expand_archive(name, f, tmp_root, settings)
        else:
            data = _read_capped(f, settings.max_image_bytes)
            out.append(_too_large(name, len(data), settings.max_image_bytes)
                       if len(data) > settings.max_image_bytes else (name, data))
        if len(out) > settings.max_items_per_request:
            raise PayloadTooLargeError(
                f"more than {settings.max_items_per_request} items in one request "
                "(T3AR_RETRIEVER_MAX_ITEMS_PER_REQUEST); split the upload into smaller batches")
    return [_named(it) for it in out]


def _named(item: Item) -> Item:
    """An item whose file name holds an invisible or bidi formatting character (``cat<U+202E>gnp.exe`` shows as
    ``catexe.png``) is rejected naming it (issue 50, N8): the pool shows and serves its items by these names."""
    if isinstance(item, AddOutcome):
        return item
    problem = hidden_problem(item[0], "the file name")
    return item if problem is None else AddOutcome.rejected(ascii(item[0])[1:-1], "bad_name",
                                                             problem.replace("; remove it", "; rename the file"))


def _expand_archive(name: str, f: IO[bytes], tmp_root: Path, settings: RetrieverSettings) -> list[Item]:
    work = Path(tempfile.mkdtemp(prefix="upload-", dir=tmp_root))
    try:
        safe_name = re.sub(r"[^A-Za-z0-9._-]", "_", PurePosixPath(name.replace("\\", "/")).name)[-100:]
        archive = work / (safe_name.lstrip(".") or "archive")
        with open(archive, "wb") as out:
            shutil.copyfileobj(f, out, 1 << 20)
        limits = ExtractLimits(max_files=settings.max_archive_files, max_total_bytes=settings.max_archive_bytes,
                               max_file_bytes=settings.max_archive_bytes, max_ratio=settings.max_archive_ratio)
        try:
            root = safe_extract(archive, work / "x", limits)
        except UnsafeArchiveError as e:
            raise UnsafeArchiveError(f"{e} (limits: T3AR_RETRIEVER_MAX_ARCHIVE_FILES="
                                     f"{settings.max_archive_files}, T3AR_RETRIEVER_MAX_ARCHIVE_BYTES="
                                     f"{settings.max_archive_bytes}, T3AR_RETRIEVER_MAX_ARCHIVE_RATIO="
                                     f"{settings.max_archive_ratio})") from e
        archive.unlink()
        items: list[Item] = []
        for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
            rel = path.relative_to(root).as_posix()
            if any(part.startswith(".") for part in PurePosixPath(rel).parts):
                continue  # hidden files (.DS_Store and friends)
            member = f"{name}/{rel}"
            if path.suffix.lower() not in IMAGE_SUFFIXES:
                items.append(AddOutcome.rejected(member, "not_image", f"{member}: not an image file name "
                                                 f"(expected one of {', '.join(sorted(IMAGE_SUFFIXES))})"))
                continue
            size = path.stat().st_size
            items.append(_too_large(member, size, settings.max_image_bytes)
                         if size > settings.max_image_bytes else (member, path.read_bytes()))
            if len(items) > settings.max_items_per_request:
                raise PayloadTooLargeError(
                    f"{name}: more than {settings.max_items_per_request} items in one request "
                    "(T3AR_RETRIEVER_MAX_ITEMS_PER_REQUEST); split the archive")
        log.debug("archive %s: %d members", name, len(items))
        return items
    finally:
        shutil.rmtree(work, ignore_errors=True)
