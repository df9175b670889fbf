"""Request and response bodies of the retriever API (the OpenAPI schema at /docs is generated from these)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from t3ar_services.common.text import Utf8Str

#: the largest magnitude of a query vector's number: scores (at most a query's norm, pool vectors being unit
#: vectors) stay finite in float32 for any dimension up to 65,536
MAX_QUERY_NUMBER = 1e14
QueryNumber = Annotated[float, Field(ge=-MAX_QUERY_NUMBER, le=MAX_QUERY_NUMBER, allow_inf_nan=False)]
MAX_SAFE_INTEGER = 2**53 - 1  # larger JSON integers lose precision in double-based parsers and schema validators
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-fA-F]{64}$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ItemError(BaseModel):
    code: str
    message: str


class ErrorInfo(BaseModel):
    code: str = Field(description="machine-readable: not_found, invalid_input, bad_image, unsafe_archive, "
                      "payload_too_large, items_rejected, unauthorized, forbidden, conflict, identity_mismatch, "
                      "not_ready, invalid_request, internal")
    message: str = Field(description="what went wrong and what to do about it")
    items: list[AddItemResult] | None = None


class ErrorBody(BaseModel):
    error: ErrorInfo


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


class ExistsRequest(_Strict):
    sha256: list[Sha256] = Field(max_length=10_000)


class ExistsResponse(BaseModel):
    found: dict[str, str] = Field(description="sha256 -> id, for those already in the pool")


class DeleteRequest(_Strict):
    ids: list[Utf8Str] = Field(min_length=1, max_length=100_000)
    missing_ok: bool = Field(default=False, description="delete the known ids even if some are unknown")


class DeleteResponse(BaseModel):
    deleted: list[str]
    not_found: list[str]


class EmbedResponse(BaseModel):
    identity: str
    dim: int
    count: int
    vectors: list[list[float]] | None = None
    vectors_b64: str | None = Field(default=None, description="float32 little-endian, row-major [count, dim]")


_QUERY_KINDS = ("vectors", "vectors_b64", "images_b64")


class SearchRequest(_Strict):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"oneOf": [
        {"required": [name], "properties": {name: {"not": {"type": "null"}}}} for name in _QUERY_KINDS]})

    vectors: list[list[QueryNumber]] | None = Field(default=None, description="query vectors [n, dim] (unit norm)")
    vectors_b64: str | None = Field(default=None, description="float32 little-endian row-major [n, dim], base64")
    images_b64: list[str] | None = Field(default=None, description="query images (file bytes, base64)")
    k: int = Field(default=10, description="neighbours per query (1..T3AR_RETRIEVER_MAX_K)")
    r: int = Field(default=1, ge=1, le=100, description="dedup: sample k of the top r*k uniformly (seeded)")
    seed: int = Field(default=0, ge=0, le=MAX_SAFE_INTEGER,
                      description="seed of the r > 1 sampling, 0..2^53-1 (an integer every JSON client can send "
                                  "exactly): the same seed, queries and pool give the same sample")
    exclude_ids: list[Utf8Str] = Field(default_factory=list, max_length=100_000,
                                   description="never return these ids (unknown ids are ignored)")
    source: Utf8Str | None = Field(default=None, description="only items with this source tag")
    label: Utf8Str | None = Field(default=None, description="only items labelled with this class (class-conditional "
                                                            "retrieval); with source, items with both")
    identity: Utf8Str | None = Field(default=None, description="embedder identity the vectors were made with; checked")

    @model_validator(mode="after")
    def _one_kind(self) -> SearchRequest:
        given = [n for n in _QUERY_KINDS if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of vectors, vectors_b64, images_b64")
        return self


class SearchResult(BaseModel):
    ids: list[str] = Field(description="best first; fewer than k when fewer items qualify")
    scores: list[float] = Field(description="inner products (cosine for unit vectors), rounded to 6 decimals")
    labels: list[str | None] | None = Field(default=None, description="the class label of each id (null: "
                                            "unlabelled); absent when no item of the pool carries a label")


class SearchResponse(BaseModel):
    identity: str
    k: int
    results: list[SearchResult]


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


class ReadyResponse(BaseModel):
    ready: bool
    count: int | None = None
    detail: str | None = None


ErrorInfo.model_rebuild()
