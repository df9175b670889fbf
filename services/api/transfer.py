"""What the API moves to and from workers (:mod:`t3ar_services.common.job_contract`): the target as one tar with
its sha256, and a worker's checkpoint and result, verified and stored atomically.

Target tar: ``jobs/<id>/target.tar`` next to the extracted ``target/`` folder, made once at enqueue (a readapt
reuses its parent's) with a deterministic layout (sorted names, no owners or times), so the same folder always
gives the same digest. Its sha256 is kept in ``target.tar.sha256``, written after the tar: a tar without it is
made again.

Artifacts: :meth:`Artifacts.put_checkpoint` streams a body into a temp file in ``artifacts/<id>/``, hashing as
it writes, and renames it to ``model.pt`` only when the digest matches what the worker declared;
:meth:`Artifacts.put_result` checks that ``model.pt`` is the checkpoint the lineage names, then writes
``report.json`` and, last, ``lineage.json`` (the job is finished from then on). One lock serialises the commits,
so two uploads of the same job cannot interleave; a finished job's files are never replaced.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tarfile
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from t3ar.digest import file_sha256
from t3ar.errors import InvalidInputError
from t3ar.filemode import new_file_mode
from t3ar_services.api.errors import ConflictError, PayloadTooLargeError
from t3ar_services.common.files import atomic_file
from t3ar_services.common.job_contract import (
    LINEAGE_FILE,
    MODEL_FILE,
    REPORT_FILE,
    artifacts_dir,
    resolve_inside,
    write_json_atomic,
)


class _HashingWriter:
    """A binary file object that hashes what is written through it (tarfile writes the tar through it)."""

    def __init__(self, fh: Any) -> None:
        self.fh = fh
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        return int(self.fh.write(data))


def _reset(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    info.mode = 0o755 if info.isdir() else 0o644
    return info


@dataclass(frozen=True)
class TargetTar:
    path: Path
    sha256: str
    size: int


def target_tar(data_dir: Path, target_dir: str) -> TargetTar:
    """The tar of the job's validated target folder (``target_dir``, relative to ``data_dir``), made if missing."""
    folder = resolve_inside(data_dir, target_dir)
    if not folder.is_dir():
        raise ConflictError(f"the target images {target_dir!r} are no longer stored; submit them again")
    path = folder.with_name(folder.name + ".tar")
    digest = path.with_name(path.name + ".sha256")
    if path.is_file() and digest.is_file():
        sha = digest.read_text().strip()
        if len(sha) == 64:
            return TargetTar(path, sha, path.stat().st_size)
    with atomic_file(path) as fh:
        writer = _HashingWriter(fh)
        with tarfile.open(fileobj=writer, mode="w|", format=tarfile.PAX_FORMAT) as tf:  # type: ignore[call-overload]
            for p in sorted(folder.rglob("*")):
                if p.is_file() and not p.is_symlink():
                    tf.add(p, p.relative_to(folder).as_posix(), recursive=False, filter=_reset)
    sha = writer.sha.hexdigest()
    part = digest.with_name(f".{digest.name}.{uuid.uuid4().hex}.tmp")
    part.write_text(sha + "\n")
    os.replace(part, digest)
    return TargetTar(path, sha, writer.size)


class Artifacts:
    """The finished-or-not artifacts of jobs under ``<data_dir>/artifacts`` (see the module docstring)."""

    def __init__(self, data_dir: Path, max_checkpoint_bytes: int) -> None:
        self.data_dir = data_dir
        self.max_checkpoint_bytes = max_checkpoint_bytes
        self._lock = threading.Lock()

    def finished_sha(self, job_id: str) -> str | None:
        """The checkpoint digest of a finished job (from its lineage.json), or None while it is not finished."""
        import json

        path = artifacts_dir(self.data_dir, job_id) / LINEAGE_FILE
        try:
            return str(json.loads(path.read_text())["checkpoint_sha256"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError):
            return ""  # finished, but its record is unreadable: nothing may replace it either

    def refuse_if_finished(self, job_id: str, sha256: str, what: str) -> bool:
        """True when the job is finished with this very checkpoint (a retried upload: nothing to do); 409 when it
        finished with another; False when it is not finished."""
        done = self.finished_sha(job_id)
        if done is None:
            return False
        if done == sha256:
            return True
        raise ConflictError(f"job {job_id} is finished with another checkpoint; its {what} cannot be replaced "
                            "(a stale or duplicate upload)")

    async def put_checkpoint(self, job_id: str, sha256: str, body: AsyncIterator[bytes],
                             verify: Callable[[Path], None] | None = None) -> int:
        """Stream ``body`` to ``artifacts/<id>/model.pt`` if it hashes to ``sha256`` and ``verify(file)`` (run in
        the thread pool) accepts it; its size. 413 past the limit, 422 on a digest mismatch or a refused file
        (nothing is kept either way)."""
        from starlette.concurrency import run_in_threadpool

        out = artifacts_dir(self.data_dir, job_id)
        tmp = out / f".incoming-{uuid.uuid4().hex}.pt"
        h, size = hashlib.sha256(), 0
        try:
            with self._lock:  # not between another refused upload's cleanup (below) and its rmdir
                out.mkdir(parents=True, exist_ok=True)
                fh = open(tmp, "wb")  # noqa: SIM115  (closed by the with below)
            with fh:
                async for chunk in body:
                    size += len(chunk)
                    if size > self.max_checkpoint_bytes:
                        raise PayloadTooLargeError(f"the checkpoint is larger than {self.max_checkpoint_bytes} bytes "
                                                   "(T3AR_API_MAX_MODEL_BYTES)")
                    h.update(chunk)
                    await run_in_threadpool(fh.write, chunk)
                await run_in_threadpool(os.fsync, fh.fileno())
            got = h.hexdigest()
            if got != sha256:
                raise InvalidInputError(f"checksum mismatch: the body ({size} bytes) has sha256 {got}, the upload "
                                        f"declared {sha256}; nothing was stored, send it again")
            if verify is not None:
                await run_in_threadpool(verify, tmp)
            with self._lock:
                if self.refuse_if_finished(job_id, sha256, "checkpoint"):
                    return size
                os.chmod(tmp, new_file_mode())
                os.replace(tmp, out / MODEL_FILE)
            return size
        finally:
            tmp.unlink(missing_ok=True)
            with self._lock, contextlib.suppress(OSError):
                out.rmdir()  # only when empty: a refused upload leaves nothing behind, not even the job's folder

    def put_result(self, job_id: str, report: dict[str, Any], lineage: dict[str, Any],
                   verify: Callable[[Path], None] | None = None) -> bool:
        """Write report.json then lineage.json (the job is finished); False when it already was with this
        checkpoint (a retry). 409 when model.pt is missing or is not the checkpoint ``lineage`` names; whatever
        ``verify(model.pt)`` raises (a 422) before anything is written."""
        sha = str(lineage["checkpoint_sha256"])
        with self._lock:
            if self.refuse_if_finished(job_id, sha, "result"):
                return False
            out = artifacts_dir(self.data_dir, job_id)
            model = out / MODEL_FILE
            if not model.is_file():
                raise ConflictError(f"job {job_id} has no uploaded checkpoint: PUT the checkpoint first")
            stored = file_sha256(model)
            if stored != sha:
                raise ConflictError(f"job {job_id}'s uploaded checkpoint has sha256 {stored}, not the {sha} this "
                                    "result names: upload the checkpoint again")
            if verify is not None:
                verify(model)
            write_json_atomic(out / REPORT_FILE, report)
            write_json_atomic(out / LINEAGE_FILE, lineage)  # last: its presence marks the job finished
            return True
