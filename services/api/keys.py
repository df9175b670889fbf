"""Teams and named API keys: who a request is (:class:`Principal`: a key id, a team, a role) and the key store.

Roles, each including the one before it:

- ``read``: its team's jobs and models (their checkpoints, exports and reports), lineage, the pool's search;
- ``submit``: read, plus submitting jobs, uploading models, cancelling and readapting its team's jobs;
- ``admin``: everything, for every team, plus withdrawals, compaction, keys and the audit log.

The single-token set-up keeps working as the team ``default``: the user token (``T3AR_API_TOKEN``) is the key
``token:user`` with role ``submit``, the admin token (``T3AR_API_ADMIN_TOKEN``) the key ``token:admin`` with role
``admin``; with auth disabled every request is ``anonymous``, an admin of ``default``.

A key is ``t3ar_<id>_<43 random url-safe characters>`` (256 bits from :func:`secrets.token_urlsafe`), shown once
when it is made; the store keeps its sha256 only (``api_keys`` in ``api.sqlite3``). A slow password hash (bcrypt,
argon2) defends a guessable secret against a stolen digest; a 256-bit random key is not guessable, so one sha256
is as strong and lets every request be checked by one indexed look-up. The id is not secret (it names the key in
lists and the audit log). A revoked key is refused from the next request on, console sessions signed in with it
included (sessions hold the key id, and every request looks the key up).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
import secrets
from dataclasses import dataclass
from typing import Any, Literal, get_args

from t3ar.errors import InvalidInputError
from t3ar_services.api.sqlite_db import SqliteStore
from t3ar_services.common.errors import NotFoundError

Role = Literal["read", "submit", "admin"]
ROLES: tuple[str, ...] = get_args(Role)
DEFAULT_TEAM = "default"
USER_TOKEN_ID = "token:user"
ADMIN_TOKEN_ID = "token:admin"
ANONYMOUS_ID = "anonymous"
TEAM_PATTERN = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
KEY_PREFIX = "t3ar_"
MAX_NAME = 200

#: the credentials-first middleware's scope of each role (``token``: the user token's, which may submit)
SCOPE_OF_ROLE = {"read": "read", "submit": "token", "admin": "admin"}


@dataclass(frozen=True)
class Principal:
    """Who a request is: the key id (not secret), its team and its role."""

    key_id: str
    team: str
    role: Role

    @property
    def admin(self) -> bool:
        return self.role == "admin"

    @property
    def can_submit(self) -> bool:
        return self.role in ("submit", "admin")

    @property
    def scope(self) -> str:
        return SCOPE_OF_ROLE[self.role]

    def sees(self, teams: set[str] | str) -> bool:
        """Whether this principal may see what belongs to ``teams`` (admins see every team's)."""
        return self.admin or self.team in ({teams} if isinstance(teams, str) else teams)

    @property
    def team_filter(self) -> str | None:
        """The team lists are filtered to: None (every team) for admins."""
        return None if self.admin else self.team


USER = Principal(USER_TOKEN_ID, DEFAULT_TEAM, "submit")
ADMIN = Principal(ADMIN_TOKEN_ID, DEFAULT_TEAM, "admin")
ANONYMOUS = Principal(ANONYMOUS_ID, DEFAULT_TEAM, "admin")


@dataclass(frozen=True)
class KeyRow:
    id: str
    team: str
    role: Role
    name: str
    created_at: str
    created_by: str
    revoked_at: str | None

    def principal(self) -> Principal:
        return Principal(self.id, self.team, self.role)

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "team": self.team, "role": self.role, "name": self.name,
                "created_at": self.created_at, "created_by": self.created_by, "revoked_at": self.revoked_at}


def digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def check_team(team: str) -> str:
    if not TEAM_PATTERN.fullmatch(team):
        raise InvalidInputError(f"invalid team {team[:80]!r}: 1-63 of a-z, 0-9, '_' and '-', starting with a letter "
                                "or digit")
    return team


def check_role(role: str) -> Role:
    if role not in ROLES:
        raise InvalidInputError(f"invalid role {role[:40]!r}: one of {', '.join(ROLES)}")
    return role  # type: ignore[return-value]


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


_SCHEMA = """
CREATE TABLE IF NOT EXISTS api_keys (
    id TEXT PRIMARY KEY, digest TEXT NOT NULL UNIQUE, team TEXT NOT NULL, role TEXT NOT NULL, name TEXT NOT NULL,
    created_at TEXT NOT NULL, created_by TEXT NOT NULL, revoked_at TEXT
);
"""


class KeyStore(SqliteStore):
    """The named API keys, in the API's SQLite file (its own connection; SQLite serialises the writers)."""

    schema = _SCHEMA

    def create(self, team: str, role: str, *, name: str = "", created_by: str) -> tuple[KeyRow, str]:
        """A new key of ``team`` with ``role``: its record and the key itself (shown once, never stored)."""
        team, role = check_team(team), check_role(role)
        if len(name) > MAX_NAME or not name.isprintable():
            raise InvalidInputError(f"a key's name is at most {MAX_NAME} printable characters")
        key_id = "k" + secrets.token_hex(8)
        key = f"{KEY_PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
        row = KeyRow(key_id, team, role, name, _now(), created_by, None)
        with self._lock:
            self._db.execute("INSERT INTO api_keys VALUES (?,?,?,?,?,?,?,NULL)",
                             (row.id, digest(key), row.team, row.role, row.name, row.created_at, row.created_by))
        return row, key

    def lookup(self, key: str) -> Principal | None:
        """The principal of a valid (known, not revoked) key, else None. Only keys of our shape are looked up."""
        if not key.startswith(KEY_PREFIX) or len(key) > 200:
            return None
        with self._lock:
            found = self._db.execute("SELECT id, team, role FROM api_keys WHERE digest = ? AND revoked_at IS NULL",
                                     (digest(key),)).fetchone()
        return Principal(found[0], found[1], found[2]) if found else None

    def revoked_at(self, key: str) -> str | None:
        """When the key ``key`` was revoked; None for a key that is valid or that we never made."""
        if not key.startswith(KEY_PREFIX) or len(key) > 200:
            return None
        with self._lock:
            found = self._db.execute("SELECT revoked_at FROM api_keys WHERE digest = ?", (digest(key),)).fetchone()
        return str(found[0]) if found and found[0] else None

    def active(self, key_id: str) -> Principal | None:
        """The principal of key ``key_id`` while it is not revoked (a console session's check)."""
        with self._lock:
            found = self._db.execute("SELECT id, team, role FROM api_keys WHERE id = ? AND revoked_at IS NULL",
                                     (key_id,)).fetchone()
        return Principal(found[0], found[1], found[2]) if found else None

    def revoke(self, key_id: str) -> KeyRow:
        """Revoke a key (idempotent: revoking it again keeps the first time); 404 for an unknown id."""
        with self._lock:
            self._db.execute("UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
                             (_now(), key_id))
        row = self.get(key_id)
        if row is None:
            raise NotFoundError(f"no key {key_id[:80]!r}; list them with GET /keys")
        return row

    def get(self, key_id: str) -> KeyRow | None:
        with self._lock:
            found = self._db.execute("SELECT id, team, role, name, created_at, created_by, revoked_at FROM api_keys "
                                     "WHERE id = ?", (key_id,)).fetchone()
        return KeyRow(*found) if found else None

    def list(self, *, team: str | None = None, revoked: bool = True) -> list[KeyRow]:
        sql = "SELECT id, team, role, name, created_at, created_by, revoked_at FROM api_keys WHERE 1=1"
        args: list[Any] = []
        if team is not None:
            sql += " AND team = ?"
            args.append(team)
        if not revoked:
            sql += " AND revoked_at IS NULL"
        with self._lock:
            rows = self._db.execute(sql + " ORDER BY created_at, id", args).fetchall()
        return [KeyRow(*r) for r in rows]
