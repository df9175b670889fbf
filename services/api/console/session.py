"""Console sessions: a signed, expiring cookie that names a token without holding it, and CSRF tokens.

The cookie is ``base64url(JSON payload) . base64url(HMAC-SHA256(secret, payload))``; the payload holds the
token's *fingerprint* (an HMAC of the token under the same secret, so the cookie cannot be turned back into the
token), an expiry time and a random nonce. It is checked at every request: signature, expiry, and that the
fingerprint is still that of a token the settings accept. The scope (user or admin) is decided then, from
which token it matches, never from the cookie: a revoked or rotated token (the API restarted with other
tokens) ends its sessions at the next request. The worker token cannot sign in.

Signing out ends a session on the server too (:meth:`Sessions.revoke`): its nonce is kept, until the cookie
would have expired anyway, in a revocation list of this process, so a saved copy of the cookie opens nothing.
The list lives in memory: it does not survive an API restart (a restart with a random session secret ends every
session anyway; with ``T3AR_API_SESSION_SECRET`` set, a cookie signed out before the restart opens pages again
until its expiry).

CSRF: every form carries ``HMAC(secret, "csrf:" + nonce)`` of the session's nonce (a synchronizer token the
page can hold without holding the session); the sign-in form, before any session exists, the same of a random
pre-session nonce kept in its own short-lived cookie. With auth disabled every session is admin.

A named API key (:mod:`t3ar_services.api.keys`) signs in too: its cookie holds the key's id (not secret) besides
the fingerprint, and every request looks the key up, so a revoked key ends its sessions at the next request.
Every session carries its :class:`~t3ar_services.api.keys.Principal` (key id, team, role).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Literal

from pydantic import SecretStr

from t3ar_services.api.keys import ADMIN, ANONYMOUS, USER, KeyStore, Principal
from t3ar_services.api.settings import ApiSettings

SESSION_COOKIE = "t3ar_session"
LOGIN_COOKIE = "t3ar_login"  # the pre-session nonce of the sign-in form's CSRF token
LOGIN_TTL = 1800
MAX_REVOKED = 100_000  # signed-out sessions remembered (about 100 bytes each)
ConsoleScope = Literal["token", "admin"]


@dataclass(frozen=True)
class Session:
    scope: ConsoleScope
    nonce: str
    expires: float
    csrf: str
    who: Principal = USER

    @property
    def admin(self) -> bool:
        return self.scope == "admin"

    @property
    def can_submit(self) -> bool:
        return self.who.can_submit


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Sessions:
    """Signs and checks console cookies for one API process (settings are frozen: the tokens cannot change
    under it; a restart with other tokens changes what :meth:`scope_of_fingerprint` accepts)."""

    def __init__(self, settings: ApiSettings, keys: KeyStore | None = None) -> None:
        self.settings = settings
        self.keys = keys
        secret = settings.session_secret
        self._key = secret.get_secret_value().encode() if secret is not None else secrets.token_bytes(32)
        self.ttl = settings.session_ttl
        self.revoked: dict[str, float] = {}  # nonce -> its cookie's expiry, in the order of sign-out
        self._lock = threading.Lock()

    def _mac(self, purpose: str, value: str) -> str:
        return _b64(hmac.new(self._key, f"{purpose}:{value}".encode(), hashlib.sha256).digest())

    def fingerprint(self, token: str) -> str:
        return self._mac("token", token)

    def csrf_for(self, nonce: str) -> str:
        return self._mac("csrf", nonce)

    def _known(self) -> list[tuple[ConsoleScope, SecretStr | None]]:
        return [("admin", self.settings.admin_token), ("token", self.settings.token)]

    def scope_of_token(self, token: str) -> ConsoleScope | None:
        """The scope a sign-in with ``token`` gets, or None (unknown token, or the worker token)."""
        if self.settings.auth_disabled:
            return "admin"
        raw = token.encode()
        for scope, known in self._known():
            if known is not None and secrets.compare_digest(raw, known.get_secret_value().encode()):
                return scope
        return None

    def principal_of_token(self, token: str) -> Principal | None:
        """Who a sign-in with ``token`` is: the admin or user token, a valid named key, else None."""
        scope = self.scope_of_token(token)
        if scope is not None:
            return ANONYMOUS if self.settings.auth_disabled else ADMIN if scope == "admin" else USER
        return self.keys.lookup(token) if self.keys is not None else None

    def scope_of_fingerprint(self, fp: str) -> ConsoleScope | None:
        if self.settings.auth_disabled:
            return "admin"
        for scope, known in self._known():
            if known is not None and secrets.compare_digest(fp, self.fingerprint(known.get_secret_value())):
                return scope
        return None

    def issue(self, token: str, now: float | None = None) -> str:
        """The cookie value of a new session for ``token`` (which the caller checked with :meth:`scope_of_token`)."""
        now = time.time() if now is None else now
        payload: dict[str, object] = {"f": self.fingerprint(token), "e": int(now + self.ttl),
                                      "n": secrets.token_urlsafe(16)}
        who = self.keys.lookup(token) if self.keys is not None and self.scope_of_token(token) is None else None
        if who is not None:
            payload["k"] = who.key_id
        body = _b64(json.dumps(payload, separators=(",", ":")).encode())
        return f"{body}.{self._mac('session', body)}"

    def _signed(self, cookie: str | None) -> tuple[str, float, str, str | None] | None:
        """(token fingerprint, expiry, nonce, key id) of a session cookie this console signed; None for no cookie,
        a forged one or one that does not parse."""
        if not cookie or cookie.count(".") != 1:
            return None
        body, mac = cookie.split(".")
        if not secrets.compare_digest(mac, self._mac("session", body)):
            return None
        try:
            payload = json.loads(_unb64(body))
            return (str(payload["f"]), float(payload["e"]), str(payload["n"]),
                    str(payload["k"]) if "k" in payload else None)
        except (ValueError, KeyError, TypeError):
            return None

    def read(self, cookie: str | None, now: float | None = None) -> Session | None:
        """The session a cookie names, or None: missing, forged, expired, or its token no longer accepted."""
        signed = self._signed(cookie)
        if signed is None:
            return None
        fp, expires, nonce, key_id = signed
        if expires <= (time.time() if now is None else now):
            return None
        if nonce in self.revoked:
            return None
        if key_id is not None and not self.settings.auth_disabled:  # a named key: while it is not revoked
            who = self.keys.active(key_id) if self.keys is not None else None
            if who is None:
                return None
            return Session(scope="admin" if who.admin else "token", nonce=nonce, expires=expires,
                           csrf=self.csrf_for(nonce), who=who)
        scope = self.scope_of_fingerprint(fp)
        if scope is None:
            return None
        who = ANONYMOUS if self.settings.auth_disabled else ADMIN if scope == "admin" else USER
        return Session(scope=scope, nonce=nonce, expires=expires, csrf=self.csrf_for(nonce), who=who)

    def ended(self, cookie: str | None, now: float | None = None) -> str | None:
        """Why a session cookie of ours no longer opens the console: ``revoked`` (its API key was revoked),
        ``expired``, else None (no cookie, a forged one, or signed out). Only a cookie :meth:`read` refuses."""
        signed = self._signed(cookie)
        if signed is None:
            return None
        _, expires, nonce, key_id = signed
        if nonce in self.revoked:
            return None
        if expires <= (time.time() if now is None else now):
            return "expired"
        if key_id is not None and self.keys is not None and self.keys.active(key_id) is None:
            return "revoked"
        return None

    def revoke(self, session: Session, now: float | None = None) -> None:
        """End ``session`` on the server (sign-out). Revocations are forgotten once their cookie expired, so the
        list holds at most the sessions signed out within one ``session_ttl`` (and at most
        :data:`MAX_REVOKED`: past that the oldest are dropped, a bound no sign-in rate reaches in practice)."""
        now = time.time() if now is None else now
        with self._lock:
            self.revoked[session.nonce] = session.expires
            # oldest first; one that expires earlier than those before it (a long-lived session signed out
            # late) is dropped once they are: it is refused meanwhile anyway
            for nonce, expires in list(self.revoked.items()):
                if expires > now and len(self.revoked) <= MAX_REVOKED:
                    break
                del self.revoked[nonce]

    def csrf_ok(self, nonce: str | None, given: object) -> bool:
        return bool(nonce) and isinstance(given, str) and secrets.compare_digest(given, self.csrf_for(str(nonce)))

    def new_login_nonce(self) -> str:
        return secrets.token_urlsafe(16)
