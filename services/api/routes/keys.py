"""Admin: named API keys (make, list, revoke) and the audit log (:mod:`t3ar_services.api.domain.access`)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from t3ar.clients.api_models import AuditList, AuditOut, KeyCreated, KeyList, KeyOut
from t3ar_services.api import schemas as s
from t3ar_services.api.audit import ACTIONS
from t3ar_services.api.deps import ADMIN, ClientDep, PrincipalDep, StateDep
from t3ar_services.api.domain import access
from t3ar_services.api.keys import MAX_NAME, TEAM_PATTERN

router = APIRouter(responses=s.error_responses(401, 403, 404, 422), dependencies=ADMIN, tags=["keys"])


class KeyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    team: str = Field(pattern=TEAM_PATTERN.pattern, description="the team the key acts for")
    role: Literal["read", "submit", "admin"] = Field(description="read: see the team's jobs and models; submit: "
                                                                  "also submit, upload, cancel, readapt; admin: all")
    name: str = Field(default="", max_length=MAX_NAME, description="what the key is for (shown in lists)")


@router.post("/keys", status_code=201, response_model=KeyCreated,
             responses={400: {"model": s.ErrorBody, "description": "unparsable JSON body"}})
def create_key(state: StateDep, who: PrincipalDep, client: ClientDep, body: KeyRequest) -> JSONResponse:
    """Make a key for ``team`` with ``role``. The answer holds the key itself, once: store it now."""
    row, key = access.create_key(state, who, body.team, body.role, body.name, client)
    return JSONResponse(KeyCreated(**row.as_dict(), key=key).model_dump(), status_code=201,
                        headers={"Cache-Control": "no-store"})


@router.get("/keys", response_model=KeyList)
def list_keys(state: StateDep, team: Annotated[str | None, Query(max_length=63)] = None,
              revoked: bool = True) -> KeyList:
    """Every key (``team``: that team's; ``revoked=false``: active ones), oldest first; never the keys themselves."""
    return KeyList(keys=[KeyOut(**r.as_dict()) for r in state.keys.list(team=team, revoked=revoked)])


@router.delete("/keys/{key_id}", response_model=KeyOut)
def revoke_key(state: StateDep, who: PrincipalDep, client: ClientDep, key_id: str) -> KeyOut:
    """Revoke a key: refused from the next request on (its console sessions too). Revoking it again answers the
    same record."""
    return KeyOut(**access.revoke_key(state, who, key_id, client).as_dict())


@router.get("/audit", response_model=AuditList)
def audit(state: StateDep, limit: Annotated[int, Query(ge=1, le=1000)] = 100,
          before: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,
          team: Annotated[str | None, Query(max_length=63)] = None,
          action: Annotated[str | None, Query(description=f"one of {', '.join(ACTIONS)}", max_length=40)] = None,
          key_id: Annotated[str | None, Query(max_length=80)] = None) -> AuditList:
    """The audit log, newest first: who (key id and team), when, what, to what, from where. Page with ``before``
    = the previous page's ``next_before``."""
    rows, nxt = access.audit_page(state, limit=limit, before=before, team=team, action=action, key_id=key_id)
    return AuditList(entries=rows, next_before=nxt)


class AuditExport(BaseModel):
    entries: list[AuditOut] = Field(description="oldest first")
    next_after: int | None = Field(description="the `after` of the next batch; null on the last")


@router.get("/audit/export", response_model=AuditExport)
def audit_export(state: StateDep, who: PrincipalDep, client: ClientDep,
                 after: Annotated[int, Query(ge=0, le=2**63 - 1)] = 0,
                 limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000) -> AuditExport:
    """Export the audit log, oldest first, from ``after`` (the previous batch's ``next_after``). What an admin has
    exported may be pruned past ``T3AR_API_AUDIT_MAX_ROWS`` / ``_MAX_AGE_DAYS``; nothing else ever is. Audited
    as ``audit.export``."""
    rows, nxt = state.audit.export(after=after, limit=limit)
    if rows:
        access.record(state, who, "audit.export", f"{rows[0].seq}-{rows[-1].seq}", client)
    return AuditExport(entries=rows, next_after=nxt)
