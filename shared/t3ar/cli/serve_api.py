"""``t3ar serve api``: run the adaptation API in this process (uvicorn, programmatically).

The lead attaches :func:`api` to the ``serve`` group; ``python -m t3ar.cli.serve_api`` runs it standalone
(that is how ``t3ar up`` starts it). Every other setting comes from ``T3AR_API_*`` environment variables.
"""

from __future__ import annotations

from pathlib import Path

import click

from t3ar.logs import configure_logging


@click.command("api")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Models, jobs and artifacts (default: T3AR_API_DATA_DIR or data/api).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--port", default=8700, show_default=True, type=click.IntRange(1, 65535))
@click.option("--redis-url", default=None, help="Redis of the job queue (default: T3AR_API_REDIS_URL).")
@click.option("--retriever-url", default=None, help="Retriever base URL (default: T3AR_API_RETRIEVER_URL).")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
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
    import uvicorn
    from pydantic import ValidationError

    from services.api.main import create_app
    from services.api.settings import ApiSettings

    try:
        configure_logging(log_level)  # T3AR_LOG_FORMAT: text or json
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    overrides: dict[str, object] = {}
    for key, value in (("data_dir", data_dir), ("redis_url", redis_url), ("retriever_url", retriever_url)):
        if value is not None:
            overrides[key] = value
    try:
        settings = ApiSettings(**overrides)  # type: ignore[arg-type]
    except ValidationError as e:
        msgs = "; ".join(err["msg"].removeprefix("Value error, ") for err in e.errors())
        raise click.ClickException(f"invalid API settings: {msgs}") from e
    config = uvicorn.Config(create_app(settings), host=host, port=port, log_config=None, log_level=log_level,
                            timeout_graceful_shutdown=30, access_log=log_level == "debug")
    server = uvicorn.Server(config)
    server.run()
    if not server.started:
        raise click.ClickException("the API did not start; the reason is in the log above")


if __name__ == "__main__":
    api()
