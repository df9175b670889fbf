"""Withdrawal is by content, not by id (issue 50, N2): after ``DELETE /pool/{id}`` the same bytes, and a
near-duplicate by the ingest's own rule (the same pixels re-encoded), are refused at ingest with a 422 naming the
withdrawn id and when; after a restart of the retriever too; on the faiss backend and on a real Milvus server;
until an admin re-admits the content. A compaction's delete (``withdraw: false``) refuses nothing. Real retriever
processes over HTTP on 127.0.0.1, the default embedder."""

from __future__ import annotations

import io
import signal
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from conftest import RETRIEVER_TOKEN
from PIL import Image

from t3ar.clients.retriever_errors import RetrieverAuthError, RetrieverInputError, RetrieverNotFoundError

if TYPE_CHECKING:
    from conftest import RetrieverProcess
    from milvus_server import MilvusServer

Factory = Callable[..., "RetrieverProcess"]


def _reencoded(png: bytes) -> bytes:
    """The same pixels in other bytes (another compression level and a text chunk): a near-duplicate by R's
    embedding, not by sha256."""
    from PIL import PngImagePlugin

    info = PngImagePlugin.PngInfo()
    info.add_text("Comment", "re-encoded")
    out = io.BytesIO()
    Image.open(io.BytesIO(png)).save(out, format="PNG", compress_level=1, pnginfo=info)
    assert out.getvalue() != png
    return out.getvalue()


def _refused(c: Any, data: bytes, name: str) -> str:
    with pytest.raises(RetrieverInputError) as e:
        c.add_images([(name, data)], source="again")
    assert e.value.status == 422, e.value
    item = e.value.items[0]
    assert item.status == "rejected" and item.error is not None and item.error.code == "withdrawn", item
    return item.error.message


def _round(rp_start: Callable[[], RetrieverProcess], make_png: Callable[..., bytes]) -> None:
    png, other, third = make_png(1), make_png(2), make_png(3)
    rp = rp_start()
    with rp.client() as c:
        out = c.add_images([("a.png", png), ("b.png", other)], source="s")
        first, second = (str(it.id) for it in out.items)
        c.delete(first)
        message = _refused(c, png, "a-again.png")  # the same bytes
        assert first in message and "withdrawn at" in message and "readmit" in message, message
        near = _refused(c, _reencoded(png), "a-reencoded.png")  # a near-duplicate by the ingest's rule (other bytes)
        assert first in near and "near-duplicate" in near, near
        mixed = c.add_images([("a.png", png), ("c.png", third)], source="s")  # a batch: the rest is added
        assert [it.status for it in mixed.items] == ["rejected", "added"], mixed
        assert c.withdrawal(first).id == first and c.withdrawal(second) is None
        third_id = mixed.items[1].id
        assert third_id is not None
        c.delete_many([third_id], withdraw=False)  # a compaction's delete refuses nothing afterwards
    assert rp.stop(signal.SIGTERM) in (0, -signal.SIGTERM)
    rp = rp_start()  # durable: after a restart too
    with rp.client() as c:
        assert first in _refused(c, png, "a-after-restart.png")
        assert c.add_images([("c.png", third)], source="s").added == 1
        with pytest.raises(RetrieverInputError):
            c.add_images([("a.png", png)], source="s", atomic=True)
        with rp.client(token=RETRIEVER_TOKEN) as rw, pytest.raises(RetrieverAuthError) as denied:
            rw.readmit(first)  # only an admin re-admits
        assert denied.value.status == 403
        assert c.readmit(first).id == first
        with pytest.raises(RetrieverNotFoundError):
            c.readmit(first)  # once
        again = c.add_images([("a.png", png)], source="s")
        assert again.added == 1 and again.items[0].id != first  # a new id: ids are never reused


def test_withdrawn_content_is_refused_on_faiss_across_a_restart(tmp_path: Path, retriever_factory: Factory,
                                                                make_png: Callable[..., bytes]) -> None:
    _round(lambda: retriever_factory(tmp_path / "pool"), make_png)


@pytest.mark.milvus_server
@pytest.mark.slow
def test_withdrawn_content_is_refused_on_a_milvus_server_across_a_restart(
        tmp_path: Path, retriever_factory: Factory, make_png: Callable[..., bytes],
        milvus_server: MilvusServer) -> None:
    pytest.importorskip("pymilvus", reason="the milvus extra (pymilvus) is not installed")
    env = {"T3AR_RETRIEVER_BACKEND": "milvus", "T3AR_RETRIEVER_MILVUS_URI": milvus_server.uri}
    _round(lambda: retriever_factory(tmp_path / "pool", env), make_png)
