"""``t3ar serve``: run a service in this process (uvicorn, programmatically).

Logging is configured here, once. SIGTERM / Ctrl-C stop the server gracefully: in-flight requests finish,
then the retriever saves its index (so the next start does not need to rebuild it).
"""

from __future__ import annotations

from pathlib import Path

import click

from t3ar.logs import configure_logging


@click.group("serve")
def serve() -> None:
    """Run a t3ar service in the foreground."""


@serve.command("retriever")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Pool directory (default: T3AR_RETRIEVER_DATA_DIR or data/retriever).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--port", default=8701, show_default=True, type=click.IntRange(1, 65535))
@click.option("--reembed", is_flag=True,
              help="If the pool was built by another embedder, re-embed it with the configured one at start-up.")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
def retriever(data_dir: Path | None, host: str, port: int, reembed: bool, log_level: str) -> None:
    """Serve the pool (add / search / get / delete) over HTTP.

    Every other setting comes from T3AR_RETRIEVER_* environment variables (see services/retriever/README.md),
    e.g. T3AR_RETRIEVER_TOKEN and T3AR_RETRIEVER_ADMIN_TOKEN.

    \b
    Example:
      T3AR_RETRIEVER_AUTH_DISABLED=true t3ar serve retriever --data-dir data/pool --port 8701
    """
    import uvicorn
    from pydantic import ValidationError

    from services.retriever.main import create_app
    from services.retriever.settings import RetrieverSettings

    try:
        configure_logging(log_level)  # T3AR_LOG_FORMAT: text or json
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    overrides: dict[str, object] = {}
    if data_dir is not None:
        overrides["data_dir"] = data_dir
    if reembed:
        overrides["reembed_on_start"] = True
    try:
        settings = RetrieverSettings(**overrides)  # type: ignore[arg-type]
    except ValidationError as e:
        msgs = "; ".join(err["msg"].removeprefix("Value error, ") for err in e.errors())
        raise click.ClickException(f"invalid retriever settings: {msgs}") from e
    config = uvicorn.Config(create_app(settings), host=host, port=port, log_config=None, log_level=log_level,
                            timeout_graceful_shutdown=30, access_log=log_level == "debug")
    server = uvicorn.Server(config)
    server.run()
    if not server.started:
        raise click.ClickException("the retriever did not start; the reason is in the log above")
