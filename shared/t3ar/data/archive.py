"""Safe extraction of untrusted zip/tar archives (uploads, downloaded packages).

Contract of :func:`safe_extract`: every member is validated *before anything is written* (no absolute
paths, no ``..``, no drive letters, no symlinks/hardlinks/devices, no duplicate names, entry count and
declared sizes within :class:`ExtractLimits`, the whole archive unpacking to at most ``max_ratio`` times its own
size, no zip member compressed more than :data:`ZIP_MAX_RATIO`:1). Extraction then streams each member and
enforces the byte limits again (declared sizes can lie). Everything is written into a temporary sibling of
``dest`` that is renamed into place at the end, so on any failure ``dest`` does not exist (or is left exactly as
it was) and an :class:`~t3ar.errors.UnsafeArchiveError` names the member and the reason.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import logging
import lzma
import os
import re
import shutil
import stat
import tarfile
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Literal

from t3ar.errors import InvalidInputError, UnsafeArchiveError

logger = logging.getLogger(__name__)

ArchiveKind = Literal["zip", "tar"]

ZIP_MAX_RATIO = 1000
"""A zip member larger than :data:`RATIO_MIN_BYTES` compressed more than this (x:1) is treated as a bomb."""
RATIO_MIN_BYTES = 1 << 20

_JUNK_NAMES = frozenset({".DS_Store", "Thumbs.db"})
_DRIVE = re.compile(r"^[A-Za-z]:")
_CHUNK = 1 << 20


@dataclass(frozen=True)
class ExtractLimits:
    """Upper bounds for one extraction. ``max_files`` counts entries (files and directories); ``max_ratio``
    bounds the whole archive's unpacked bytes per archive byte (many small, highly compressed members are a bomb
    too), except that :data:`RATIO_MIN_BYTES` may always be unpacked."""

    max_files: int = 100_000
    max_total_bytes: int = 4 * 1024**3
    max_file_bytes: int = 256 * 1024**2
    max_ratio: int = 100


@dataclass(frozen=True)
class _Entry:
    name: str  # the member name as stored
    rel: str  # normalised relative POSIX path
    is_dir: bool
    size: int  # declared uncompressed size
    ref: zipfile.ZipInfo | tarfile.TarInfo


def archive_kind(path: str | Path) -> ArchiveKind | None:
    """``"zip"`` or ``"tar"`` (plain, gzip, bzip2 or xz compressed) judged by content, else None."""
    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError:
        return None
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06", b"PK\x07\x08"):
        return "zip" if zipfile.is_zipfile(path) else None
    opener: dict[bytes, type] = {
        b"\x1f\x8b": gzip.GzipFile,
        b"BZ": bz2.BZ2File,
        b"\xfd7zXZ\x00": lzma.LZMAFile,
    }
    for magic, cls in opener.items():
        if head.startswith(magic):
            try:
                with cls(path, "rb") as z:
                    head = z.read(512)
            except (OSError, EOFError, lzma.LZMAError):
                return None
            break
    if len(head) < 512:
        return None
    if head[257:262] == b"ustar" or _tar_checksum_ok(head):
        return "tar"
    return None


def _tar_checksum_ok(block: bytes) -> bool:
    """Old (v7) tar headers have no magic; their checksum field is the only signature."""
    try:
        stored = int(block[148:156].replace(b"\x00", b" ").strip() or b"-1", 8)
    except ValueError:
        return False
    computed = sum(block[:148]) + 8 * 32 + sum(block[156:512])
    return stored == computed and block[0] != 0


def _normalise(name: str) -> str:
    """Relative POSIX path of a member name, or ValueError saying why it is unsafe."""
    if not name or "\x00" in name:
        raise ValueError("empty name or NUL byte in name")
    posix = name.replace("\\", "/")  # Windows tools write backslashes; treat them as separators
    if posix.startswith("/") or _DRIVE.match(posix):
        raise ValueError("absolute path")
    parts = [p for p in posix.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ValueError("'..' path component (path traversal)")
    if not parts:
        raise ValueError("name resolves to the archive root")
    return "/".join(parts)


def _is_junk(rel: str) -> bool:
    parts = PurePosixPath(rel).parts
    return "__MACOSX" in parts or parts[-1].startswith("._") or parts[-1] in _JUNK_NAMES


class _Rejected(ValueError):
    """A member refused while the archive is listed; ``member`` is its name as stored."""

    def __init__(self, member: str, reason: ValueError) -> None:
        super().__init__(str(reason))
        self.member = member


@contextlib.contextmanager
def _member(name: str) -> Iterator[None]:
    """Checks of one member: their ValueError names that member."""
    try:
        yield
    except ValueError as e:
        raise _Rejected(name, e) from e


def _zip_entries(zf: zipfile.ZipFile) -> Iterator[_Entry]:
    for info in zf.infolist():
        with _member(info.filename):
            entry = _zip_entry(info)
        yield entry


def _zip_entry(info: zipfile.ZipInfo) -> _Entry:
    rel = _normalise(info.filename)
    mode = info.external_attr >> 16
    if stat.S_ISLNK(mode):
        raise ValueError("symbolic link")
    if mode and stat.S_IFMT(mode) and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise ValueError("device or special file")
    if info.flag_bits & 0x1:
        raise ValueError("encrypted member")
    if not info.is_dir() and info.file_size >= RATIO_MIN_BYTES:
        if info.compress_size == 0 or info.file_size / info.compress_size > ZIP_MAX_RATIO:
            raise ValueError(
                f"compression ratio {info.file_size}/{info.compress_size} bytes exceeds "
                f"{ZIP_MAX_RATIO}:1 (zip bomb)"
            )
    return _Entry(info.filename, rel, info.is_dir(), 0 if info.is_dir() else info.file_size, info)


def _tar_entries(tf: tarfile.TarFile, probe_dir: str) -> Iterator[_Entry]:
    for member in tf:
        with _member(member.name):
            entry = _tar_entry(member, probe_dir)
        yield entry


def _tar_entry(member: tarfile.TarInfo, probe_dir: str) -> _Entry:
    rel = _normalise(member.name)
    if member.issym():
        raise ValueError(f"symbolic link to {member.linkname!r}")
    if member.islnk():
        raise ValueError(f"hard link to {member.linkname!r}")
    if member.isdev() or not (member.isreg() or member.isdir()):
        raise ValueError("device or special file")
    if member.issparse():
        raise ValueError("sparse file")
    try:  # the stdlib's own checks, in addition to ours
        tarfile.data_filter(member, probe_dir)
    except tarfile.FilterError as e:
        raise ValueError(f"rejected by tarfile data filter: {e}") from e
    return _Entry(member.name, rel, member.isdir(), 0 if member.isdir() else member.size, member)


def _ratio_cap(archive: Path, limits: ExtractLimits) -> tuple[int, str]:
    """The most bytes ``archive`` may unpack to under ``max_ratio``, and that limit in words."""
    size = archive.stat().st_size
    return max(limits.max_ratio * size, RATIO_MIN_BYTES), \
        f"{limits.max_ratio} times the archive's {size} bytes (limit max_ratio; a compression bomb?)"


def _validate(entries: Iterator[_Entry], limits: ExtractLimits, archive: Path, shown: str) -> list[_Entry]:
    """Consume ``entries``, checking names, tree consistency and declared sizes; return what to extract."""
    ratio_cap, ratio_why = _ratio_cap(archive, limits)
    kept: list[_Entry] = []
    files: set[str] = set()
    dirs: set[str] = set()
    total = 0
    name = "?"
    try:
        for entry in entries:
            name = entry.name
            if _is_junk(entry.rel):
                continue
            if len(kept) + 1 > limits.max_files:
                raise ValueError(f"more than {limits.max_files} entries (limit max_files)")
            parents = {str(p) for p in PurePosixPath(entry.rel).parents if str(p) != "."}
            if entry.is_dir:
                if entry.rel in files:
                    raise ValueError("directory has the same name as a file")
                dirs.add(entry.rel)
            else:
                if entry.rel in files:
                    raise ValueError("duplicate name")
                if entry.rel in dirs:
                    raise ValueError("file has the same name as a directory")
                if entry.size > limits.max_file_bytes:
                    raise ValueError(
                        f"declared size {entry.size} bytes > max_file_bytes {limits.max_file_bytes}"
                    )
                total += entry.size
                if total > limits.max_total_bytes:
                    raise ValueError(f"total declared size exceeds max_total_bytes {limits.max_total_bytes}")
                if total > ratio_cap:
                    raise ValueError(f"total declared size {total} bytes exceeds {ratio_why}")
                files.add(entry.rel)
            if parents & files:
                raise ValueError("a parent directory of this member is a file")
            dirs |= parents
            kept.append(entry)
    except ValueError as e:
        member = e.member if isinstance(e, _Rejected) else name
        raise UnsafeArchiveError(
            f"{shown}: member {member!r} rejected: {e}; nothing was extracted"
        ) from e
    return kept


def _copy(src: IO[bytes], target: Path, entry: _Entry, limits: ExtractLimits, written_total: int,
          ratio_cap: tuple[int, str]) -> int:
    """Stream one member to ``target``; returns bytes written; ValueError when a limit or the size is off."""
    written = 0
    with open(target, "xb") as out:
        while chunk := src.read(_CHUNK):
            written += len(chunk)
            if written > limits.max_file_bytes:
                raise ValueError(f"more than max_file_bytes {limits.max_file_bytes} bytes when decompressed")
            if written_total + written > limits.max_total_bytes:
                raise ValueError(f"archive exceeds max_total_bytes {limits.max_total_bytes} decompressed")
            if written_total + written > ratio_cap[0]:
                raise ValueError(f"archive unpacks to more than {ratio_cap[1]}")
            if written > entry.size:
                raise ValueError(f"larger than its declared size {entry.size}")
            out.write(chunk)
    if written != entry.size:
        raise ValueError(f"{written} bytes but {entry.size} declared (truncated or corrupt)")
    return written


def _extract_into(
    archive: Path, kind: ArchiveKind, root: Path, limits: ExtractLimits, shown: str,
    on_listed: Callable[[list[tuple[str, int]]], None] | None = None,
) -> tuple[int, int]:
    """Validate everything, then write into ``root`` (an empty directory). Returns (files, bytes)."""
    written_total, n_files = 0, 0
    opened: zipfile.ZipFile | tarfile.TarFile
    try:
        opened = zipfile.ZipFile(archive) if kind == "zip" else tarfile.open(archive, "r:*")
    except (zipfile.BadZipFile, tarfile.TarError, OSError, EOFError) as e:
        raise UnsafeArchiveError(f"{shown}: cannot open as {kind} archive: {e}") from e
    with opened as arc:
        try:
            raw = _zip_entries(arc) if isinstance(arc, zipfile.ZipFile) else _tar_entries(arc, str(root))
            entries = _validate(raw, limits, archive, shown)
        except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError, lzma.LZMAError) as e:
            raise UnsafeArchiveError(f"{shown}: corrupt archive while listing members: {e}") from e
        if on_listed is not None:  # the caller's checks of the listing, before one byte is written
            on_listed([(e.rel, e.size) for e in entries if not e.is_dir])
        ratio_cap = _ratio_cap(archive, limits)
        for entry in entries:
            target = root.joinpath(*entry.rel.split("/"))
            try:
                if entry.is_dir:
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                if isinstance(arc, zipfile.ZipFile):
                    assert isinstance(entry.ref, zipfile.ZipInfo)
                    src: IO[bytes] | None = arc.open(entry.ref)
                else:
                    assert isinstance(entry.ref, tarfile.TarInfo)
                    src = arc.extractfile(entry.ref)
                if src is None:
                    raise ValueError("no data")
                with src:
                    written_total += _copy(src, target, entry, limits, written_total, ratio_cap)
                n_files += 1
            except (ValueError, OSError, EOFError, zipfile.BadZipFile, tarfile.TarError, lzma.LZMAError) as e:
                raise UnsafeArchiveError(
                    f"{shown}: member {entry.name!r}: {e}; extraction aborted and rolled back"
                ) from e
    return n_files, written_total


def safe_extract(archive: Path, dest: Path, limits: ExtractLimits = ExtractLimits(), *,
                 name: str | None = None,
                 on_listed: Callable[[list[tuple[str, int]]], None] | None = None) -> Path:
    """Extract ``archive`` (zip or tar[.gz|.bz2|.xz]) into ``dest`` all-or-nothing; return ``dest``.

    ``dest`` must not exist or be an empty directory (InvalidInputError otherwise). macOS junk
    (``__MACOSX/``, ``._*``, ``.DS_Store``) is skipped. Files are written with default permissions (modes,
    owners and timestamps from the archive are not applied). ``name``: what errors call the archive (e.g. the
    file name an uploader gave it; default: its file name here). ``on_listed``: called with every file's
    (relative path, declared size) once the headers are read and checked, before anything is written; what it
    raises aborts the extraction (e.g. a holdout counting its images before any is decoded).
    """
    archive, dest = Path(archive), Path(dest)
    shown = name or archive.name
    kind = archive_kind(archive)
    if kind is None:
        raise UnsafeArchiveError(f"{shown}: not a zip or tar(.gz/.bz2/.xz) archive; use one of those")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise InvalidInputError(f"{dest} already exists and is not an empty directory; choose a new one")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.partial-", dir=dest.parent))
    try:
        n_files, n_bytes = _extract_into(archive, kind, tmp, limits, shown, on_listed)
        if dest.exists():
            dest.rmdir()
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.debug("extracted %s: %d files, %d bytes into %s", archive, n_files, n_bytes, dest)
    return dest
