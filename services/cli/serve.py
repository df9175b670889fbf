"""``t3ar serve retriever`` and ``t3ar serve api``: run a service in this process (uvicorn, programmatically).

``python -m t3ar_services.cli.serve api ...`` runs the same group without the rest of the CLI (no torch import:
that is how ``t3ar up`` and the compose file start the API). Logging is configured here, once. SIGTERM /
Ctrl-C stop the server gracefully: in-flight requests finish, then the retriever saves its index (so the next
start does not need to rebuild it).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from t3ar.logs import configure_logging

if TYPE_CHECKING:
    from pydantic_settings import BaseSettings


@click.group("serve")
def serve() -> None:
    """Run a t3ar service in the foreground."""


_LOG_LEVEL = click.option("--log-level", default="info", show_default=True,
                          type=click.Choice(["debug", "info", "warning", "error"]))


def _settings(cls: type[BaseSettings], what: str, **overrides: Any) -> Any:
    """``cls`` from the environment with the command-line values that were given; invalid -> a one-line error."""
    from pydantic import ValidationError

    try:
        return cls(**{k: v for k, v in overrides.items() if v is not None and v is not False})
    except ValidationError as e:
        msgs = "; ".join(err["msg"].removeprefix("Value error, ") for err in e.errors())
        raise click.ClickException(f"invalid {what} settings: {msgs}") from e


def _run(app: Any, settings: Any, host: str, port: int, log_level: str, what: str) -> None:
    import uvicorn

    from t3ar_services.common.serving import uvicorn_options

    # forwarded headers, header timeout, connection cap: the service's settings (common/serving.py)
    config = uvicorn.Config(app, host=host, port=port, log_config=None, log_level=log_level,
                            timeout_graceful_shutdown=30, access_log=log_level == "debug", **uvicorn_options(settings))
    server = uvicorn.Server(config)
    server.run()
    if not server.started:
        raise click.ClickException(f"the {what} did not start; the reason is in the log above")


def _configure(log_level: str) -> None:
    try:
        configure_logging(log_level)  # T3AR_LOG_FORMAT: text or json
    except ValueError as e:
        raise click.ClickException(str(e)) from None


@serve.command("retriever")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Pool directory (default: T3AR_RETRIEVER_DATA_DIR or data/retriever).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--port", default=8701, show_default=True, type=click.IntRange(1, 65535))
@click.option("--reembed", is_flag=True,
              help="If the pool was built by another embedder, re-embed it with the configured one at start-up.")
@click.option("--pool-backend", type=click.Choice(["faiss", "milvus"]), default=None,
              help="Where the vector index lives: faiss (in this process, default) or milvus "
                   "(T3AR_RETRIEVER_MILVUS_URI; default milvus-lite in the data directory). "
                   "Default: T3AR_RETRIEVER_BACKEND or faiss.")
@_LOG_LEVEL
def retriever(data_dir: Path | None, host: str, port: int, reembed: bool, pool_backend: str | None,
              log_level: str) -> None:
    """Serve the pool (add / search / get / delete) over HTTP.

    Every other setting comes from T3AR_RETRIEVER_* environment variables (see services/retriever/README.md),
    e.g. T3AR_RETRIEVER_TOKEN and T3AR_RETRIEVER_ADMIN_TOKEN.

    \b
    Example:
      T3AR_RETRIEVER_AUTH_DISABLED=true t3ar serve retriever --data-dir data/pool --port 8701
    """
    from t3ar_services.retriever.main import create_app
    from t3ar_services.retriever.settings import RetrieverSettings

    _configure(log_level)
    settings = _settings(RetrieverSettings, "retriever", data_dir=data_dir, reembed_on_start=reembed,
                         backend=pool_backend)
    _run(create_app(settings), settings, host, port, log_level, "retriever")


@serve.command("api")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Models, jobs and artifacts (default: T3AR_API_DATA_DIR or data/api).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--port", default=8700, show_default=True, type=click.IntRange(1, 65535))
@click.option("--redis-url", default=None, help="Redis of the job queue (default: T3AR_API_REDIS_URL).")
@click.option("--retriever-url", default=None, help="Retriever base URL (default: T3AR_API_RETRIEVER_URL).")
@_LOG_LEVEL
def api(data_dir: Path | None, host: str, port: int, redis_url: str | None, retriever_url: str | None,
        log_level: str) -> None:
    """Serve the adaptation API: POST /adapt, jobs, checkpoints, DELETE /pool/{id} with lineage.

    Tokens come from T3AR_API_TOKEN (user) and T3AR_API_ADMIN_TOKEN (admin); the retriever's from
    T3AR_API_RETRIEVER_TOKEN and T3AR_API_RETRIEVER_ADMIN_TOKEN (see services/api/README.md).

    \b
    Example:
      T3AR_API_AUTH_DISABLED=true t3ar serve api --data-dir data/api --port 8700 \\
          --redis-url redis://127.0.0.1:6379/0 --retriever-url http://127.0.0.1:8701
    """
    from t3ar_services.api.main import create_app
    from t3ar_services.api.settings import ApiSettings

    _configure(log_level)
    settings = _settings(ApiSettings, "API", data_dir=data_dir, redis_url=redis_url, retriever_url=retriever_url)
    _run(create_app(settings), settings, host, port, log_level, "API")


if __name__ == "__main__":
    serve()
