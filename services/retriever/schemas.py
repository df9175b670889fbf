"""Request and response bodies of the retriever API (the OpenAPI schema at /docs is generated from these); the
answers its client reads live in :mod:`t3ar.clients.retriever_models`."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from t3ar.clients.retriever_models import (
    AddItemResult,
    AddResponse,
    DeleteResponse,
    EmbedResponse,
    ExistsResponse,
    HealthResponse,
    IndexInfo,
    ItemError,
    ItemOut,
    ItemPage,
    QueryResult,
    SearchResponse,
    StatsResponse,
    VectorsAddResponse,
    WithdrawnOut,
)
from t3ar_services.common.text import Utf8Str

# the service's answers are models of the library (t3ar.clients.retriever_models), which its client returns
__all__ = ["AddItemResult", "AddResponse", "DeleteResponse", "EmbedResponse", "ExistsResponse", "HealthResponse",
           "IndexInfo", "ItemError", "ItemOut", "ItemPage", "QueryResult", "SearchResponse", "StatsResponse",
           "VectorsAddResponse", "WithdrawnOut"]

#: the largest magnitude of a query vector's number: scores (at most a query's norm, pool vectors being unit
#: vectors) stay finite in float32 for any dimension up to 65,536
MAX_QUERY_NUMBER = 1e14
QueryNumber = Annotated[float, Field(ge=-MAX_QUERY_NUMBER, le=MAX_QUERY_NUMBER, allow_inf_nan=False)]
MAX_SAFE_INTEGER = 2**53 - 1  # larger JSON integers lose precision in double-based parsers and schema validators
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-fA-F]{64}$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorInfo(BaseModel):
    code: str = Field(description="machine-readable: not_found, invalid_input, bad_image, unsafe_archive, "
                      "payload_too_large, items_rejected, unauthorized, forbidden, conflict, identity_mismatch, "
                      "not_ready, invalid_request, internal")
    message: str = Field(description="what went wrong and what to do about it")
    items: list[AddItemResult] | None = None


class ErrorBody(BaseModel):
    error: ErrorInfo


class ExistsRequest(_Strict):
    sha256: list[Sha256] = Field(max_length=10_000)


class DeleteRequest(_Strict):
    ids: list[Utf8Str] = Field(min_length=1, max_length=100_000)
    missing_ok: bool = Field(default=False, description="delete the known ids even if some are unknown")
    withdraw: bool = Field(default=True, description="refuse the deleted images' content at ingest from now on "
                           "(false: a compaction, which keeps a near-duplicate of what it removes)")


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


class ReadyResponse(BaseModel):
    ready: bool
    count: int | None = None
    detail: str | None = None


ErrorInfo.model_rebuild()
