"""A target joins a local pool folder (``t3ar adapt --pool DIR --contribute``): the same rules as the services'
contribution, for the in-process pool of :mod:`t3ar.local_pool`.

After a successful adaptation the target's images are copied into ``DIR/target-<run id>/`` (the run id is the
adapted checkpoint's sha256 prefix unless given), with ``.contribution.json`` beside them (source
``target:<run id>``, the run id, the images added and skipped). An exact duplicate (same sha256 as a file of the
pool, or an earlier image of this target) and R's near-duplicate (cosine >= ``threshold`` with a pool image or
an image added before it) are skipped and counted. The folder appears in one rename, so an interrupted run
leaves nothing half-added, and a second run with the same id adds nothing (it answers the first run's record).
Withdrawing the contribution as a unit is deleting that folder; later runs never see it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from t3ar.data.images import open_image
from t3ar.digest import file_sha256
from t3ar.errors import InvalidInputError

log = logging.getLogger(__name__)

MANIFEST = ".contribution.json"  # hidden: pool readers skip it
SOURCE_PREFIX = "target:"


def folder_name(run_id: str) -> str:
    return f"target-{run_id}"


def contribute_local(pool_dir: Path, target_paths: list[Path], run_id: str, pool: Any, *,
                     threshold: float = 0.98, batch_size: int = 128) -> dict[str, Any]:
    """Copy the target images into the pool folder (see the module docstring); the contribution record.

    ``pool`` is the run's :class:`~t3ar.local_pool.LocalPool` (its embedder R and index of the pool as it was)."""
    if not pool_dir.is_dir():
        raise InvalidInputError(f"{pool_dir}: a target can only join a pool that is a folder (not an archive)")
    if not 0 < threshold <= 1:
        raise InvalidInputError(f"the near-duplicate threshold must be in (0, 1]; got {threshold}")
    if not run_id or any(not (ch.isalnum() or ch in "-_.") for ch in run_id):
        raise InvalidInputError(f"run id {run_id!r}: use letters, digits, '-', '_' or '.'")
    dest = pool_dir / folder_name(run_id)
    if (dest / MANIFEST).is_file():
        record = dict(json.loads((dest / MANIFEST).read_text()))
        return {**record, "repeated": True}
    if dest.exists():
        raise InvalidInputError(f"{dest} exists but holds no {MANIFEST}: not a contribution; move it away")
    pool_shas = {file_sha256(p) for p in pool_dir.rglob("*") if p.is_file() and not p.is_symlink()
                 and p.name != MANIFEST}
    vecs = _embed(pool, target_paths, batch_size)
    best = pool.search(vecs, 1)[0][:, 0] if pool.size() else np.full(len(vecs), -np.inf)
    added: list[tuple[Path, str]] = []
    kept_vecs: list[np.ndarray] = []
    seen: set[str] = set()
    exact = near = 0
    for path, vec, score in zip(target_paths, vecs, best, strict=True):
        sha = file_sha256(path)
        if sha in pool_shas or sha in seen:
            exact += 1
            continue
        seen.add(sha)
        if score >= threshold or (kept_vecs and float(np.max(np.stack(kept_vecs) @ vec)) >= threshold):
            near += 1
            continue
        kept_vecs.append(vec)
        added.append((path, sha))
    record = {"source": SOURCE_PREFIX + run_id, "run_id": run_id, "images": len(target_paths),
              "added": len(added), "skipped_exact": exact, "skipped_near": near, "threshold": threshold,
              "identity": pool.identity, "files": [], "repeated": False}
    tmp = pool_dir / f".{folder_name(run_id)}.{uuid.uuid4().hex}.tmp"
    tmp.mkdir()
    try:
        for i, (path, sha) in enumerate(added):
            name = f"{i:06d}-{sha[:12]}{path.suffix.lower()}"
            shutil.copyfile(path, tmp / name)
            record["files"].append({"file": name, "sha256": sha, "from": path.name})
        (tmp / MANIFEST).write_text(json.dumps(record, indent=2))
        os.replace(tmp, dest)  # one rename: the contribution is there whole, or not at all
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("contributed %d of %d target images to %s", len(added), len(target_paths), dest)
    return record


def _embed(pool: Any, paths: list[Path], batch_size: int) -> np.ndarray:
    out = [pool.embedder.embed([open_image(p) for p in paths[i:i + batch_size]], batch_size=batch_size)
           for i in range(0, len(paths), batch_size)]
    return np.concatenate(out) if out else np.empty((0, 0), dtype=np.float32)
