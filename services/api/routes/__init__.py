"""The JSON API's routes, one module per resource (as the FastAPI full-stack template's ``api/routes/``):
:mod:`.ops` (health, readiness, metrics), :mod:`.models`, :mod:`.jobs`, :mod:`.pool`, :mod:`.internal` (the
workers') and :mod:`.keys` (an admin's API keys and audit log). Each route parses the request, calls the domain
layer (:mod:`t3ar_services.api.domain`) and shapes its answer;
domain errors become HTTP statuses in :mod:`t3ar_services.api.errors`."""

from __future__ import annotations

from fastapi import APIRouter

from t3ar_services.api.routes import internal, jobs, keys, models, ops, pool

ROUTERS: list[APIRouter] = [ops.router, models.router, pool.router, jobs.router, internal.router, keys.router]
