"""Admin pages: named API keys (list, make, revoke) and the audit log, through the domain functions the JSON
routes call (:mod:`t3ar_services.api.domain.access`). A new key is shown once, in the answer to the form that made
it (never in a URL, never again)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from t3ar_services.api.audit import ACTIONS
from t3ar_services.api.console import web
from t3ar_services.api.console.session import Session
from t3ar_services.api.domain import access
from t3ar_services.api.keys import ROLES

router = APIRouter(prefix=web.PREFIX, include_in_schema=False)
AUDIT_PAGE = 100


def _keys_page(request: Request, session: Session, created: tuple[str, str] | None = None) -> Response:
    rows = web.api_state(request).keys.list()
    return web.render(request, "keys.html", session, keys=rows, roles=ROLES, created=created)


@router.get("/keys")
def keys_page(request: Request, session: web.SessionDep) -> Response:
    web.require_admin(session, "managing API keys")
    return _keys_page(request, session)


def _field(form: object, name: str) -> str:
    value = form.get(name)  # type: ignore[attr-defined]
    return value.strip() if isinstance(value, str) else ""


@router.post("/keys")
async def create_key(request: Request) -> Response:
    session, form = await web.checked_form(request)
    web.require_admin(session, "managing API keys", request=request, action="key.create")
    row, key = await run_in_threadpool(web.call, access.create_key, web.api_state(request), session.who,
                                       _field(form, "team"), _field(form, "role"), _field(form, "name"),
                                       web.client_of(request))
    return _keys_page(request, session, created=(row.id, key))  # the one time the key is shown


@router.post("/keys/{key_id}/revoke")
async def revoke_key(request: Request, key_id: str) -> Response:
    session, _ = await web.checked_form(request)
    web.require_admin(session, "managing API keys", request=request, action="key.revoke", target=key_id)
    await run_in_threadpool(web.call, access.revoke_key, web.api_state(request), session.who, key_id,
                            web.client_of(request))
    return RedirectResponse(f"{web.PREFIX}/keys", status_code=303)


@router.get("/audit")
def audit_page(request: Request, session: web.SessionDep, team: str = "", action: str = "", key_id: str = "",
               before: int | None = None) -> Response:
    web.require_admin(session, "reading the audit log")
    if len(team) > 63 or len(action) > 40 or len(key_id) > 80 or (before is not None and before < 1):
        raise web.PageError(422, "a filter is too long")
    rows, nxt = access.audit_page(web.api_state(request), limit=AUDIT_PAGE, before=before, team=team or None,
                                  action=action or None, key_id=key_id or None)
    return web.render(request, "audit.html", session, entries=rows, next_before=nxt, team=team, action=action,
                      key_id=key_id, actions=ACTIONS)
