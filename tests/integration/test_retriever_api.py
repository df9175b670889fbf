"""Retriever round-trips against a real uvicorn process: add / get / list / search / embed / delete."""

from __future__ import annotations

import hashlib
import io
import signal
import sqlite3
import zipfile
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import numpy as np
import pytest
import torch
from PIL import Image

from t3ar.clients.retriever import RetrieverClient, RetrieverProvider
from t3ar.clients.retriever_errors import RetrieverNotFoundError
from t3ar.clients.retriever_models import ItemOut
from t3ar.method.config import AdaptConfig
from t3ar.pipeline import retrieve

if TYPE_CHECKING:
    from conftest import RetrieverProcess


@pytest.fixture(scope="module", params=["faiss", "milvus",
                                        pytest.param("milvus-server", marks=pytest.mark.milvus_server)])
def retriever_module(request: pytest.FixtureRequest,
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[RetrieverProcess]:
    """One retriever per pool backend (issues 12, 29): every test of this module runs on faiss, on milvus-lite and
    on a real Milvus server (the session's ``milvus_server``)."""
    from conftest import start_retriever

    env = {"T3AR_RETRIEVER_BACKEND": "faiss" if request.param == "faiss" else "milvus"}
    if request.param == "milvus":
        pytest.importorskip("milvus_lite", reason="the milvus extra (pymilvus + milvus-lite) is not installed")
    elif request.param == "milvus-server":
        pytest.importorskip("pymilvus", reason="the milvus extra (pymilvus) is not installed")
        env["T3AR_RETRIEVER_MILVUS_URI"] = request.getfixturevalue("milvus_server").uri
    rp = start_retriever(tmp_path_factory.mktemp(f"retriever-{request.param}") / "pool", env)
    yield rp
    rp.stop(signal.SIGKILL)


@pytest.fixture(scope="module")
def seeded(retriever_module: RetrieverProcess, make_png: Callable[..., bytes]) -> dict[str, str]:
    """20 items: seeds 0..9 with source 'a', 10..19 with source 'b'. Returns seed name -> id."""
    retriever_png = make_png
    with retriever_module.client() as c:
        ids: dict[str, str] = {}
        for src, seeds in (("a", range(10)), ("b", range(10, 20))):
            rep = c.add_images([(f"s{i}.png", retriever_png(i)) for i in seeds], source=src,
                               metadata={"licence": "cc0"})
            assert rep.added == 10, rep
            ids.update({it.name: it.id for it in rep.items})
    return ids


def test_get_metadata_image_and_listing(retriever_module: RetrieverProcess, seeded: dict[str, str],
                                        make_png: Callable[..., bytes]) -> None:
    with retriever_module.client() as c:
        item = c.get_item(seeded["s3.png"])
        assert item.source == "a" and item.metadata["licence"] == "cc0"
        assert item.filename == "s3.png" and item.media_type == "image/png"
        assert (item.width, item.height) == (64, 64)
        data = c.get_image(seeded["s3.png"])
        assert data == make_png(3) and item.sha256 == hashlib.sha256(data).hexdigest()
        page = c.list_items(limit=7, source="b")
        assert page.total == 10 and len(page.items) == 7 and page.next_after
        listed = [it.id for it in c.iter_items(source="b", page_size=3)]
        assert listed == [seeded[f"s{i}.png"] for i in range(10, 20)]
        assert c.exists([item.sha256, "0" * 64]) == {item.sha256: seeded["s3.png"]}


def test_search_by_image_vector_with_filters(retriever_module: RetrieverProcess, seeded: dict[str, str],
                                             make_png: Callable[..., bytes]) -> None:
    with retriever_module.client() as c:
        res = c.search_images([make_png(5), make_png(12)], k=3)
        assert [row[0] for row in res.ids] == [seeded["s5.png"], seeded["s12.png"]]
        assert res.scores[0][0] == pytest.approx(1.0, abs=1e-4)
        assert all(row[0] >= row[1] >= row[2] for row in res.scores)
        vec = c.embed([make_png(5)])
        assert vec.shape == (1, c.stats().dim) and np.linalg.norm(vec) == pytest.approx(1.0, abs=1e-4)
        assert c.search(vec, k=1).ids[0] == [seeded["s5.png"]]
        assert seeded["s5.png"] not in c.search(vec, k=5, exclude_ids=[seeded["s5.png"], "junk"]).ids[0]
        in_b = c.search(vec, k=5, source="b").ids[0]
        assert len(in_b) == 5 and set(in_b) <= {seeded[f"s{i}.png"] for i in range(10, 20)}
        everything = c.search(vec, k=1000).ids[0]  # k larger than the pool: fewer results, never -1/''
        assert sorted(everything) == sorted(set(everything)) and "" not in everything
        top15 = set(c.search(vec, k=15).ids[0])
        a = c.search(vec, k=5, r=3, seed=7).ids[0]
        assert a == c.search(vec, k=5, r=3, seed=7).ids[0] and set(a) <= top15 and len(a) == 5


def test_delete_withdraws_everywhere(retriever_module: RetrieverProcess, make_png: Callable[..., bytes]) -> None:
    with retriever_module.client() as c:
        rep = c.add_images([("d0.png", make_png(40)), ("d1.png", make_png(41)), ("d2.png", make_png(42))])
        d0, d1, d2 = (it.id for it in rep.items)
        sha0 = rep.items[0].sha256
        vec = c.embed([make_png(40)])
        c.delete(d0)
        with pytest.raises(RetrieverNotFoundError):
            c.get_item(d0)
        with pytest.raises(RetrieverNotFoundError):
            c.get_image(d0)
        assert d0 not in c.search(vec, k=1000).ids[0]
        assert not (retriever_module.data_dir / "blobs" / sha0[:1] / sha0).exists()
        with sqlite3.connect(retriever_module.data_dir / "pool.sqlite3") as db:
            assert db.execute("SELECT count(*) FROM items WHERE sha256 = ?", (sha0,)).fetchone()[0] == 0
        with pytest.raises(RetrieverNotFoundError, match="nothing was deleted"):
            c.delete_many([d1, d0])
        assert c.get_item(d1).id == d1  # all or nothing
        out = c.delete_many([d1, d2, d0], missing_ok=True)
        assert (out.deleted, out.not_found) == ([d1, d2], [d0])
        with pytest.raises(RetrieverNotFoundError):
            c.delete(d0)
        assert c.exists([sha0]) == {}
        readd = c.add_images([("d0.png", make_png(40))])  # re-adding gives a new id, never the withdrawn one
        assert readd.items[0].status == "added" and readd.items[0].id not in (d0, d1, d2)


def test_duplicates_exact_and_near(retriever_module: RetrieverProcess, make_png: Callable[..., bytes]) -> None:
    base = make_png(50)
    arr = np.asarray(Image.open(io.BytesIO(base))).copy()
    arr[0, 0] = 255 - arr[0, 0]  # one pixel changed: different bytes, nearly the same embedding
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    near = buf.getvalue()
    with retriever_module.client() as c:
        rep = c.add_images([("x.png", base), ("x-again.png", base), ("x-near.png", near)])
        x, again, nd = rep.items
        assert x.status == "added"
        assert again.status == "exists" and again.id == x.id
        assert nd.status == "duplicate" and nd.duplicate_of == x.id and nd.score >= 0.98
        assert nd.id is None and c.exists([nd.sha256]) == {}
        kept = c.add_images([("x-near.png", near)], duplicate_policy="keep").items[0]
        assert kept.status == "added" and kept.duplicate_of == x.id
        assert c.add_images([("x.png", base)]).items[0].status == "exists"


def test_archive_upload_reports_per_item(retriever_module: RetrieverProcess, make_png: Callable[..., bytes]) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("set/a.png", make_png(60))
        zf.writestr("set/b.png", make_png(61))
        zf.writestr("set/readme.txt", b"hello")
        zf.writestr("set/broken.png", b"\x89PNG\r\n\x1a\nnot really")
    with retriever_module.client() as c:
        rep = c.add_images([("batch.zip", buf.getvalue())], source="zip")
    status = {it.name: it.status for it in rep.items}
    assert status == {"batch.zip/set/a.png": "added", "batch.zip/set/b.png": "added",
                      "batch.zip/set/broken.png": "rejected", "batch.zip/set/readme.txt": "rejected"}
    codes = {it.name: it.error.code for it in rep.items if it.error}
    assert codes == {"batch.zip/set/broken.png": "bad_image", "batch.zip/set/readme.txt": "not_image"}


def test_stats_and_metrics(retriever_module: RetrieverProcess, seeded: dict[str, str]) -> None:
    with retriever_module.client() as c:
        st = c.stats()
        assert st.ready and st.count >= 20
        assert st.index.type == {"faiss": "flat", "milvus": "milvus"}[st.backend]
        assert c.health().backend == st.backend
        assert st.identity.startswith("timm:tf_efficientnet_lite0:") and st.dim == 1280
        assert st.sources["a"] == 10
        text = c.metrics()
    for name in ("t3ar_retriever_request_seconds_bucket", "t3ar_retriever_pool_items", "t3ar_retriever_adds_total",
                 "t3ar_retriever_searches_total", "t3ar_retriever_deletes_total"):
        assert name in text
    assert 'route="/pool/{item_id}"' in text or 'route="/search"' in text


def test_provider_serves_the_adaptation_harness(retriever_module: RetrieverProcess, seeded: dict[str, str],
                                               make_png: Callable[..., bytes]) -> None:
    """RetrieverProvider satisfies NeighbourProvider: the harness' retrieve() runs against the service."""
    client = RetrieverClient(retriever_module.url, "test-rw-token")
    provider = RetrieverProvider(client, batch_size=4)
    target = torch.stack([torch.from_numpy(np.array(Image.open(io.BytesIO(make_png(s))).convert("RGB")))
                          .permute(2, 0, 1) for s in (1, 11, 70)])
    assert provider.identity == client.stats().identity and provider.size() >= 20
    vecs = provider.embed(target)
    assert vecs.shape == (3, 1280)
    scores, ids = provider.search(vecs, 2)
    assert ids[0][0] == seeded["s1.png"] and ids[1][0] == seeded["s11.png"] and scores.shape == (3, 2)
    assert set(seeded.values()) <= set(provider.all_ids())
    got = retrieve(provider, target, AdaptConfig(k=2, r=2), 32, torch.Generator().manual_seed(0))
    assert got.neighbours.shape == (3, 2) and int(got.neighbours.min()) >= 0
    assert got.pool_images.shape[1:] == (3, 32, 32) and len(got.pool_ids) == got.pool_images.shape[0]
    assert all(img.mode == "RGB" for img in provider.fetch(got.pool_ids[:2]))
    client.close()


def test_labels_are_stored_listed_filtered_and_travel_with_search_results(
        retriever_module: RetrieverProcess, seeded: dict[str, str], make_png: Callable[..., bytes]) -> None:
    """Issue 33, on every backend: an item's class label is stored with it, answered by item GETs and listings
    (``?label=`` filters), counted in stats, and each search result carries its ids' labels, so a worker's
    provider knows its neighbours' labels without reading any item."""
    with retriever_module.client() as c:
        dogs = c.add_images([(f"d{i}.png", make_png(80 + i)) for i in range(3)], source="zoo", label="dog")
        cat = c.add_images([("c.png", make_png(90))], source="zoo", label="cat")
        again = c.add_images([("d0-again.png", make_png(80))], label="fox")  # an add never relabels
        dog_ids = [it.id for it in dogs.items]
        assert again.items[0].status == "exists" and again.items[0].id == dog_ids[0]
        assert c.get_item(dog_ids[0]).label == "dog" and c.get_item(seeded["s3.png"]).label is None
        page = c.list_items(label="dog", limit=2)
        assert page.total == 3 and [it.id for it in page.items] == dog_ids[:2]
        assert [it.id for it in c.iter_items(label="dog", page_size=2)] == dog_ids
        assert c.list_items(label="cat", source="zoo").total == 1 and c.list_items(label="cat", source="a").total == 0
        assert c.stats().labels == {"cat": 1, "dog": 3}
        res = c.search_images([make_png(81), make_png(90), make_png(5)], k=2)
        assert res.ids[0][0] == dog_ids[1] and res.labels[0][0] == "dog"
        assert res.ids[1][0] == cat.items[0].id and res.labels[1][0] == "cat"
        assert res.ids[2][0] == seeded["s5.png"] and res.labels[2][0] is None
    client = RetrieverClient(retriever_module.url, "test-rw-token")
    gets = 0
    real_get = client.get_item

    def counting_get(item_id: str) -> ItemOut:
        nonlocal gets
        gets += 1
        return real_get(item_id)

    client.get_item = counting_get  # type: ignore[method-assign]
    provider = RetrieverProvider(client)
    _, ids = provider.search(client.embed([make_png(82), make_png(3)]), 2)
    assert provider.labels([ids[0][0], ids[1][0]]) == ["dog", None] and gets == 0
    assert provider.labels([cat.items[0].id]) == ["cat"] and gets == 1  # never returned by a search
    client.close()
