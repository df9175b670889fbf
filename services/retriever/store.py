"""SQLite: the source of truth for item metadata and embedding vectors (the faiss index is derived).

Where the vectors live (``meta.vector_storage``): ``sqlite`` (float32 in the ``vector`` column, ~2 KiB per 512-d
item: every pool made before the option, and the default) or ``float16``: float16 rows in ``vectors.f16`` beside
the database (a :class:`~t3ar_services.retriever.vecfile.VectorFile` keyed by seq, 1 KiB per 512-d item), the
``vector`` column left empty, so that SQLite keeps only metadata (10 M items: ~9.5 GiB of rows instead of ~20 GiB
of float32 plus SQLite's page overhead). An add writes and fsyncs its rows before its transaction commits (a
crash before the commit leaves rows no id names, overwritten by the next add). A delete's transaction records the
deleted seqs in ``vectors_to_zero`` together with the deletion; once it has committed their rows are zeroed and
fsynced, and only then is the record cleared. So a deleted item's float16 bytes leave the file before the delete
returns, and a crash anywhere between the commit and the fsync (``kill -9``, power loss) leaves them recorded:
opening the store zeroes every recorded row first (:attr:`Store.zeroed_at_open`, logged), at a cost proportional
to what was left, never a scan of the pool. A seq in the record names a deleted item and is never handed out
again (AUTOINCREMENT), so zeroing it late, or twice, can never touch another item's row.
:meth:`Store.move_vectors_to_file` migrates a ``sqlite`` pool (explicitly, see ``T3AR_RETRIEVER_VECTOR_STORAGE``).

WAL journal with ``synchronous=FULL``: a committed transaction survives power loss. ``secure_delete`` zeroes
deleted rows' bytes, and :meth:`Store.checkpoint` (after deletes) moves them out of the WAL file too.
``seq`` (INTEGER PRIMARY KEY AUTOINCREMENT) is the faiss id and is never reused after a delete.
``label`` (a class name, NULL = unlabelled) came after the first data dirs: a database without the
column gets it on open (``ALTER TABLE ... ADD COLUMN``, every old item unlabelled), no migration step needed.
Writes go through one connection guarded by the caller's writer lock; reads use one connection per thread.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from t3ar_services.retriever.vecfile import VectorFile

log = logging.getLogger(__name__)

SCHEMA_VERSION = "1"
VECTOR_FILE = "vectors.f16"  # float16 storage: the vectors, beside the database
CHECKSUM_MUL, CHECKSUM_MOD = 2654435761, 4294967291  # id checksum: sum((seq * MUL) % MOD)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) STRICT;
CREATE TABLE IF NOT EXISTS items (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    sha256 TEXT UNIQUE,
    source TEXT NOT NULL,
    metadata TEXT NOT NULL,
    filename TEXT,
    media_type TEXT,
    size INTEGER NOT NULL,
    width INTEGER,
    height INTEGER,
    added_at REAL NOT NULL,
    vector BLOB NOT NULL,
    label TEXT
) STRICT;
CREATE INDEX IF NOT EXISTS items_source ON items(source, seq);
CREATE TABLE IF NOT EXISTS reembed (seq INTEGER PRIMARY KEY, vector BLOB NOT NULL) STRICT;
CREATE TABLE IF NOT EXISTS vectors_to_zero (seq INTEGER PRIMARY KEY) STRICT;
CREATE TABLE IF NOT EXISTS withdrawn (
    sha256 TEXT PRIMARY KEY, id TEXT NOT NULL, at REAL NOT NULL, identity TEXT NOT NULL, vector BLOB NOT NULL
) STRICT;
CREATE INDEX IF NOT EXISTS withdrawn_id ON withdrawn(id);
"""
_COLS = "seq, sha256, source, metadata, filename, media_type, size, width, height, added_at, label"
_LABEL_INDEX = "CREATE INDEX IF NOT EXISTS items_label ON items(label, seq) WHERE label IS NOT NULL"


@dataclass(frozen=True)
class _Item:
    """What an item is, stored or about to be (``sha256`` None: vectors-only)."""

    sha256: str | None
    source: str
    metadata: dict[str, Any]
    filename: str | None
    media_type: str | None
    size: int
    width: int | None
    height: int | None
    label: str | None = field(default=None, kw_only=True)  # a class name; None = unlabelled


@dataclass(frozen=True)
class NewItem(_Item):
    vector: np.ndarray


@dataclass(frozen=True)
class ItemRow(_Item):
    seq: int
    added_at: float


@dataclass(frozen=True)
class DbState:
    generation: int
    count: int
    checksum: int


def _row(r: tuple[Any, ...]) -> ItemRow:
    return ItemRow(seq=r[0], sha256=r[1], source=r[2], metadata=json.loads(r[3]), filename=r[4], media_type=r[5],
                   size=r[6], width=r[7], height=r[8], added_at=r[9], label=r[10])


def id_checksum(seqs: np.ndarray) -> int:
    """Order-independent checksum of a set of ids; same formula as the SQL in :meth:`Store.state`."""
    s = np.asarray(seqs, dtype=np.int64)
    return int(((s * CHECKSUM_MUL) % CHECKSUM_MOD).sum()) if len(s) else 0


class Store:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._conns_lock = threading.Lock()
        self._w = self._connect()
        self._w.executescript(_SCHEMA)
        if "label" not in {r[1] for r in self._w.execute("PRAGMA table_info(items)")}:  # a pre-label data dir
            self._w.execute("ALTER TABLE items ADD COLUMN label TEXT")
        self._w.execute(_LABEL_INDEX)
        self._w.execute("INSERT OR IGNORE INTO meta VALUES ('generation', '0')")
        self._w.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (SCHEMA_VERSION,))
        self.vectors: VectorFile | None = None  # float16 storage: where the vectors are (None: the vector column)
        meta = self.meta()
        if meta.get("vector_storage") == "float16":
            self.vectors = VectorFile(self.vector_path, int(meta["dim"]))
        self.zeroed_at_open = self._zero_recorded()  # rows a crash kept from being zeroed after their delete
        if self.zeroed_at_open:
            log.warning("zeroed the float16 rows of %d deleted item(s) in %s, left recorded by a crash after their "
                        "delete's commit", self.zeroed_at_open, self.vector_path)

    @property
    def vector_path(self) -> Path:
        return self.path.parent / VECTOR_FILE

    @property
    def vector_storage(self) -> str:
        return "sqlite" if self.vectors is None else "float16"

    def _blob(self, v: np.ndarray) -> bytes:
        """The ``vector`` column's value: the float32 bytes, or nothing when the vectors live in the file."""
        return b"" if self.vectors is not None else np.ascontiguousarray(v, dtype="<f4").tobytes()

    def _write_vectors(self, seqs: Sequence[int], vectors: np.ndarray) -> None:
        """float16 storage: the rows on disk (fsynced) before the caller's transaction commits."""
        if self.vectors is not None and len(seqs):
            self.vectors.write(np.asarray(seqs, dtype=np.int64), vectors)
            self.vectors.flush()

    def use_float16(self, dim: int) -> None:
        """Keep this (empty) pool's vectors in the float16 file from now on."""
        if self.count():
            raise RuntimeError("use_float16 is for an empty pool; move_vectors_to_file migrates one with items")
        self.move_vectors_to_file(dim)

    def move_vectors_to_file(self, dim: int) -> int:
        """Migrate a ``sqlite`` pool to float16 storage (no writer may run meanwhile: the retriever does it at
        start-up): every vector written to the file and fsynced, then in one transaction the column emptied and
        ``vector_storage`` set; then the database is vacuumed (its float32 bytes leave the disk). A crash before
        that commit leaves the pool as it was (the next run starts the file again). Returns the vectors moved."""
        if self.vectors is not None:
            return 0
        vf = VectorFile(self.vector_path, dim)
        vf.reset()
        moved = 0
        for seqs, vecs in self.iter_vectors(dim):
            vf.write(seqs, vecs)
            moved += len(seqs)
        vf.flush()
        with self._txn() as c:
            c.execute("UPDATE items SET vector = x''")
            c.execute("INSERT OR REPLACE INTO meta VALUES ('vector_storage', 'float16')")
        self.vectors = vf
        if moved:
            self.checkpoint()
            self._w.execute("VACUUM")  # in WAL mode the smaller file is written at the next checkpoint
            self.checkpoint()
        return moved

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30.0)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA secure_delete=ON")
        return conn

    @property
    def _r(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._connect()
            with self._conns_lock:
                self._conns.append(conn)
        return conn

    # --- meta -------------------------------------------------------------------------------------
    def meta(self) -> dict[str, str]:
        return dict(self._r.execute("SELECT key, value FROM meta").fetchall())

    def set_meta(self, values: dict[str, str]) -> None:
        with self._txn():
            self._w.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", list(values.items()))

    class _Txn:
        def __init__(self, conn: sqlite3.Connection) -> None:
            self.conn = conn

        def __enter__(self) -> sqlite3.Connection:
            self.conn.execute("BEGIN IMMEDIATE")
            return self.conn

        def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
            self.conn.execute("COMMIT" if exc_type is None else "ROLLBACK")

    def _txn(self) -> Store._Txn:
        return Store._Txn(self._w)

    def _bump(self) -> None:
        self._w.execute("UPDATE meta SET value = CAST(CAST(value AS INTEGER) + 1 AS TEXT) WHERE key='generation'")

    # --- writes (caller holds the writer lock) ------------------------------------------------------
    def insert(self, items: Sequence[NewItem]) -> list[int]:
        """Insert in one transaction; returns the new seqs in order. Committed (durably) on return."""
        now = time.time()
        seqs: list[int] = []
        with self._txn() as c:
            for it in items:
                cur = c.execute(
                    "INSERT INTO items (sha256, source, metadata, filename, media_type, size, width, height,"
                    " added_at, vector, label) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (it.sha256, it.source, json.dumps(it.metadata, separators=(",", ":")), it.filename,
                     it.media_type, it.size, it.width, it.height, now, self._blob(it.vector), it.label))
                assert cur.lastrowid is not None
                seqs.append(cur.lastrowid)
            if seqs:
                self._write_vectors(seqs, np.stack([it.vector for it in items]))
            self._bump()
        return seqs

    def insert_vectors(self, vectors: np.ndarray, source: str, metadata: dict[str, Any],
                       label: str | None = None) -> list[int]:
        """Bulk insert of vector-only items (no image) in one transaction, all with this label."""
        now, meta = time.time(), json.dumps(metadata, separators=(",", ":"))
        vecs = np.ascontiguousarray(vectors, dtype="<f4")
        with self._txn() as c:
            first = c.execute("SELECT coalesce(max(seq), 0) FROM items").fetchone()[0]
            seq_row = c.execute("SELECT seq FROM sqlite_sequence WHERE name='items'").fetchone()
            start = max(first, seq_row[0] if seq_row else 0) + 1
            seqs = list(range(start, start + len(vecs)))
            c.executemany(
                "INSERT INTO items (seq, sha256, source, metadata, filename, media_type, size, width, height,"
                " added_at, vector, label) VALUES (?, NULL, ?, ?, NULL, NULL, 0, NULL, NULL, ?, ?, ?)",
                ((s, source, meta, now, self._blob(v), label) for s, v in zip(seqs, vecs, strict=True)))
            self._write_vectors(seqs, vecs)
            self._bump()
        return seqs

    def delete(self, seqs: Sequence[int], *, withdrawn: Sequence[tuple[str, str, float, str, np.ndarray]] = ()
               ) -> list[ItemRow]:
        """Delete these rows in one transaction; returns the rows that existed (committed on return, and under
        float16 storage their vectors zeroed on disk). A vector staged for a re-embedding goes with its row.
        ``withdrawn``: (sha256, id, at, identity, vector) of the withdrawn images, committed with the deletion
        (:mod:`t3ar_services.retriever.withdrawn`)."""
        with self._txn() as c:
            rows = self._get_many(c, seqs)
            gone = [(r.seq,) for r in rows]
            c.executemany("INSERT OR REPLACE INTO withdrawn VALUES (?, ?, ?, ?, ?)",
                          [(sha, pid, at, ident, np.ascontiguousarray(v, dtype="<f4").tobytes())
                           for sha, pid, at, ident, v in withdrawn])
            c.executemany("DELETE FROM items WHERE seq = ?", gone)
            c.executemany("DELETE FROM reembed WHERE seq = ?", gone)  # a new vector staged for it goes too
            if self.vectors is not None:  # committed with the deletion: zeroed even if a crash comes next
                c.executemany("INSERT OR IGNORE INTO vectors_to_zero VALUES (?)", gone)
            if rows:
                self._bump()
        if rows:
            self._zero_recorded()
        return rows

    def _zero_recorded(self) -> int:
        """Zero (and fsync) the float16 rows of every seq in ``vectors_to_zero``, then clear the record; returns
        how many. Normally the last delete's seqs; more only after a crash or a failed zeroing."""
        recorded = [r[0] for r in self._w.execute("SELECT seq FROM vectors_to_zero")]
        if not recorded:
            return 0
        if self.vectors is not None:
            self.vectors.zero(np.array(recorded, dtype=np.int64))
            self.vectors.flush()
        # Not fsynced on its own (the delete's checkpoint, or the next commit, makes it durable): if a crash loses
        # it, the next open zeroes these rows again, which changes nothing.
        self._w.execute("PRAGMA synchronous=OFF")
        try:
            with self._txn() as c:
                c.executemany("DELETE FROM vectors_to_zero WHERE seq = ?", [(s,) for s in recorded])
        finally:
            self._w.execute("PRAGMA synchronous=FULL")
        return len(recorded)

    def withdrawn_rows(self) -> list[tuple[str, str, float, str, np.ndarray]]:
        """Every withdrawn image: (sha256, id, at, identity, vector)."""
        return [(sha, pid, at, ident, np.frombuffer(v, dtype="<f4").copy()) for sha, pid, at, ident, v in
                self._r.execute("SELECT sha256, id, at, identity, vector FROM withdrawn ORDER BY at")]

    def readmit(self, shas: Sequence[str]) -> int:
        """Forget these withdrawn images (an admin re-admitted them): their rows and kept vectors go."""
        with self._txn() as c:
            n = sum(c.execute("DELETE FROM withdrawn WHERE sha256 = ?", (sha,)).rowcount for sha in shas)
        self.checkpoint()
        return n

    def checkpoint(self) -> bool:
        """Copy the WAL into the database and truncate it (deleted bytes leave the WAL). False if busy."""
        busy = self._w.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
        return not busy

    # --- reads ------------------------------------------------------------------------------------------
    @staticmethod
    def _get_many(conn: sqlite3.Connection, seqs: Sequence[int]) -> list[ItemRow]:
        out: list[ItemRow] = []
        for start in range(0, len(seqs), 500):
            chunk = list(seqs[start:start + 500])
            marks = ",".join("?" * len(chunk))
            out += [_row(r) for r in conn.execute(f"SELECT {_COLS} FROM items WHERE seq IN ({marks})", chunk)]
        return out

    def get_many(self, seqs: Sequence[int]) -> list[ItemRow]:
        return self._get_many(self._r, seqs)

    def get(self, seq: int) -> ItemRow | None:
        r = self._r.execute(f"SELECT {_COLS} FROM items WHERE seq = ?", (seq,)).fetchone()
        return _row(r) if r else None

    def vector(self, seq: int) -> np.ndarray | None:
        r = self._r.execute("SELECT vector FROM items WHERE seq = ?", (seq,)).fetchone()
        if r is None:
            return None
        if self.vectors is not None:
            return self.vectors.read(np.array([seq]))[0]
        return np.frombuffer(r[0], dtype="<f4").copy()

    def find_sha(self, shas: Sequence[str], *, writer: bool = False) -> dict[str, int]:
        conn = self._w if writer else self._r
        out: dict[str, int] = {}
        for start in range(0, len(shas), 500):
            chunk = list(shas[start:start + 500])
            marks = ",".join("?" * len(chunk))
            out.update(conn.execute(f"SELECT sha256, seq FROM items WHERE sha256 IN ({marks})", chunk).fetchall())
        return out

    def page(self, *, after: int, limit: int, source: str | None, label: str | None = None) -> list[ItemRow]:
        """Items after ``after`` in id order, only those with this source and/or label when given."""
        where, args = self._filter(source, label)
        q = f"SELECT {_COLS} FROM items WHERE {where} seq > ? ORDER BY seq LIMIT ?"
        return [_row(r) for r in self._r.execute(q, (*args, after, limit))]

    def count(self, source: str | None = None, label: str | None = None) -> int:
        where, args = self._filter(source, label)
        return int(self._r.execute(f"SELECT count(*) FROM items WHERE {where} 1", args).fetchone()[0])

    @staticmethod
    def _filter(source: str | None, label: str | None) -> tuple[str, tuple[str, ...]]:
        """A WHERE prefix (each condition followed by AND) and its arguments."""
        conds = [(c, v) for c, v in (("source = ? AND ", source), ("label = ? AND ", label)) if v is not None]
        return "".join(c for c, _ in conds), tuple(v for _, v in conds)

    def labels(self) -> dict[str, int]:
        """Each label and how many items carry it (unlabelled items are not counted)."""
        return dict(self._r.execute(
            "SELECT label, count(*) FROM items WHERE label IS NOT NULL GROUP BY label ORDER BY label"))

    def labelled_rows(self) -> list[tuple[int, str]]:
        """(seq, label) of every labelled item, in seq order."""
        return list(self._r.execute("SELECT seq, label FROM items WHERE label IS NOT NULL ORDER BY seq"))

    def sources(self) -> dict[str, int]:
        return dict(self._r.execute("SELECT source, count(*) FROM items GROUP BY source ORDER BY source"))

    def present(self, seqs: np.ndarray) -> np.ndarray:
        """Which of these ids have a row now (a bool per id, in order): what an index kept outside the process is
        filtered by (a deleted id's row is gone, durably, before its delete is acknowledged)."""
        ids = np.asarray(seqs, dtype=np.int64)
        if not len(ids):
            return np.zeros(0, dtype=bool)
        uniq = np.unique(ids)
        rows = self._r.execute("SELECT seq FROM items WHERE seq IN (SELECT value FROM json_each(?))",
                               (json.dumps(uniq.tolist()),)).fetchall()
        have = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
        return np.isin(ids, have)

    def seqs_for_source(self, source: str) -> np.ndarray:
        rows = self._r.execute("SELECT seq FROM items WHERE source = ? ORDER BY seq", (source,)).fetchall()
        return np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))

    def state(self) -> DbState:
        """Generation, count and id checksum read in one snapshot."""
        c = self._r
        c.execute("BEGIN")
        try:
            gen = int(c.execute("SELECT value FROM meta WHERE key='generation'").fetchone()[0])
            count, chk = c.execute(
                f"SELECT count(*), coalesce(sum((seq * {CHECKSUM_MUL}) % {CHECKSUM_MOD}), 0) FROM items"
            ).fetchone()
        finally:
            c.execute("COMMIT")
        return DbState(gen, int(count), int(chk))

    def all_seqs(self) -> np.ndarray:
        """Every id, ascending."""
        rows = self._r.execute("SELECT seq FROM items ORDER BY seq").fetchall()
        return np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))

    def shas(self) -> set[str]:
        return {r[0] for r in self._r.execute("SELECT sha256 FROM items WHERE sha256 IS NOT NULL")}

    def iter_vectors(self, dim: int, batch: int = 65536) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(seqs [b], vectors [b, dim]) in seq order, from one read snapshot."""
        c = self._connect()  # a private connection: the snapshot stays open across yields
        try:
            c.execute("BEGIN")
            if self.vectors is not None:  # the rows of a committed id never change (zeroed once deleted)
                cur = c.execute("SELECT seq FROM items ORDER BY seq")
                while rows := cur.fetchmany(batch):
                    seqs = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
                    yield seqs, self.vectors.read(seqs)
            else:
                cur = c.execute("SELECT seq, vector FROM items ORDER BY seq")
                while rows := cur.fetchmany(batch):
                    seqs = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
                    vecs = np.frombuffer(b"".join(r[1] for r in rows), dtype="<f4").reshape(len(rows), dim)
                    yield seqs, vecs
            c.execute("COMMIT")
        finally:
            c.close()

    # --- re-embedding (resumable: new vectors staged in `reembed`, swapped in one transaction) -----------
    def reembed_done(self) -> int:
        return int(self._w.execute("SELECT coalesce(max(seq), 0) FROM reembed").fetchone()[0])

    def reembed_todo(self, after: int, limit: int) -> list[tuple[int, str | None]]:
        return list(self._w.execute(
            "SELECT seq, sha256 FROM items WHERE seq > ? ORDER BY seq LIMIT ?", (after, limit)))

    def reembed_stage(self, seqs: Sequence[int], vectors: np.ndarray) -> None:
        with self._txn() as c:
            c.executemany("INSERT OR REPLACE INTO reembed VALUES (?, ?)",
                          [(s, np.ascontiguousarray(v, dtype="<f4").tobytes()) for s, v in zip(seqs, vectors,
                                                                                              strict=True)])

    def reembed_finish(self, meta: dict[str, str]) -> None:
        if self.vectors is not None:  # staged rows into the file first (fsynced): repeating it after a crash is a no-op
            dim = self.vectors.dim  # only items still there: a deleted item's zeroed row is never written again
            cur = self._w.execute("SELECT r.seq, r.vector FROM reembed r JOIN items i ON i.seq = r.seq ORDER BY r.seq")
            while rows := cur.fetchmany(65536):
                self.vectors.write(np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows)),
                                   np.frombuffer(b"".join(r[1] for r in rows), dtype="<f4").reshape(len(rows), dim))
            self.vectors.flush()
        with self._txn() as c:
            if self.vectors is None:
                c.execute("UPDATE items SET vector = (SELECT r.vector FROM reembed r WHERE r.seq = items.seq) "
                          "WHERE seq IN (SELECT seq FROM reembed)")
            c.execute("DELETE FROM reembed")
            c.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", list(meta.items()))
            self._bump()

    def reembed_reset(self) -> None:
        with self._txn() as c:
            c.execute("DELETE FROM reembed")

    def close(self) -> None:
        if self.vectors is not None:
            self.vectors.close()
            self.vectors = None
        with self._conns_lock:
            for conn in [self._w, *self._conns]:
                conn.close()
            self._conns.clear()
