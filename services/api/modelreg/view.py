"""A job's registration as the API answers it (:class:`t3ar.clients.api_models.Registration`): state, links into
the MLflow UI, the last error (already scrubbed of credentials), the stale mark and the re-run's version."""

from __future__ import annotations

import datetime as dt
from urllib.parse import quote

from t3ar.clients.api_models import Registration
from t3ar_services.api.modelreg.registrar import Registrar


def view(registrar: Registrar, job_id: str) -> Registration | None:
    reg = registrar.records.get(job_id)
    if reg is None:
        return None
    tags = registrar.records.tags_of(job_id)
    base = registrar.settings.links_base()
    run_url = version_url = None
    if base and reg.run_id and reg.experiment_id:
        run_url = f"{base}/#/experiments/{reg.experiment_id}/runs/{reg.run_id}"
    if base and reg.version:
        version_url = f"{base}/#/models/{quote(reg.name, safe='')}/versions/{reg.version}"
    next_at = None
    if reg.state == "pending" and reg.attempts and reg.next_at:
        next_at = dt.datetime.fromtimestamp(reg.next_at, dt.UTC).isoformat(timespec="seconds")
    superseded = tags.get("t3ar.superseded_by")
    return Registration(
        state=reg.state,  # type: ignore[arg-type]
        name=reg.name, alias=reg.alias, version=reg.version,
        model_uri=f"models:/{reg.name}/{reg.version}" if reg.version else None, run_id=reg.run_id,
        run_url=run_url, version_url=version_url, attempts=reg.attempts, next_attempt_at=next_at, error=reg.error,
        stale="t3ar.stale" in tags, superseded_by=superseded[0] if superseded else None,
        tags_pending=sum(1 for _, done in tags.values() if not done))
