"""Operations: health (the process answers), readiness (Redis and the retriever answer) and Prometheus metrics;
``/`` sends a browser to the web console. None needs a token."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, RedirectResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from rq import Worker

from t3ar_services.api import schemas as s
from t3ar_services.api.deps import StateDep

router = APIRouter(responses=s.error_responses(401, 403, 404, 409, 413, 422, 503), tags=["ops"])


@router.get("/", include_in_schema=False)
def root(request: Request) -> RedirectResponse:
    """The API's address opened in a browser: the console (its sign-in page when not signed in)."""
    return RedirectResponse(f"{request.scope.get('root_path', '')}/ui", status_code=303)


@router.get("/health", response_model=s.HealthResponse)
def health() -> s.HealthResponse:
    return s.HealthResponse()


@router.get("/ready", response_model=s.ReadyResponse)
def ready(state: StateDep) -> Any:
    """Ready when Redis answers and the retriever is ready (200), else 503 with what is missing."""
    problems = []
    try:
        state.redis.ping()
        redis_ok = True
        workers = Worker.count(queue=state.jobs.queue)
    except Exception as e:
        redis_ok, workers = False, 0
        problems.append(f"redis: {type(e).__name__}: {e}")
    retriever_ok = state.retriever.ready()
    if not retriever_ok:
        problems.append(f"retriever at {state.settings.retriever_url} is not ready")
    body = s.ReadyResponse(ready=redis_ok and retriever_ok, redis=redis_ok, retriever=retriever_ok, workers=workers,
                           detail="; ".join(problems) or None)
    return JSONResponse(body.model_dump(), status_code=200 if body.ready else 503)


@router.get("/metrics", response_class=Response)
def metrics(state: StateDep) -> Response:
    m = state.metrics
    try:
        for name, value in state.jobs.counts().items():
            m.jobs.labels(name).set(value)
        m.workers.set(Worker.count(queue=state.jobs.queue))
    except Exception:  # scrapes must work while Redis is down
        pass
    return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)
