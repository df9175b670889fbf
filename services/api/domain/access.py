"""Teams: what a principal may see, the named keys an admin makes and revokes, and the audit log.

Jobs and models belong to the team that submitted or uploaded them (:meth:`Store.add_owner`); exports and reports
belong to their job; a re-run belongs to the team of the job it re-runs. A principal sees its own team's, an admin
every team's. Another team's job or model is answered exactly as an unknown one (404 with the same words), so ids
do not tell whether something exists. The pool is shared (search and lineage), and a lineage names only the jobs
its reader may see. The JSON routes and the console both call these, before the domain function they guard.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from t3ar.clients.api_models import AuditOut
from t3ar.errors import T3arError
from t3ar_services.api import schemas as s
from t3ar_services.api.deps import ApiState
from t3ar_services.api.errors import NotFoundError, classify
from t3ar_services.api.jobs import require_job
from t3ar_services.api.keys import KeyRow, Principal
from t3ar_services.api.store import JobRow, ModelRow


def owner(who: Principal) -> tuple[str, str]:
    """(team, key id) of what ``who`` makes."""
    return who.team, who.key_id


def job_for(state: ApiState, who: Principal, job_id: str) -> JobRow:
    """The job, when ``who`` may see it; else the 404 of an unknown job."""
    row = require_job(state.store, job_id)
    if not who.sees(state.store.teams_of("job", job_id)):
        raise NotFoundError(f"no job {job_id!r}; list jobs with GET /jobs")
    return row


def check_model(state: ApiState, who: Principal, model_id: str) -> ModelRow:
    """The model, when ``who`` may use it; else 404 (the words of an unknown model)."""
    row = state.store.get_model(model_id)
    if row is None or not who.sees(state.store.teams_of("model", model_id)):
        raise NotFoundError(f"no model {model_id!r}; list them with GET /models")
    return row


def visible_lineage(state: ApiState, who: Principal, found: s.LineageResponse) -> s.LineageResponse:
    """A lineage with only the jobs ``who`` may see (running ones included)."""
    if who.admin:
        return found
    mine = {j.job_id for j in found.jobs} | set(found.in_flight)
    mine = {j for j in mine if who.sees(state.store.teams_of("job", j))}
    return found.model_copy(update={"jobs": [j for j in found.jobs if j.job_id in mine],
                                    "in_flight": [j for j in found.in_flight if j in mine]})


OTHER_TEAMS = "another team's contribution"


def visible_neighbours(state: ApiState, who: Principal, found: list[s.NeighbourSource]) -> list[s.NeighbourSource]:
    """``neighbours_from_contributions`` as ``who`` may read it: a contribution of a job ``who`` may not see is
    counted without naming its job (issue 50, N6), all such folded into one entry."""
    if who.admin or not found:
        return found
    mine = [n for n in found if n.job_id is not None and who.sees(state.store.teams_of("job", n.job_id))]
    hidden = sum(n.items_used for n in found if n not in mine)
    return mine + ([s.NeighbourSource(job_id=None, source=OTHER_TEAMS, items_used=hidden)] if hidden else [])


def visible_job(state: ApiState, who: Principal, job: s.JobOut) -> s.JobOut:
    """A job's answer with only what ``who`` may read of other teams' work (:func:`visible_neighbours`)."""
    return job.model_copy(update={"neighbours_from_contributions": visible_neighbours(
        state, who, job.neighbours_from_contributions)})


def record(state: ApiState, who: Principal, action: str, target: str = "", client: str = "", *,
           outcome: str = "ok", detail: str = "") -> None:
    """One audit entry for what ``who`` did (never raises)."""
    state.audit.record(key_id=who.key_id, team=who.team, action=action, target=target, client=client,
                       outcome=outcome, detail=detail)


@contextmanager
def refusals_recorded(state: ApiState, who: Principal, action: str, client: str, target: str = "") -> Iterator[None]:
    """Record a refused ``action`` (a domain error answered 4xx: a bad archive, an unknown model...) in the audit
    log with its status and reason, and let the error go on."""
    try:
        yield
    except T3arError as e:
        status, _ = classify(e)
        if status < 500:
            record(state, who, action, target, client, outcome="refused", detail=f"{status}: {str(e)[:400]}")
        raise


def create_key(state: ApiState, who: Principal, team: str, role: str, name: str, client: str) -> tuple[KeyRow, str]:
    """A new key (admin): its record and the key itself, which nobody can read again."""
    row, key = state.keys.create(team, role, name=name, created_by=who.key_id)
    record(state, who, "key.create", row.id, client, detail=f"team={row.team} role={row.role}")
    return row, key


def revoke_key(state: ApiState, who: Principal, key_id: str, client: str) -> KeyRow:
    """Revoke a key (admin): refused from the next request on, console sessions included. 404 when unknown."""
    row = state.keys.revoke(key_id)
    record(state, who, "key.revoke", row.id, client, detail=f"team={row.team} role={row.role}")
    return row


def audit_page(state: ApiState, *, limit: int, before: int | None = None, team: str | None = None,
               action: str | None = None, key_id: str | None = None) -> tuple[list[AuditOut], int | None]:
    """A page of the audit log, newest first, and the ``before`` of the next page (None: this is the last)."""
    rows = state.audit.page(limit=limit, before=before, team=team, action=action, key_id=key_id)
    return rows, rows[-1].seq if len(rows) == limit else None
