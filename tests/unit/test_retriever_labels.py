"""Pool labels in the retriever's store and pool (issue 33): stored with an item, filtered, answered with
search results, and a data dir made before labels existed opens with every item unlabelled."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from test_retriever_store import _cand, _item, _pool, _vec

from t3ar.data.pool_labels import check_label
from t3ar.errors import InvalidInputError
from t3ar_services.retriever.labelmap import LabelMap
from t3ar_services.retriever.store import Store


def test_labels_are_stored_filtered_counted_and_looked_up(tmp_path: Path) -> None:
    store = Store(tmp_path / "p.sqlite3")
    seqs = store.insert([_item(0), _item(1)])
    seqs += store.insert([_item(2)])
    store.insert_vectors(np.stack([_vec(3)]), "v", {}, "cat")
    seqs += store.insert([replace(_item(4), label="dog"), replace(_item(5, "other"), label="dog")])
    assert store.labels() == {"cat": 1, "dog": 2}
    assert [r.label for r in store.get_many(seqs)] == [None, None, None, "dog", "dog"]
    assert [r.seq for r in store.page(after=0, limit=10, source=None, label="dog")] == seqs[3:]
    assert [r.seq for r in store.page(after=0, limit=10, source="other", label="dog")] == seqs[4:]
    assert store.count(label="dog") == 2 and store.count("other", "dog") == 1 and store.count("s") == 4
    assert store.labelled_rows() == [(seqs[2] + 1, "cat"), (seqs[3], "dog"), (seqs[4], "dog")]


def test_a_data_dir_made_before_labels_opens_unlabelled_and_takes_labels(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    conn = sqlite3.connect(path)  # the schema of the first data dirs (no label column)
    conn.executescript("""
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) STRICT;
        CREATE TABLE items (seq INTEGER PRIMARY KEY AUTOINCREMENT, sha256 TEXT UNIQUE, source TEXT NOT NULL,
            metadata TEXT NOT NULL, filename TEXT, media_type TEXT, size INTEGER NOT NULL, width INTEGER,
            height INTEGER, added_at REAL NOT NULL, vector BLOB NOT NULL) STRICT;
        INSERT INTO items (source, metadata, size, added_at, vector) VALUES ('old', '{}', 0, 0, x'00000000');""")
    conn.commit()
    conn.close()
    store = Store(path)
    [row] = store.get_many([1])
    assert row.label is None and row.source == "old" and store.labelled_rows() == []
    [seq] = store.insert([replace(_item(7), label="cat")])
    assert store.labelled_rows() == [(seq, "cat")]
    store.close()
    assert Store(path).labels() == {"cat": 1}  # reopened: the column is there, nothing added twice


def test_search_rows_carry_labels_only_once_the_pool_has_any(tmp_path: Path) -> None:
    pool = _pool(tmp_path)
    plain = pool.add([_cand("a", 0), _cand("b", 1)], source="", metadata={}, policy="keep")
    queries = np.stack([_vec(0), _vec(2)])
    assert pool.result_labels(pool.search_seqs(queries, 3)) is None  # nothing labelled: no labels at all
    lab = pool.add([_cand("c", 2)], source="", metadata={}, policy="keep", label="cat")
    again = pool.add([_cand("c-again", 2)], source="", metadata={}, policy="keep", label="dog")
    assert again[0].status == "exists" and again[0].id == lab[0].id  # an add never relabels
    rows = pool.search_seqs(queries, 3)
    got = pool.result_labels(rows)
    assert got is not None
    by_id = {pool.format_id(int(s)): lab_ for (seqs, _), labs in zip(rows, got, strict=True)
             for s, lab_ in zip(seqs.tolist(), labs, strict=True)}
    assert by_id == {plain[0].id: None, plain[1].id: None, lab[0].id: "cat"}
    pool.delete([str(lab[0].id)], missing_ok=False)
    assert all(v is None for row in (pool.result_labels(pool.search_seqs(queries, 3)) or []) for v in row)
    pool.store.close()
    reopened = _pool(tmp_path)  # labels are loaded from the database when the pool opens
    assert reopened.result_labels(reopened.search_seqs(queries, 3)) is None  # the one labelled item was deleted


def test_the_label_map_looks_up_many_seqs_at_once() -> None:
    labels = LabelMap([(7, "dog"), (3, "cat"), (9, "dog")])
    assert len(labels) == 3
    assert labels.lookup(np.array([3, 4, 7, 9, 100, 0])) == ["cat", None, "dog", "dog", None, None]
    labels.add([11, 12], "owl")
    labels.add([13], None)  # unlabelled: nothing held
    labels.add([5], "emu")  # out of order (never made): still found
    assert len(labels) == 6
    assert labels.lookup(np.array([12, 5, 13, 3])) == ["owl", "emu", None, "cat"]
    assert LabelMap([]).lookup(np.array([1, 2])) == [None, None]


@pytest.mark.parametrize("bad", ["x" * 201, "a\nb", "tab\there", "\x7f", "c1\x85", "\x9f", " dog", "dog ",
                                 "\u3000dog", "\ud800"])
def test_a_label_is_checked_like_every_text_field(bad: str) -> None:
    with pytest.raises(InvalidInputError, match="label"):
        check_label(bad)


def test_an_empty_label_is_no_label_and_a_class_name_is_kept() -> None:
    assert check_label("") is None and check_label(None) is None
    assert check_label("golden retriever") == "golden retriever" and check_label("x" * 200) == "x" * 200
