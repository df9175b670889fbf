"""The web console under ``/ui``: server-rendered pages over the JSON API's own functions (no second
implementation), signed-in with an API token into a session cookie. :func:`install_console` adds it to the app.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from t3ar_services.api.console import (
    pages_auth,
    pages_ingest,
    pages_jobs,
    pages_keys,
    pages_models,
    pages_pool,
    pages_submit,
)
from t3ar_services.api.console.answers import ConsoleAnswersMiddleware
from t3ar_services.api.console.session import Sessions
from t3ar_services.api.console.thumbs import Thumbnails
from t3ar_services.api.console.web import (
    PREFIX,
    STATIC_DIR,
    NeedSignIn,
    PageError,
    error_page,
    sign_in_redirect,
)
from t3ar_services.api.settings import ApiSettings

__all__ = ["PREFIX", "install_console"]


def install_console(app: FastAPI, settings: ApiSettings) -> None:
    app.state.console_sessions = Sessions(settings, app.state.api.keys)
    app.state.console_thumbs = Thumbnails()
    app.add_exception_handler(PageError, error_page)
    app.add_exception_handler(NeedSignIn, sign_in_redirect)
    app.mount(f"{PREFIX}/static", StaticFiles(directory=STATIC_DIR), name="console-static")
    # pages_ingest before pages_pool: /ui/pool/ingest is not an item of /ui/pool/{id}
    for module in (pages_auth, pages_jobs, pages_submit, pages_ingest, pages_pool, pages_models, pages_keys):
        app.include_router(module.router)
    app.include_router(pages_auth.fallback)
    app.add_middleware(ConsoleAnswersMiddleware)
