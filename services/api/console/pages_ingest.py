"""Add images to the pool from the browser (role submit): image files or zip/tar archives of images, a source
tag and an optional class label, sent to the retriever through the API's own read/write client
(:func:`t3ar_services.api.domain.pool.ingest`, the retriever's checks and limits), audited as ``pool.ingest``.
The answer lists what happened to each file: added, already there, a near-duplicate of a pool item, rejected."""

from __future__ import annotations

import urllib.parse
from collections import Counter

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from t3ar.clients.retriever_models import AddItemResult
from t3ar_services.api.console import web
from t3ar_services.api.console.session import Session
from t3ar_services.api.domain import access, pool
from t3ar_services.common.body_limit import body_size

router = APIRouter(prefix=web.PREFIX, include_in_schema=False)
FIELDS = frozenset({"csrf", "files", "source", "label"})
MAX_FILES = 2048  # the retriever's default items per request (T3AR_RETRIEVER_MAX_ITEMS_PER_REQUEST)
DEFAULT_SOURCE = "console"


def _page(request: Request, session: Session, *, status: int = 200, error: str | None = None, source: str = "",
          label: str = "", items: list[AddItemResult] | None = None) -> Response:
    counts = Counter(it.status for it in items or [])
    return web.render(request, "ingest.html", session, status=status, error=error, source=source or DEFAULT_SOURCE,
                      label=label, items=items, counts=counts,
                      pool_link=f"{web.PREFIX}/pool?{urllib.parse.urlencode({'source': source})}" if source else None)


@router.get("/pool/ingest")
def ingest_page(request: Request, session: web.SessionDep) -> Response:
    web.require_submit(session)
    return _page(request, session)


@router.post("/pool/ingest", dependencies=[body_size("ingest")])
async def ingest(request: Request) -> Response:
    state = web.api_state(request)
    session, form = await web.checked_form(  # a read key is refused before its body is read (N11)
        request, max_files=MAX_FILES, needs=lambda s: web.require_submit(s, request=request, action="pool.ingest"))
    source = form.get("source")
    source = source.strip() if isinstance(source, str) else ""
    label = form.get("label")
    label = label.strip() if isinstance(label, str) else ""
    try:
        unknown = sorted(set(form.keys()) - FIELDS)
        if unknown:
            raise web.PageError(422, f"unknown form field(s) {', '.join(map(repr, unknown))}")
        if not source:
            raise web.PageError(422, "give the images a source tag (where they came from, e.g. 'console' or a "
                                     "data set)")
        uploads = [f for f in form.getlist("files") if isinstance(f, UploadFile) and (f.filename or f.size)]
        if not uploads:
            raise web.PageError(422, "choose image files, or a zip or tar of images")
        files = [(f.filename or f"file-{i}", await f.read()) for i, f in enumerate(uploads)]
        meta = {"added_by": session.who.key_id, "team": session.who.team, "via": "console"}
        items, committed = await run_in_threadpool(web.call, pool.ingest, state, files, source, label, meta)
    except web.PageError as e:
        if e.status >= 500:
            raise
        await run_in_threadpool(web.refused, request, session, "pool.ingest", e, source)
        return _page(request, session, status=e.status, error=e.message, source=source, label=label)
    counts = Counter(it.status for it in items)
    await run_in_threadpool(access.record, state, session.who, "pool.ingest", source, web.client_of(request),
                            outcome="ok" if committed else "refused",
                            detail=" ".join(f"{k}={counts[k]}" for k in ("added", "exists", "duplicate", "rejected")))
    return _page(request, session, status=200 if committed else 422, source=source, label=label, items=items,
                 error=None if committed else "the retriever refused every file: see each file's reason below")
