"""Sign-in and sign-out.

Signing in posts the token once, in a form body (never a URL), with the sign-in form's CSRF token; the answer
sets the session cookie (HttpOnly, SameSite=Strict, path /ui, Secure over https) and never echoes the token.
"""

from __future__ import annotations

import urllib.parse

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from t3ar_services.api.console import web
from t3ar_services.api.console.session import LOGIN_COOKIE, LOGIN_TTL, SESSION_COOKIE
from t3ar_services.api.domain import access
from t3ar_services.common.credentials import token_matches

router = APIRouter(prefix=web.PREFIX, include_in_schema=False)
MAX_LOGIN_BODY = 16 * 1024  # a token and two short fields: the sign-in form is read without any credentials


def secure_cookies(request: Request) -> bool:
    mode = web.api_state(request).settings.cookie_secure
    return mode == "true" or (mode == "auto" and request.url.scheme == "https")


def _set_cookie(request: Request, response: Response, name: str, value: str, max_age: int) -> None:
    response.set_cookie(name, value, max_age=max_age, path=web.PREFIX, httponly=True, samesite="strict",
                        secure=secure_cookies(request))


@router.get("")
def root() -> RedirectResponse:
    return RedirectResponse(f"{web.PREFIX}/jobs", status_code=303)


#: what the sign-in page says when a session ended (``?ended=``: a fixed word, never text from the URL)
ENDED = {"revoked": "Your session ended: the API key it was signed in with has been revoked by an admin. Sign in "
                    "with another key or token.",
         "expired": "Your session expired: sign in again."}


def _service_token(request: Request, token: str) -> str | None:
    """The words for a service token given at sign-in (it opens no console), or None."""
    settings = web.api_state(request).settings
    for secret, words in ((settings.worker_token, "the workers' token (T3AR_API_WORKER_TOKEN): it opens only the "
                                                  "worker routes"),
                          (settings.retriever_token, "the retriever's read/write token (T3AR_RETRIEVER_TOKEN)"),
                          (settings.retriever_admin_token, "the retriever's admin token "
                                                           "(T3AR_RETRIEVER_ADMIN_TOKEN)")):
        if secret is not None and token_matches(token, [secret]):
            return (f"that is {words}, a service token that never signs in to the console: use the user token "
                    "(T3AR_API_TOKEN), the admin token (T3AR_API_ADMIN_TOKEN) or an API key")
    return None


def _refusal(request: Request, token: str) -> str:
    """Why ``token`` does not sign in, in words: a service token, a revoked key (and when), or unknown."""
    if (words := _service_token(request, token)) is not None:
        return words
    keys = web.api_state(request).keys
    if (when := keys.revoked_at(token)) is not None:
        return f"this API key was revoked ({when[:19].replace('T', ' ')} UTC): ask an admin for a new one"
    return "unknown token: use the user token (T3AR_API_TOKEN), the admin token (T3AR_API_ADMIN_TOKEN) or an API key"


@router.get("/login")
def login_page(request: Request, next: str | None = None, error: str = "", ended: str = "") -> Response:
    s = web.sessions(request)
    if s.read(request.cookies.get(SESSION_COOKIE)) is not None:
        return RedirectResponse(web.safe_next(next), status_code=303)
    nonce = s.new_login_nonce()
    page = web.render(request, "login.html", None, status=401 if error else 200, csrf=s.csrf_for(nonce),
                      next=web.safe_next(next), error=error, ended=ENDED.get(ended),
                      auth_disabled=web.api_state(request).settings.auth_disabled)
    _set_cookie(request, page, LOGIN_COOKIE, nonce, LOGIN_TTL)
    return page


async def _small_form(request: Request) -> dict[str, str]:
    length = request.headers.get("content-length")
    if length is None or not length.isdigit() or int(length) > MAX_LOGIN_BODY:
        raise web.PageError(413, "the sign-in form is a token and two short fields")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_LOGIN_BODY:
            raise web.PageError(413, "the sign-in form is a token and two short fields")
    if not request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        raise web.PageError(415, "send the sign-in form as application/x-www-form-urlencoded")
    fields = urllib.parse.parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True, max_num_fields=8)
    return {k: v[0] for k, v in fields.items()}


@router.post("/login")
async def login(request: Request) -> Response:
    s = web.sessions(request)
    if not web.same_origin(request):
        raise web.PageError(403, "cross-origin form posts are refused")
    form = await _small_form(request)
    if not s.csrf_ok(request.cookies.get(LOGIN_COOKIE), form.get("csrf")):
        raise web.PageError(403, "missing or wrong CSRF token: reload the sign-in page and try again")
    next_path = web.safe_next(form.get("next"))
    token = form.get("token", "").strip()
    who = s.principal_of_token(token)
    state = web.api_state(request)
    if who is None:
        # the worker token lands here too: it opens only the worker routes, never the console
        await run_in_threadpool(state.audit.record, key_id="", team="", action="sign_in", client=web.client_of(request),
                                outcome="refused")
        return login_page(request, next_path, error=_refusal(request, token))
    await run_in_threadpool(access.record, state, who, "sign_in", who.key_id, web.client_of(request))
    response = RedirectResponse(next_path, status_code=303)
    _set_cookie(request, response, SESSION_COOKIE, s.issue(token), s.ttl)
    response.delete_cookie(LOGIN_COOKIE, path=web.PREFIX, httponly=True, samesite="strict",
                           secure=secure_cookies(request))
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    session, _ = await web.checked_form(request)
    web.sessions(request).revoke(session)  # the cookie, or a copy of it, opens nothing from now on
    await run_in_threadpool(access.record, web.api_state(request), session.who, "sign_out", session.who.key_id,
                            web.client_of(request))
    response = RedirectResponse(f"{web.PREFIX}/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path=web.PREFIX, httponly=True, samesite="strict",
                           secure=secure_cookies(request))
    return response


fallback = APIRouter(prefix=web.PREFIX, include_in_schema=False)  # included last: an HTML 404 for any other /ui path


@fallback.api_route("/{rest:path}", methods=["GET", "POST"])
def not_found(rest: str) -> Response:
    raise web.PageError(404, f"no console page /ui/{rest}")
