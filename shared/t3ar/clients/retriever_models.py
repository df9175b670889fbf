"""The retriever service's answers as models: the service serves them (its OpenAPI schema is generated from them)
and :class:`~t3ar.clients.retriever.RetrieverClient` returns them, so its callers read typed fields.

They live in the library because its client reads them (the library never imports the services); the service's
:mod:`t3ar_services.retriever.schemas` and :mod:`t3ar_services.retriever.curation` import them from here.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class ItemError(BaseModel):
    code: str
    message: str


class AddItemResult(BaseModel):
    name: str = Field(description="file name, or <archive>/<member path>")
    status: Literal["added", "exists", "duplicate", "rejected"]
    id: str | None = Field(default=None, description="the item's id (added, or exists: the id already holding it)")
    sha256: str | None = None
    duplicate_of: str | None = Field(default=None, description="closest near-duplicate (cosine >= threshold)")
    score: float | None = Field(default=None, description="cosine similarity to duplicate_of")
    error: ItemError | None = None


class AddResponse(BaseModel):
    items: list[AddItemResult]
    added: int
    exists: int
    duplicates: int
    rejected: int


class VectorsAddResponse(BaseModel):
    ids: list[str]


class ItemOut(BaseModel):
    id: str
    sha256: str | None
    source: str
    metadata: dict[str, Any]
    filename: str | None
    media_type: str | None
    size: int = Field(description="image bytes (0 for vector-only items)")
    width: int | None
    height: int | None
    added_at: float = Field(description="unix time")
    label: str | None = Field(default=None, description="class label (null: unlabelled)")


class ItemPage(BaseModel):
    items: list[ItemOut]
    next_after: str | None = Field(description="pass as ?after= for the next page; null at the end")
    total: int = Field(description="items matching the filter")


class ExistsResponse(BaseModel):
    found: dict[str, str] = Field(description="sha256 -> id, for those already in the pool")


class DeleteResponse(BaseModel):
    deleted: list[str]
    not_found: list[str]


class WithdrawnOut(BaseModel):
    """A withdrawn image whose content the pool refuses at ingest (its bytes are gone; its digest stays)."""

    id: str
    sha256: str
    withdrawn_at: str = Field(description="ISO 8601, UTC")


class EmbedResponse(BaseModel):
    identity: str
    dim: int
    count: int
    vectors: list[list[float]] | None = None
    vectors_b64: str | None = Field(default=None, description="float32 little-endian, row-major [count, dim]")


class QueryResult(BaseModel):
    """One query's neighbours."""

    ids: list[str] = Field(description="best first; fewer than k when fewer items qualify")
    scores: list[float] = Field(description="inner products (cosine for unit vectors), rounded to 6 decimals")
    labels: list[str | None] | None = Field(default=None, description="the class label of each id (null: "
                                            "unlabelled); absent when no item of the pool carries a label")


class SearchResponse(BaseModel):
    identity: str
    k: int
    results: list[QueryResult]


class IndexInfo(BaseModel):
    type: str
    configured_type: str
    vectors: int | None
    tombstones: int
    nlist: int | None
    nprobe: int | None
    device: str | None = Field(default=None, description="torch device of exact search (null: faiss on the CPU)")
    trained_on: int | None = Field(default=None, description="IVF: vectors in the pool when it was last trained")
    flat_cap: int | None = Field(default=None, description="IVF: the most vectors the exact index takes before the "
                                 "first training is in; adds beyond wait for it (T3AR_RETRIEVER_IVF_FLAT_MAX)")
    adds_held_s: float = Field(default=0.0, description="seconds adds have waited at that cap since start")


class StatsResponse(BaseModel):
    count: int
    dim: int
    identity: str
    kind: Literal["images", "vectors"]
    pool_tag: str
    sources: dict[str, int]
    labels: dict[str, int] = Field(default_factory=dict, description="items per class label (labelled items only)")
    backend: Literal["faiss", "milvus"] = Field(description="where the vector index lives (T3AR_RETRIEVER_BACKEND)")
    index: IndexInfo
    duplicate_threshold: float
    duplicate_policy: Literal["skip", "keep"]
    ready: bool
    repairs: list[str] = Field(description="what start-up repaired (index rebuilds, orphan blobs swept)")


class HealthResponse(BaseModel):
    status: Literal["ok"]
    backend: Literal["faiss", "milvus"] = Field(description="the pool backend (T3AR_RETRIEVER_BACKEND)")


class NearDuplicate(BaseModel):
    id: str
    source: str
    size: int = Field(description="bytes of the image blob (0 for a vectors-only item)")
    duplicate_of: str = Field(description="the item that stays, at cosine >= threshold")
    score: float


class NearDuplicatesResponse(BaseModel):
    remove: list[NearDuplicate] = Field(description="what a compaction removes, oldest first by duplicate_of")
    bytes: int = Field(description="image bytes the removals free")
    clusters: int = Field(description="items that stay and have at least one removed duplicate")
    scanned: int = Field(description="items of the given sources (the queries)")
    items: int = Field(description="items in the pool at the scan")
    method: str = Field(description="exact (up to 20k items) or ivf")
    nlist: int | None = None
    nprobe: int | None = None
    seconds: dict[str, float]
