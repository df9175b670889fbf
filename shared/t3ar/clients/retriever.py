"""HTTP client for the retriever service, and :class:`RetrieverProvider`, the
:class:`~t3ar.method.retrieval.NeighbourProvider` the adaptation harness uses to reach a remote pool.

Retries (:class:`~t3ar.clients.http.HttpClient`): connection failures before the request was sent and 503
(not ready) are always retried; read timeouts, dropped connections and 502/504 only for calls that are safe to
repeat (reads, searches, image adds — the pool stores each sha256 once, so a repeated add answers ``exists`` —
and deletes, where a 404 on a retry means the first attempt succeeded). Exponential back-off with jitter,
honouring ``Retry-After``. Errors come back as :mod:`t3ar.clients.retriever_errors` classes carrying the
server's message.
"""

from __future__ import annotations

import base64
import io
import json
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np
from PIL import Image

from t3ar.clients.http import HttpClient
from t3ar.clients.retriever_errors import (
    RetrieverError,
    RetrieverNotFoundError,
    RetrieverUnavailableError,
    error_from_response,
)
from t3ar.clients.retriever_models import (
    AddResponse,
    DeleteResponse,
    EmbedResponse,
    ExistsResponse,
    HealthResponse,
    ItemOut,
    ItemPage,
    NearDuplicatesResponse,
    SearchResponse,
    StatsResponse,
    VectorsAddResponse,
    WithdrawnOut,
)
from t3ar.urls import path_segment

if TYPE_CHECKING:
    import torch

ImageInput = Path | str | bytes | tuple[str, bytes]
"""A file path, raw file bytes, or ``(file name, bytes)``."""


@dataclass(frozen=True)
class SearchResult:
    """Per query: ids best first and their inner-product scores (rows may be shorter than k)."""

    ids: list[list[str]]
    scores: list[list[float]]
    identity: str
    # the class label of each id (None: unlabelled); all None when the pool holds no labelled item
    labels: list[list[str | None]] = field(default_factory=list)


def _as_file(item: ImageInput, i: int) -> tuple[str, bytes]:
    if isinstance(item, tuple):
        return item
    if isinstance(item, bytes | bytearray):
        return f"image-{i}", bytes(item)
    path = Path(item)
    return path.name, path.read_bytes()


def _item_path(item_id: str) -> str:
    """``/pool/<id>`` with the id as one path segment, whatever it holds (``/``, ``?``, control characters,
    ``.`` or ``..``): percent-encoded, so it reaches the retriever as given. An empty id names nothing."""
    if not item_id:
        raise RetrieverNotFoundError("no pool item '' (an id is never empty)", status=404, code="not_found")
    return f"/pool/{path_segment(item_id)}"


class RetrieverClient(HttpClient):
    service = "retriever"
    start_hint = "is it running?"
    prefix = "retriever "
    unavailable_error = RetrieverUnavailableError

    def _error(self, resp: httpx.Response, what: str) -> RetrieverError:
        try:
            body = resp.json()
        except ValueError:
            body = None
        return error_from_response(resp.status_code, body, resp.text, what)

    # --- ops ---------------------------------------------------------------------------------------------
    def health(self) -> HealthResponse:
        return self._answer(HealthResponse, "GET", "/health")

    def ready(self) -> bool:
        try:
            return self._http.get("/ready").status_code == 200
        except httpx.HTTPError:
            return False

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready():
            if time.monotonic() > deadline:
                raise RetrieverUnavailableError(f"retriever at {self.url} not ready after {timeout:.0f}s")
            time.sleep(0.2)

    def stats(self) -> StatsResponse:
        return self._answer(StatsResponse, "GET", "/stats")

    def metrics(self) -> str:
        return self._request("GET", "/metrics", safe=True).text

    # --- pool --------------------------------------------------------------------------------------------
    def add_images(self, images: Sequence[ImageInput], *, source: str = "", metadata: dict[str, Any] | None = None,
                   atomic: bool = False, duplicate_policy: str | None = None,
                   label: str | None = None) -> AddResponse:
        """Upload images and/or zip/tar archives, each new one with class ``label`` (None: unlabelled); returns
        the per-item report (``items``, counts). Raises RetrieverInputError (with ``items``) when nothing could
        be committed."""
        files = [("files", _as_file(x, i)) for i, x in enumerate(images)]
        data: dict[str, str] = {"source": source, "metadata": json.dumps(metadata or {}),
                                "atomic": "true" if atomic else "false"}
        if label:
            data["label"] = label
        if duplicate_policy:
            data["duplicate_policy"] = duplicate_policy
        return self._answer(AddResponse, "POST", "/pool", files=files, data=data)

    def add_vectors(self, vectors: np.ndarray, *, identity: str, source: str = "",
                    label: str | None = None) -> list[str]:
        """Vectors-only pools (admin token): bulk-add float32 vectors, each with class ``label`` (None:
        unlabelled); returns their ids in order."""
        body = np.ascontiguousarray(vectors, dtype="<f4").tobytes()
        return self._answer(VectorsAddResponse, "POST", "/pool/vectors", safe=False, content=body,
                            params={"identity": identity, "source": source, "label": label or ""},
                            headers={"Content-Type": "application/octet-stream"}).ids

    def exists(self, sha256s: Sequence[str]) -> dict[str, str]:
        """sha256 (hex of the file bytes) -> id, for those already in the pool."""
        found: dict[str, str] = {}
        for start in range(0, len(sha256s), 10_000):
            found.update(self._answer(ExistsResponse, "POST", "/pool/exists",
                                      json={"sha256": list(sha256s[start:start + 10_000])}).found)
        return found

    def list_items(self, *, after: str | None = None, limit: int = 100, source: str | None = None,
                   label: str | None = None) -> ItemPage:
        params: dict[str, Any] = {"limit": limit}
        if after:
            params["after"] = after
        if source is not None:
            params["source"] = source
        if label is not None:
            params["label"] = label
        return self._answer(ItemPage, "GET", "/pool", params=params)

    def iter_items(self, *, source: str | None = None, page_size: int = 1000,
                   label: str | None = None) -> Iterator[ItemOut]:
        after = None
        while True:
            page = self.list_items(after=after, limit=page_size, source=source, label=label)
            yield from page.items
            after = page.next_after
            if after is None:
                return

    def get_item(self, item_id: str) -> ItemOut:
        return self._answer(ItemOut, "GET", _item_path(item_id))

    def get_image(self, item_id: str) -> bytes:
        return self._request("GET", f"{_item_path(item_id)}/image", safe=True).content

    def delete(self, item_id: str) -> None:
        """Withdraw one item (admin token). Unknown id -> RetrieverNotFoundError."""
        self._request("DELETE", _item_path(item_id), safe=True, ok_404_on_retry=True)

    def delete_many(self, ids: Sequence[str], *, missing_ok: bool = False, withdraw: bool = True) -> DeleteResponse:
        """Withdraw all of ``ids`` (admin token): all or none, unless ``missing_ok``. ``withdraw=False`` (a
        compaction): their content is not refused at ingest afterwards."""
        body: dict[str, Any] = {"ids": list(ids), "missing_ok": missing_ok}
        if not withdraw:
            body["withdraw"] = False
        return self._answer(DeleteResponse, "POST", "/pool/delete", json=body)

    def withdrawal(self, item_id: str) -> WithdrawnOut | None:
        """Admin: the withdrawal of image item ``item_id`` (id, sha256, withdrawn_at), None when it was never
        withdrawn (or was re-admitted)."""
        try:
            return self._answer(WithdrawnOut, "GET", f"/pool/withdrawn/{path_segment(item_id)}", safe=True)
        except RetrieverNotFoundError:
            return None

    def readmit(self, item_id: str) -> WithdrawnOut:
        """Admin: lift the withdrawal of ``item_id`` (its content may be added again). Not withdrawn: 404."""
        return self._answer(WithdrawnOut, "POST", f"/pool/withdrawn/{path_segment(item_id)}/readmit")

    def near_duplicates(self, *, threshold: float, sources: Sequence[str], nprobe: int = 2,
                        timeout: float | None = None) -> NearDuplicatesResponse:
        """Admin: the items of ``sources`` a compaction would remove (near-duplicates of items that stay); read-only.
        ``timeout``: seconds for this call (a scan of a large pool takes minutes)."""
        extra: dict[str, Any] = {} if timeout is None else {"timeout": httpx.Timeout(timeout, connect=10.0)}
        return self._answer(NearDuplicatesResponse, "POST", "/pool/near-duplicates", safe=True,
                            json={"threshold": threshold, "sources": list(sources), "nprobe": nprobe}, **extra)

    # --- search ------------------------------------------------------------------------------------------
    def embed(self, images: Sequence[ImageInput]) -> np.ndarray:
        """Embed with the pool's retriever R -> float32 [N, dim] unit vectors."""
        files = [("files", _as_file(x, i)) for i, x in enumerate(images)]
        out = self._answer(EmbedResponse, "POST", "/embed", files=files, params={"encoding": "base64"})
        return np.frombuffer(base64.b64decode(out.vectors_b64 or ""), dtype="<f4").reshape(out.count, out.dim)

    def search(self, vectors: np.ndarray, k: int, *, r: int = 1, seed: int = 0, exclude_ids: Sequence[str] = (),
               source: str | None = None, identity: str | None = None, label: str | None = None) -> SearchResult:
        """Top-k pool items per query vector; ``source``/``label``: only items with that source tag / class label."""
        q = np.ascontiguousarray(np.atleast_2d(vectors), dtype="<f4")
        body: dict[str, Any] = {"vectors_b64": base64.b64encode(q.tobytes()).decode(), "k": k, "r": r,
                                "seed": seed, "exclude_ids": list(exclude_ids), "source": source,
                                "identity": identity}
        if label is not None:
            body["label"] = label
        return self._search(body)

    def search_images(self, images: Sequence[ImageInput], k: int, *, r: int = 1, seed: int = 0,
                      exclude_ids: Sequence[str] = (), source: str | None = None) -> SearchResult:
        body: dict[str, Any] = {"images_b64": [base64.b64encode(_as_file(x, i)[1]).decode()
                                               for i, x in enumerate(images)],
                                "k": k, "r": r, "seed": seed, "exclude_ids": list(exclude_ids), "source": source}
        return self._search(body)

    def _search(self, body: dict[str, Any]) -> SearchResult:
        out = self._post_json(SearchResponse, "/search", body)
        return SearchResult([row.ids for row in out.results], [row.scores for row in out.results], out.identity,
                            [row.labels or [None] * len(row.ids) for row in out.results])


class RetrieverProvider:
    """:class:`~t3ar.method.retrieval.NeighbourProvider` backed by a retriever service."""

    def __init__(self, client: RetrieverClient, *, batch_size: int = 128, fetch_workers: int = 4) -> None:
        self.client = client
        self.batch_size = batch_size
        self.fetch_workers = fetch_workers
        self._identity: str | None = None
        self._labels: dict[str, str | None] = {}  # pool id -> label, as the search answers gave them

    @property
    def identity(self) -> str:
        if self._identity is None:
            self._identity = self.client.stats().identity
        return self._identity

    def size(self) -> int:
        return self.client.stats().count

    def embed(self, images: torch.Tensor) -> np.ndarray:
        """uint8 [N,3,H,W] -> PNGs -> ``/embed`` in batches -> float32 [N, d]."""
        if images.dtype.is_floating_point or images.ndim != 4 or images.shape[1] != 3:
            raise ValueError("images must be a uint8 tensor [N, 3, H, W]")
        arr = images.permute(0, 2, 3, 1).contiguous().cpu().numpy()
        out = []
        for start in range(0, len(arr), self.batch_size):
            pngs = []
            for j, a in enumerate(arr[start:start + self.batch_size]):
                buf = io.BytesIO()
                Image.fromarray(a).save(buf, format="PNG", compress_level=1)
                pngs.append((f"query-{start + j}.png", buf.getvalue()))
            out.append(self.client.embed(pngs))
        return np.concatenate(out) if out else np.empty((0, 0), dtype=np.float32)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, list[list[str]]]:
        """Top-k per query; rows padded with '' (score -inf) when the pool has fewer than k items."""
        return self.search_label(queries, k, None)

    def search_label(self, queries: np.ndarray, k: int, label: str | None) -> tuple[np.ndarray, list[list[str]]]:
        """:meth:`search` among the items labelled ``label`` only (None: every item): class-conditional retrieval
        (:class:`t3ar.retrieval_ranking.LabelSearch`)."""
        n = len(queries)
        scores = np.full((n, k), -np.inf, dtype=np.float32)
        ids: list[list[str]] = []
        for start in range(0, n, self.batch_size):
            res = self.client.search(queries[start:start + self.batch_size], k, identity=self._identity,
                                     label=label)
            for i, (row_ids, row_s) in enumerate(zip(res.ids, res.scores, strict=True)):
                self._labels.update(zip(row_ids, res.labels[i], strict=True))
                scores[start + i, :len(row_s)] = row_s
                ids.append(list(row_ids) + [""] * (k - len(row_ids)))
        return scores, ids

    def all_ids(self) -> list[str]:
        return [item.id for item in self.client.iter_items(page_size=1000)]

    def sources(self, ids: Sequence[str]) -> list[str]:
        """Each item's ``source`` (one metadata read per id, in parallel)."""
        with ThreadPoolExecutor(max_workers=self.fetch_workers) as ex:
            return [item.source for item in ex.map(self.client.get_item, ids)]

    def labels(self, ids: Sequence[str]) -> list[str | None]:
        """Each item's pool ``label`` (None = unlabelled): what the search answers carried (no call), and one
        metadata read per id that no search of this provider returned (in parallel)."""
        unseen = [i for i in dict.fromkeys(ids) if i not in self._labels]
        if unseen:
            with ThreadPoolExecutor(max_workers=self.fetch_workers) as ex:
                self._labels.update((i, item.label or None)
                                    for i, item in zip(unseen, ex.map(self.client.get_item, unseen), strict=True))
        return [self._labels[i] for i in ids]

    def fetch(self, ids: Sequence[str]) -> list[Image.Image]:
        """Download and decode (RGB, alpha on white) the pool images, in order."""
        from t3ar.data.images import open_image

        with ThreadPoolExecutor(max_workers=self.fetch_workers) as ex:
            blobs = list(ex.map(self.client.get_image, ids))
        return [open_image(b) for b in blobs]


__all__ = ["RetrieverClient", "RetrieverProvider", "SearchResult", "RetrieverError", "ImageInput"]
