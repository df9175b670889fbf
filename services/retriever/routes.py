"""HTTP routes. Blocking work runs in sync ``def`` routes (FastAPI's thread pool) or ``run_in_threadpool``."""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any, Literal

import numpy as np
import orjson
from fastapi import APIRouter, Depends, File, Form, Query, Request, Response, UploadFile
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from t3ar.data.pool_labels import check_label, hidden_ranges
from t3ar.errors import InvalidInputError
from t3ar_services.common.offloop import OffLoopJsonRoute
from t3ar_services.common.text import check_text, parse_json_object, readable
from t3ar_services.retriever import schemas as s
from t3ar_services.retriever.deps import (
    IngestorDep,
    PoolDep,
    SettingsDep,
    StateDep,
    require_admin,
    require_token,
)
from t3ar_services.retriever.errors import ItemsRejectedError, NotFoundError, PoolConflictError
from t3ar_services.retriever.pool import AddOutcome, Candidate
from t3ar_services.retriever.uploads import expand_uploads

_ERRORS: dict[int | str, dict[str, Any]] = {c: {"model": s.ErrorBody} for c in (401, 403, 404, 409, 413, 422, 503)}
# routes with a multipart or JSON body: one that cannot be parsed at all (broken multipart, non-UTF-8 JSON) is a 400
_UNPARSABLE: dict[int | str, dict[str, Any]] = {400: {"model": s.ErrorBody, "description": "unparsable body"}}
router = APIRouter(responses=_ERRORS, route_class=OffLoopJsonRoute)  # large JSON bodies: parsed off the loop
RW = [Depends(require_token)]
ADMIN = [Depends(require_admin)]


# What _check_source accepts, stated in the document (checked here, so that the error names the rule)
SOURCE_SCHEMA = {"maxLength": 200, "pattern": "^[^\\x00-\\x1f]*$"}


def _check_source(source: str) -> str:
    if len(source) > 200 or any(ord(ch) < 32 for ch in source):
        raise InvalidInputError("source must be at most 200 printable characters")
    check_text(source, "source")
    return source


# What check_label accepts (a class name: the rule is the library's, t3ar.data.pool_labels)
# (empty, or no control character, no invisible or formatting character of the Basic Multilingual Plane, and no
# whitespace at either end)
_CTRL = "\\x00-\\x1f\\x7f-\\x9f" + hidden_ranges()
LABEL_SCHEMA = {"maxLength": 200, "pattern": f"^(?:[^\\s{_CTRL}](?:[^{_CTRL}]*[^\\s{_CTRL}])?)?$"}


def _parse_metadata(raw: str) -> dict[str, Any]:
    if len(raw) > 65536:
        raise InvalidInputError("metadata is larger than 64 KiB of JSON; keep per-item metadata small")
    # strict: what is stored must always be readable (no lone surrogates, no NaN, no 5,000-digit integers)
    return parse_json_object(raw, "metadata", '{"license": "cc0"}')


def _item_out(pool: PoolDep, row: Any) -> s.ItemOut:
    # readable(): a row stored before the door refused lone surrogates is still answered
    return s.ItemOut(id=pool.format_id(row.seq), sha256=row.sha256, source=readable(row.source),
                     metadata=readable(row.metadata), filename=readable(row.filename), media_type=row.media_type,
                     label=readable(row.label),
                     size=row.size, width=row.width,
                     height=row.height, added_at=row.added_at)


@router.get("/health", response_model=s.HealthResponse, tags=["ops"])
def health(state: StateDep) -> s.HealthResponse:
    return s.HealthResponse(status="ok", backend=state.settings.backend)


@router.get("/ready", response_model=s.ReadyResponse, tags=["ops"])
def ready(state: StateDep) -> Any:
    if state.ready and state.pool is not None and state.pool.index is not None:
        return s.ReadyResponse(ready=True, count=state.pool.index.count)
    detail = f"failed to load: {state.load_error}" if state.load_error else "loading the index"
    return JSONResponse(s.ReadyResponse(ready=False, detail=detail).model_dump(), status_code=503)


@router.get("/metrics", tags=["ops"], response_class=Response)
def metrics(state: StateDep) -> Response:
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/stats", response_model=s.StatsResponse, dependencies=RW, tags=["ops"])
def stats(state: StateDep) -> s.StatsResponse:
    if state.pool is None:
        raise PoolConflictError("no pool is open")
    return s.StatsResponse(**state.pool.stats(), duplicate_policy=state.settings.duplicate_policy)


@router.post("/pool", response_model=s.AddResponse, dependencies=RW, tags=["pool"],
             responses=_UNPARSABLE)
def add_images(
    pool: PoolDep, ingestor: IngestorDep, settings: SettingsDep, state: StateDep,
    files: Annotated[list[UploadFile], File(description="images and/or zip/tar archives of images")],
    source: Annotated[str, Form(description="source tag for every item", json_schema_extra=SOURCE_SCHEMA)] = "",
    metadata: Annotated[str, Form(description="JSON object stored with every item")] = "{}",
    label: Annotated[str, Form(description="class label of every item (empty: unlabelled)",
                               json_schema_extra=LABEL_SCHEMA)] = "",
    atomic: Annotated[bool, Form(description="commit nothing if any item is rejected")] = False,
    duplicate_policy: Annotated[Literal["skip", "keep"] | None, Form()] = None,
) -> s.AddResponse:
    """Add images. Every readable, new image is committed; each unusable one is reported ``rejected`` with
    its reason and does not stop the others (``atomic=true``: one rejection commits nothing, 422). If no
    item is usable the answer is 422 ``items_rejected`` with the per-item results. An unsafe archive
    rejects the whole request (422 ``unsafe_archive``). Exact repeats are ``exists``; near-duplicates are
    skipped (``duplicate``) or kept per policy, with ``duplicate_of``."""
    src, meta, lab = _check_source(source), _parse_metadata(metadata), check_label(label)
    items = expand_uploads([(f.filename or "upload", f.file) for f in files], settings)
    entries = pool.refuse_withdrawn(ingestor.prepare(items, pool.known_shas))
    rejected = [e for e in entries if isinstance(e, AddOutcome) and e.status == "rejected"]
    if rejected and (atomic or not any(isinstance(e, Candidate) or e.status != "rejected" for e in entries)):
        state.metrics.adds.labels("rejected").inc(len(rejected))
        why = "atomic upload: nothing was committed" if atomic else "no usable item"
        first = rejected[0].error["message"] if rejected[0].error else ""
        raise ItemsRejectedError(f"{len(rejected)} of {len(entries)} item(s) rejected, {why}; first: {first}",
                                 [_result(o).model_dump() for o in rejected])
    outcomes = pool.add(entries, source=src, metadata=meta, policy=duplicate_policy or settings.duplicate_policy,
                        label=lab)
    counts = {st: sum(o.status == st for o in outcomes) for st in ("added", "exists", "duplicate", "rejected")}
    for st, n in counts.items():
        if n:
            state.metrics.adds.labels(st).inc(n)
    return s.AddResponse(items=[_result(o) for o in outcomes], added=counts["added"], exists=counts["exists"],
                         duplicates=counts["duplicate"], rejected=counts["rejected"])


def _result(o: AddOutcome) -> s.AddItemResult:
    return s.AddItemResult(name=o.name, status=o.status, id=o.id, sha256=o.sha256, duplicate_of=o.duplicate_of,
                           score=o.score, error=s.ItemError(**o.error) if o.error else None)


_OCTET = {"requestBody": {"required": True, "content": {"application/octet-stream": {
    "schema": {"type": "string", "format": "binary"}}}}}


@router.post("/pool/vectors", response_model=s.VectorsAddResponse, dependencies=ADMIN, tags=["pool"],
             openapi_extra=_OCTET)
async def add_vectors(request: Request, pool: PoolDep, settings: SettingsDep,
                      identity: Annotated[str, Query(description="embedder identity of these vectors")],
                      source: Annotated[str, Query(json_schema_extra=SOURCE_SCHEMA)] = "",
                      label: Annotated[str, Query(description="class label of every vector (empty: unlabelled)",
                                                  json_schema_extra=LABEL_SCHEMA)] = "") -> s.VectorsAddResponse:
    """Vectors-only pools: bulk-add vectors (float32 little-endian, row-major [n, dim]; normalised here)."""
    lab = check_label(label)
    if pool.info.kind != "vectors":
        raise PoolConflictError("this pool stores images: add images with POST /pool (vectors are computed here)")
    if identity != pool.info.identity:
        raise PoolConflictError(f"vectors made by {identity!r} cannot join a pool of {pool.info.identity!r}")
    body = await request.body()
    vecs = _decode_f32(body, pool.info.dim, settings.max_vectors_per_request)
    norms = np.linalg.norm(vecs, axis=1, keepdims=True)
    if not np.isfinite(vecs).all() or (norms == 0).any():
        raise InvalidInputError("vectors contain NaN/infinity or all-zero rows; send finite non-zero vectors")
    ids = await run_in_threadpool(pool.add_vectors, vecs / norms, source=_check_source(source), metadata={},
                                  label=lab)
    return s.VectorsAddResponse(ids=ids)


def _decode_f32(raw: bytes, dim: int, max_rows: int) -> np.ndarray:
    if not raw or len(raw) % (4 * dim):
        raise InvalidInputError(f"expected float32 rows of dim {dim} ({4 * dim} bytes each); got {len(raw)} bytes")
    n = len(raw) // (4 * dim)
    if n > max_rows:
        raise InvalidInputError(f"{n} vectors in one request; the limit is {max_rows}: split it")
    return np.frombuffer(raw, dtype="<f4").reshape(n, dim).astype(np.float32)


@router.get("/pool", response_model=s.ItemPage, dependencies=RW, tags=["pool"])
def list_items(pool: PoolDep, after: str | None = None, limit: Annotated[int, Query(ge=1, le=1000)] = 100,
               source: str | None = None,
               label: Annotated[str | None, Query(description="only items with this class label")] = None
               ) -> s.ItemPage:
    """Items in id order; follow ``next_after`` for the next page. ``source`` / ``label``: only those items."""
    after_seq = 0 if after is None else pool.parse_id(after)
    if after_seq is None:
        raise InvalidInputError(f"after={after!r} is not an id of this pool; pass the previous next_after")
    check_text(source, "source")
    check_text(label, "label")
    rows = pool.store.page(after=after_seq, limit=limit, source=source, label=label)
    nxt = pool.format_id(rows[-1].seq) if len(rows) == limit else None
    return s.ItemPage(items=[_item_out(pool, r) for r in rows], next_after=nxt,
                      total=pool.store.count(source, label))


@router.post("/pool/exists", response_model=s.ExistsResponse, dependencies=RW, tags=["pool"],
             responses=_UNPARSABLE)
def exists(pool: PoolDep, body: s.ExistsRequest) -> s.ExistsResponse:
    """Which of these sha256 digests (lower-case hex of the file bytes) are already in the pool."""
    return s.ExistsResponse(found=pool.known_shas([h.lower() for h in body.sha256]))


@router.get("/pool/{item_id}", response_model=s.ItemOut, dependencies=RW, tags=["pool"])
def get_item(pool: PoolDep, item_id: str) -> s.ItemOut:
    row = pool.store.get(pool.require_seq(item_id))
    if row is None:
        raise NotFoundError(f"no item {item_id!r} in this pool (deleted, or never added)")
    return _item_out(pool, row)


@router.get("/pool/{item_id}/image", dependencies=RW, tags=["pool"], response_class=Response,
            responses={200: {"content": {"image/*": {}}}})
def get_image(pool: PoolDep, item_id: str) -> Response:
    row = pool.store.get(pool.require_seq(item_id))
    if row is None:
        raise NotFoundError(f"no item {item_id!r} in this pool (deleted, or never added)")
    if row.sha256 is None:
        raise NotFoundError(f"item {item_id!r} was added as a vector and has no image")
    try:
        data = pool.blobs.read(row.sha256)
    except FileNotFoundError as e:  # deleted between the lookup and the read
        raise NotFoundError(f"no item {item_id!r} in this pool (deleted)") from e
    return Response(data, media_type=row.media_type or "application/octet-stream")


@router.delete("/pool/{item_id}", response_model=s.DeleteResponse, dependencies=ADMIN, tags=["pool"])
def delete_item(pool: PoolDep, state: StateDep, item_id: str) -> s.DeleteResponse:
    """Withdraw one item. On 2xx: no later search returns it (also after a restart); its blob and metadata are gone
    from disk; its sha256 and vector stay in the withdrawn set, so its content (and near-duplicates) is refused at
    ingest until an admin re-admits it. Unknown id -> 404."""
    deleted, missing = pool.delete([item_id], missing_ok=False)
    state.metrics.deletes.inc(len(deleted))
    return s.DeleteResponse(deleted=deleted, not_found=missing)


@router.post("/pool/delete", response_model=s.DeleteResponse, dependencies=ADMIN, tags=["pool"],
             responses=_UNPARSABLE)
def delete_items(pool: PoolDep, state: StateDep, body: s.DeleteRequest) -> s.DeleteResponse:
    """Withdraw many items at once: all of them, or (an unknown id, without ``missing_ok``) none -> 404."""
    deleted, missing = pool.delete(body.ids, missing_ok=body.missing_ok, withdraw=body.withdraw)
    state.metrics.deletes.inc(len(deleted))
    return s.DeleteResponse(deleted=deleted, not_found=missing)


@router.get("/pool/withdrawn/{item_id}", response_model=s.WithdrawnOut, dependencies=ADMIN, tags=["pool"])
def get_withdrawn(pool: PoolDep, item_id: str) -> s.WithdrawnOut:
    """A withdrawn image item: when, and its digest (the content refused at ingest); 404 when ``item_id`` was
    never withdrawn (or was re-admitted)."""
    w = pool.withdrawal(item_id)
    if w is None:
        raise NotFoundError(f"no withdrawn image {item_id!r} (never withdrawn, re-admitted, or not an image item)")
    return s.WithdrawnOut(**w.as_dict())


@router.post("/pool/withdrawn/{item_id}/readmit", response_model=s.WithdrawnOut, dependencies=ADMIN,
             tags=["pool"])
def readmit(pool: PoolDep, item_id: str) -> s.WithdrawnOut:
    """Lift a withdrawal: the content of ``item_id`` (its bytes, its near-duplicates) may be added again, as a
    new item. The kept vector and digest go."""
    return s.WithdrawnOut(**pool.readmit(item_id).as_dict())


@router.post("/embed", response_model=s.EmbedResponse, dependencies=RW, tags=["search"],
             responses=_UNPARSABLE)
def embed(ingestor: IngestorDep, state: StateDep, settings: SettingsDep,
          files: Annotated[list[UploadFile], File(description="images (all must be readable)")],
          encoding: Literal["base64", "json"] = "base64") -> s.EmbedResponse:
    """Embed images with the pool's retriever R (what workers use for target images)."""
    if len(files) > settings.max_queries:
        raise InvalidInputError(f"{len(files)} images; /embed takes at most {settings.max_queries} per request")
    datas = [f.file.read(settings.max_image_bytes + 1) for f in files]
    names = [f.filename or f"image {i}" for i, f in enumerate(files)]
    for name, d in zip(names, datas, strict=True):
        if len(d) > settings.max_image_bytes:
            raise InvalidInputError(f"{name}: larger than {settings.max_image_bytes} bytes; downscale it")
    vecs = ingestor.embed_bytes(datas, names)
    state.metrics.embedded.inc(len(vecs))
    out = s.EmbedResponse(identity=ingestor.identity, dim=ingestor.dim, count=len(vecs))
    if encoding == "json":
        out.vectors = vecs.tolist()
    else:
        out.vectors_b64 = base64.b64encode(np.ascontiguousarray(vecs, dtype="<f4").tobytes()).decode()
    return out


@router.post("/search", dependencies=RW, tags=["search"], response_model=s.SearchResponse,
             responses=_UNPARSABLE)
def search(pool: PoolDep, state: StateDep, settings: SettingsDep, body: s.SearchRequest) -> Response:
    """Nearest pool items by inner product (cosine for unit vectors) for each query, best first. Queries are
    vectors (JSON or base64 float32) or images (base64 file bytes, embedded with the pool's R)."""
    return Response(search_json(pool, state, settings, body, search_queries(pool, state, settings, body)),
                    media_type="application/json")


def search_queries(pool: PoolDep, state: StateDep, settings: SettingsDep, body: s.SearchRequest) -> np.ndarray:
    """The checked query matrix of a search request (images are embedded here)."""
    if not 1 <= body.k <= settings.max_k:
        raise InvalidInputError(f"k={body.k} is out of range: use 1..{settings.max_k} (T3AR_RETRIEVER_MAX_K)")
    if body.identity is not None and body.identity != pool.info.identity:
        raise PoolConflictError(f"query vectors made by {body.identity!r}; this pool uses {pool.info.identity!r}")
    if body.images_b64 is not None:
        if state.ingestor is None:
            raise PoolConflictError("this retriever is vectors-only: send query vectors, not images")
        datas = [_b64(x, f"images_b64[{i}]") for i, x in enumerate(body.images_b64[: settings.max_queries + 1])]
        _check_n(len(datas), settings.max_queries)
        queries = state.ingestor.embed_bytes(datas, [f"images_b64[{i}]" for i in range(len(datas))])
        state.metrics.embedded.inc(len(queries))
    elif body.vectors_b64 is not None:
        queries = _decode_f32(_b64(body.vectors_b64, "vectors_b64"), pool.info.dim, settings.max_queries)
    else:
        assert body.vectors is not None
        _check_n(len(body.vectors), settings.max_queries)
        dims = {len(v) for v in body.vectors}
        if dims != {pool.info.dim}:
            raise InvalidInputError(f"each vector must have {pool.info.dim} numbers; got lengths {sorted(dims)}")
        queries = np.asarray(body.vectors, dtype=np.float32)
    _check_n(len(queries), settings.max_queries)
    # a score is at most the query's norm (pool vectors are unit vectors): bounded numbers keep every score finite
    # (float32 rounding may lift a number at the bound a little above it: that one is still accepted)
    if not np.isfinite(queries).all() or float(np.abs(queries).max()) > s.MAX_QUERY_NUMBER * (1 + 1e-6):
        raise InvalidInputError(f"query vectors must be finite numbers of at most {s.MAX_QUERY_NUMBER:g} in magnitude "
                                "(send unit vectors)")
    return queries


def search_json(pool: PoolDep, state: StateDep, settings: SettingsDep, body: s.SearchRequest,
                queries: np.ndarray) -> bytes:
    """Search and the JSON answer (a :class:`~t3ar_services.retriever.schemas.SearchResponse`, encoded by orjson:
    ids as ``<tag>-<seq>``, scores rounded to 6 decimals; ``labels`` only when the pool holds labelled items)."""
    rows = pool.search_seqs(queries, body.k, r=body.r, seed=body.seed, exclude_ids=body.exclude_ids,
                            source=body.source, label=body.label)
    state.metrics.searches.inc()
    state.metrics.search_queries.inc(len(queries))
    labels, tag = pool.result_labels(rows), pool.info.tag
    return orjson.dumps({"identity": pool.info.identity, "k": body.k, "results": [
        {"ids": [f"{tag}-{q}" for q in seqs.tolist()], "scores": np.round(scores.astype(np.float64), 6)}
        | ({"labels": list(labels[i])} if labels is not None else {})
        for i, (seqs, scores) in enumerate(rows)]}, option=orjson.OPT_SERIALIZE_NUMPY)


def _check_n(n: int, limit: int) -> None:
    if n == 0 or n > limit:
        raise InvalidInputError(f"{n} queries; send 1..{limit} (T3AR_RETRIEVER_MAX_QUERIES) per request")


def _b64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as e:
        raise InvalidInputError(f"{what} is not valid base64: {e}") from e
