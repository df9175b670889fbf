"""SQLite: the source of truth for item metadata and embedding vectors (the faiss index is derived).

WAL journal with ``synchronous=FULL``: a committed transaction survives power loss. ``secure_delete`` zeroes
deleted rows' bytes, and :meth:`Store.checkpoint` (after deletes) moves them out of the WAL file too.
``seq`` (INTEGER PRIMARY KEY AUTOINCREMENT) is the faiss id and is never reused after a delete.
``label`` (a class name, NULL = unlabelled; issue 33) came after the first data dirs: a database without the
column gets it on open (``ALTER TABLE ... ADD COLUMN``, every old item unlabelled), no migration step needed.
Writes go through one connection guarded by the caller's writer lock; reads use one connection per thread.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

SCHEMA_VERSION = "1"
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
                     it.media_type, it.size, it.width, it.height, now,
                     np.ascontiguousarray(it.vector, dtype="<f4").tobytes(), it.label))
                assert cur.lastrowid is not None
                seqs.append(cur.lastrowid)
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
                ((s, source, meta, now, v.tobytes(), label) for s, v in zip(seqs, vecs, strict=True)))
            self._bump()
        return seqs

    def delete(self, seqs: Sequence[int]) -> list[ItemRow]:
        """Delete these rows in one transaction; returns the rows that existed (committed on return)."""
        with self._txn() as c:
            rows = self._get_many(c, seqs)
            c.executemany("DELETE FROM items WHERE seq = ?", [(r.seq,) for r in rows])
            if rows:
                self._bump()
        return rows

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
        return np.frombuffer(r[0], dtype="<f4").copy() if r else None

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
        with self._txn() as c:
            c.execute("UPDATE items SET vector = (SELECT r.vector FROM reembed r WHERE r.seq = items.seq) "
                      "WHERE seq IN (SELECT seq FROM reembed)")
            c.execute("DELETE FROM reembed")
            c.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", list(meta.items()))
            self._bump()

    def reembed_reset(self) -> None:
        with self._txn() as c:
            c.execute("DELETE FROM reembed")

    def close(self) -> None:
        with self._conns_lock:
            for conn in [self._w, *self._conns]:
                conn.close()
            self._conns.clear()
