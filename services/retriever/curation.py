"""Near-duplicate clusters of the pool, by R's embedding (``POST /pool/near-duplicates``): what a compaction
would remove. This module only *finds*; removing is an ordinary delete, which the API does (and records).

The scan reads one snapshot of the database (ids, sources, sizes and the stored vectors, oldest first) on a
connection of its own, so adds and deletes go on meanwhile; the neighbours come from an index
(:func:`t3ar.curation.plan_removals`: exact up to 20k items, IVF above), never from an all-pairs scan.
Sources name exact tags or, ending in ``*``, a prefix (``target:*``: every contributed target).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, Field

from t3ar.clients.retriever_models import NearDuplicate, NearDuplicatesResponse
from t3ar.curation import plan_removals
from t3ar_services.retriever.store import VECTOR_FILE
from t3ar_services.retriever.vecfile import VectorFile

MAX_SOURCES = 100
#: a source tag (at most 200 printable characters) or a prefix of one followed by *
SourcePattern = Annotated[str, Field(min_length=1, max_length=201, pattern=r"^[^\x00-\x1f]+$")]


class NearDuplicatesRequest(BaseModel):
    model_config = {"extra": "forbid"}

    threshold: float = Field(gt=0, le=1, description="cosine (R's embedding) at or above which two items are "
                                                     "near-duplicates; (0, 1]")
    sources: list[SourcePattern] = Field(min_length=1, max_length=MAX_SOURCES,
                                         description="sources whose items may be removed: exact tags, or a prefix "
                                                     "ending in * (target:* = every contributed target; * = all)")
    nprobe: int = Field(default=2, ge=1, le=1024, description="IVF cells probed per item (pools above 20k items)")


def _matches(source: str, patterns: Sequence[str]) -> bool:
    return any(source.startswith(p[:-1]) if p.endswith("*") else source == p for p in patterns)


def snapshot(db_path: Path, dim: int) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray]:
    """(seqs, sources, sizes, vectors) of every item, oldest first, from one read snapshot."""
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, isolation_level=None, timeout=30.0)
    try:
        conn.execute("BEGIN")
        n = int(conn.execute("SELECT count(*) FROM items").fetchone()[0])
        seqs, sizes = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
        vecs = np.empty((n, dim), dtype=np.float32)  # filled in place: no second copy of the vectors
        sources: list[str] = []
        storage = conn.execute("SELECT value FROM meta WHERE key = 'vector_storage'").fetchone()
        vf = VectorFile(db_path.parent / VECTOR_FILE, dim) if storage and storage[0] == "float16" else None
        cur = conn.execute("SELECT seq, source, size, vector FROM items ORDER BY seq")
        i = 0
        while rows := cur.fetchmany(65536):
            j = i + len(rows)
            seqs[i:j] = [r[0] for r in rows]
            sizes[i:j] = [r[2] for r in rows]
            if vf is not None:  # float16 storage (store.py): the rows of committed ids never change
                vecs[i:j] = vf.read(seqs[i:j])
            else:
                vecs[i:j] = np.frombuffer(b"".join(r[3] for r in rows), dtype="<f4").reshape(len(rows), dim)
            sources += [r[1] for r in rows]
            i = j
        conn.execute("COMMIT")
        if vf is not None:
            vf.close()
    finally:
        conn.close()
    return seqs[:i], sources, sizes[:i], vecs[:i]


def near_duplicates(db_path: Path, dim: int, format_id: Any, req: NearDuplicatesRequest) -> NearDuplicatesResponse:
    """Scan the pool for near-duplicates the sources ``req.sources`` may lose (see the module docstring)."""
    t0 = time.perf_counter()
    seqs, sources, sizes, vecs = snapshot(db_path, dim)
    t_read = time.perf_counter() - t0
    removable = np.fromiter((_matches(s, req.sources) for s in sources), dtype=bool, count=len(sources))
    plan = plan_removals(vecs, removable, req.threshold, nprobe=req.nprobe)
    removals = sorted(plan.removals, key=lambda r: (r.duplicate_of, r.row))
    out = [NearDuplicate(id=format_id(int(seqs[r.row])), source=sources[r.row], size=int(sizes[r.row]),
                         duplicate_of=format_id(int(seqs[r.duplicate_of])), score=round(r.score, 6))
           for r in removals]
    return NearDuplicatesResponse(
        remove=out, bytes=int(sum(x.size for x in out)), clusters=len({r.duplicate_of for r in removals}),
        scanned=plan.scanned, items=len(seqs), method=plan.method, nlist=plan.nlist, nprobe=plan.nprobe,
        seconds={"read": round(t_read, 3), **plan.seconds, "total": round(time.perf_counter() - t0, 3)})
