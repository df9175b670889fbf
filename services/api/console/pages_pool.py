"""The pool: a paged thumbnail grid with counts per source and per class label (filters by either), search by an
uploaded image, an item's page (metadata, label, near-duplicates, the jobs and checkpoints that used it) and, for
admins, withdrawal.

Reads go through the API's own retriever client (the browser never gets a retriever token) for any signed-in
session, bounded for a page (:func:`~t3ar_services.api.console.web.pool_reader`: one attempt within
``T3AR_API_CONSOLE_TIMEOUT``); lineage, withdrawal (only for an admin session) and readapts call the domain
layer the JSON routes call (:mod:`t3ar_services.api.domain`).
"""

from __future__ import annotations

import base64
import io
import urllib.parse
from functools import lru_cache
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from t3ar.clients.retriever import RetrieverClient
from t3ar.clients.retriever_models import ItemOut
from t3ar_services.api.console import web
from t3ar_services.api.console.session import Session
from t3ar_services.api.console.thumbs import png_response, thumbnails
from t3ar_services.api.deps import links_of
from t3ar_services.api.domain import access, jobs, pool
from t3ar_services.api.schemas import LineageResponse
from t3ar_services.common.body_limit import body_size

router = APIRouter(prefix=web.PREFIX, include_in_schema=False)
PAGE = 48
SEARCH_K = 12
MAX_QUERY_BYTES = 16 * 1024 * 1024
NEAR_K = 6
MAX_READAPTED = 200


@router.get("/pool")
def pool_page(request: Request, session: web.SessionDep, source: str | None = None, after: str | None = None,
              exact: bool = False, label: str | None = None) -> Response:
    """``source``: one source's items; an empty one means all sources unless ``exact`` (items without a source).
    ``label``: only the items with this class label (an empty one: any label or none)."""
    reader = web.pool_reader(request)
    stats = web.call(reader.stats)
    source = source if (source or exact) else None
    label = label or None
    page = web.call(reader.list_items, after=after or None, limit=PAGE, source=source, label=label)
    sources = sorted(stats.sources.items(), key=lambda kv: (-kv[1], kv[0]))
    labels = sorted(stats.labels.items(), key=lambda kv: (-kv[1], kv[0]))
    return web.render(request, "pool.html", session, items=page.items, next_after=page.next_after,
                      total=page.total, count=stats.count, sources=sources, source=source, labels=labels,
                      label=label)


@router.get("/pool/search")
def search_page(request: Request, session: web.SessionDep) -> Response:
    return web.render(request, "search.html", session, results=None, query=None)


@router.post("/pool/search", dependencies=[body_size("query_image")])
async def search(request: Request) -> Response:
    session, form = await web.checked_form(request, max_files=1)
    upload = form.get("image")
    if upload is None or isinstance(upload, str):
        raise web.PageError(422, "choose an image file to search with")
    data = await upload.read(MAX_QUERY_BYTES + 1)
    if len(data) > MAX_QUERY_BYTES:
        raise web.PageError(413, f"search with an image of at most {MAX_QUERY_BYTES >> 20} MiB")
    reader = web.pool_reader(request)
    result = await run_in_threadpool(web.call, reader.search_images, [(upload.filename or "query", data)],
                                     SEARCH_K)
    try:
        query = base64.b64encode(await run_in_threadpool(thumbnails(request).of, data)).decode()
    except Exception as e:  # the retriever decoded it; PIL here did not (it would have said so first)
        raise web.PageError(422, "the uploaded file is not an image this server can read") from e
    rows = [{"id": i, "score": s, "label": lab}
            for i, s, lab in zip(result.ids[0], result.scores[0], result.labels[0], strict=False) if i]
    return web.render(request, "search.html", session, results=rows, query=query, filename=upload.filename or "")


def _item(reader: RetrieverClient, pool_id: str) -> ItemOut | None:
    try:
        return web.call(reader.get_item, pool_id)
    except web.PageError as e:
        if e.status == 404:
            return None
        raise


def _known(state: Any, session: Session, pool_id: str, item: ItemOut | None, links: Any) -> \
        LineageResponse:
    """The item's lineage as ``session`` may see it; a 404 page for an id the pool does not hold and never held."""
    found = web.call(pool.lineage, state, links, pool_id)
    if item is None and not web.call(pool.known_gone, state, found):
        raise web.PageError(404, f"no pool item {pool_id!r}: the pool does not hold it, and it was never withdrawn "
                                 "nor used by a job")
    return access.visible_lineage(state, session.who, found)


def _similar(reader: RetrieverClient, pool_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]], float]:
    """The item's closest pool items, split at the pool's near-duplicate threshold (what its ingest skips as a
    near-duplicate): (near-duplicates, the other nearest neighbours, the threshold)."""
    threshold = web.call(reader.stats).duplicate_threshold
    image = web.call(reader.get_image, pool_id)
    res = web.call(reader.search_images, [image], NEAR_K, exclude_ids=[pool_id])
    rows: list[dict[str, Any]] = [{"id": i, "score": float(sc), "label": lab}
                                  for i, sc, lab in zip(res.ids[0], res.scores[0], res.labels[0], strict=False)
                                  if i]
    return [r for r in rows if r["score"] >= threshold], [r for r in rows if r["score"] < threshold], threshold


@router.get("/pool/{pool_id}")
def item_page(request: Request, session: web.SessionDep, pool_id: str) -> Response:
    """Also for a withdrawn item: its lineage stays (the jobs and checkpoints that used it), with what happened
    since (its re-runs; which running jobs may have retrieved it)."""
    state, reader = web.api_state(request), web.pool_reader(request)
    item = _item(reader, pool_id)
    near: list[dict[str, Any]] = []
    nearest: list[dict[str, Any]] = []
    threshold = None
    if item is not None and item.size:
        near, nearest, threshold = _similar(reader, pool_id)
    lineage = _known(state, session, pool_id, item, links_of(request))
    after = web.call(pool.aftermath, state, lineage) if item is None else None
    why = state.contributor.records.withdrawal_reasons([pool_id]).get(pool_id) if item is None else None
    return web.render(request, "item.html", session, pool_id=pool_id, item=item, near=near, nearest=nearest,
                      threshold=threshold, lineage=lineage, after=after, why=_withdrawal_words(why))


def _withdrawal_words(reason: str | None) -> str | None:
    """How an item left the pool, from its withdrawal record's reason (no other team's job id)."""
    if reason is None:
        return None
    if reason.startswith("contribution:"):
        return "with the contribution of the job that added it"
    if reason.startswith("compaction:"):
        return "by compaction, as a near-duplicate of an item kept"
    return "by an admin"


@lru_cache(maxsize=1)
def _gone_png() -> bytes:
    """A grey square with a cross: the picture of a withdrawn item (its lineage thumbnails stay on job pages)."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (64, 64), (226, 232, 240))
    draw = ImageDraw.Draw(img)
    draw.line((16, 16, 48, 48), fill=(148, 163, 184), width=4)
    draw.line((16, 48, 48, 16), fill=(148, 163, 184), width=4)
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


@router.get("/pool/{pool_id}/image")
def item_image(request: Request, session: web.SessionDep, pool_id: str) -> Response:
    """The item's thumbnail, made once per image (keyed by the item's sha256: a cached one costs the item's
    metadata, not its image); a withdrawn or unknown item's is a placeholder (404)."""
    reader = web.pool_reader(request)
    item = _item(reader, pool_id)
    try:
        if item is None:
            raise web.PageError(404, f"no pool item {pool_id!r}")
        sha = item.sha256
        load = lambda: web.call(reader.get_image, pool_id)  # noqa: E731
        thumbs = thumbnails(request)
        png = thumbs.get(f"sha256:{sha}", load) if sha else thumbs.of(load())
    except web.PageError as e:
        if e.status != 404:
            raise
        return Response(_gone_png(), status_code=404, media_type="image/png")  # withdrawn, or never added
    except Exception as e:
        raise web.PageError(404, f"pool item {pool_id!r} has no image this server can read") from e
    return png_response(png)


@router.get("/pool/{pool_id}/withdraw")
def withdraw_page(request: Request, session: web.SessionDep, pool_id: str) -> Response:
    """What withdrawing would affect, and the confirmation form (admins only)."""
    web.require_admin(session)
    state = web.api_state(request)
    item = _item(web.pool_reader(request), pool_id)
    if item is None:
        raise web.PageError(404, f"no pool item {pool_id!r} (already withdrawn, or never added)")
    lineage = web.call(pool.lineage, state, links_of(request), pool_id)
    return web.render(request, "withdraw.html", session, pool_id=pool_id, item=item, lineage=lineage, done=False)


@router.post("/pool/{pool_id}/withdraw")
async def withdraw(request: Request, pool_id: str) -> Response:
    session, _ = await web.checked_form(request)
    web.require_admin(session, request=request, action="pool.withdraw", target=pool_id)
    done = await run_in_threadpool(web.call, pool.withdraw_item, web.api_state(request), links_of(request), pool_id)
    await run_in_threadpool(access.record, web.api_state(request), session.who, "pool.withdraw", pool_id,
                            web.client_of(request), detail=f"jobs={len(done.jobs)}")
    # a reload re-posts nothing
    return RedirectResponse(f"{web.PREFIX}/pool/{_seg(pool_id)}/withdrawn", status_code=303)


@router.get("/pool/{pool_id}/withdrawn")
def withdrawn_page(request: Request, session: web.SessionDep, pool_id: str) -> Response:
    """After a withdrawal: the jobs that used the item, their re-runs so far, and the offer to readapt the rest."""
    state = web.api_state(request)
    if _item(web.pool_reader(request), pool_id) is not None:
        return RedirectResponse(f"{web.PREFIX}/pool/{_seg(pool_id)}", status_code=303)
    lineage = _known(state, session, pool_id, None, links_of(request))
    after = web.call(pool.aftermath, state, lineage)
    return web.render(request, "withdraw.html", session, pool_id=pool_id, item=None, lineage=lineage, done=True,
                      after=after, todo=len(_not_rerun(lineage, after)),
                      cap=state.settings.console_max_readapts)


def _not_rerun(lineage: LineageResponse, after: pool.Aftermath) -> list[str]:
    """The finished jobs that used the item and have no re-run made since its withdrawal."""
    done = {parent for _, parent in after.reruns}
    return [j.job_id for j in lineage.jobs if j.job_id not in done]


@router.post("/pool/{pool_id}/readapt")
async def readapt_affected(request: Request, pool_id: str) -> Response:
    """Readapt the finished jobs that used the item (after its withdrawal: against the pool without it), at most
    ``T3AR_API_CONSOLE_MAX_READAPTS`` per click; jobs already re-run since the withdrawal are not re-run again, so
    the next click goes on with the rest. A job that cannot be re-run (its target gone, a cap) is named, and the
    others still run."""
    session, _ = await web.checked_form(request)
    web.require_submit(session, request=request, action="job.readapt", target=pool_id)
    state = web.api_state(request)
    lineage = await run_in_threadpool(web.call, pool.lineage, state, links_of(request), pool_id)
    visible = await run_in_threadpool(access.visible_lineage, state, session.who, lineage)
    after = await run_in_threadpool(web.call, pool.aftermath, state, visible)
    todo = _not_rerun(visible, after)
    cap = state.settings.console_max_readapts
    started, failed = [], []
    for job_id in todo[:cap]:
        try:
            done = await run_in_threadpool(web.call, jobs.readapt, state, job_id, session.who.key_id)
        except web.PageError as e:
            failed.append(job_id)
            await run_in_threadpool(access.record, state, session.who, "job.readapt", job_id, web.client_of(request),
                                    outcome="refused", detail=f"parent={job_id} withdrawn={pool_id}: {e.message[:200]}")
            continue
        await run_in_threadpool(access.record, state, session.who, "job.readapt", done.row.id, web.client_of(request),
                                detail=f"parent={job_id} withdrawn={pool_id}")
        started.append(done.row.id)
    query = urllib.parse.urlencode({"jobs": ",".join(started), "failed": ",".join(failed),
                                    "left": max(0, len(todo) - cap)})
    return RedirectResponse(f"{web.PREFIX}/pool/{_seg(pool_id)}/readapted?{query}", status_code=303)


def _ids(value: str) -> list[str]:
    return [j for j in value.split(",")[:MAX_READAPTED] if j]


@router.get("/pool/{pool_id}/readapted")
def readapted_page(request: Request, session: web.SessionDep, pool_id: str, jobs: str = "", failed: str = "",
                   left: int = 0) -> Response:
    state = web.api_state(request)
    rows = [state.store.get_job(j) for j in _ids(jobs) if session.who.sees(state.store.teams_of("job", j))]
    started = [{"id": r.id, "parent": r.parent_id or ""} for r in rows if r is not None]
    refused = [j for j in _ids(failed) if session.who.sees(state.store.teams_of("job", j))]
    return web.render(request, "readapted.html", session, pool_id=pool_id, started=started, failed=refused,
                      left=max(0, left), cap=state.settings.console_max_readapts)


def _seg(value: str) -> str:
    return urllib.parse.quote(value, safe="")
