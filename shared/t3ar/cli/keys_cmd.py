"""``t3ar keys create|list|revoke`` and ``t3ar audit``: an admin's named API keys and the audit log, through the
adaptation API (admin token, ``T3AR_API_ADMIN_TOKEN``)."""

from __future__ import annotations

import functools
import os
from typing import Any

import click

from t3ar.cli.common import echo_result, service_options
from t3ar.clients.api import ApiClient
from t3ar.clients.api_models import KeyOut

DEFAULT_URL = "http://127.0.0.1:8700"
ROLES = ("read", "submit", "admin")


def _admin_options(fn: Any) -> Any:
    """The API options, the token from ``T3AR_API_ADMIN_TOKEN`` only: without one the command says that it needs
    the admin token (not the API's "missing bearer token"), whatever user token the environment holds."""

    @functools.wraps(fn)
    def needs_admin(*args: Any, **kwargs: Any) -> Any:
        if not kwargs.get("token"):
            name = click.get_current_context().command_path
            held = " (T3AR_API_TOKEN is set, but the user token cannot do this)" if os.environ.get(
                "T3AR_API_TOKEN") else ""
            raise click.UsageError(f"`{name}` needs an admin token: set T3AR_API_ADMIN_TOKEN or pass --token with "
                                   f"the admin token or a key with role admin{held}")
        return fn(*args, **kwargs)

    return service_options("API", "T3AR_API_URL", DEFAULT_URL, ["T3AR_API_ADMIN_TOKEN"])(needs_admin)


def _key_line(k: KeyOut) -> str:
    state = f"revoked {k.revoked_at[:19]}" if k.revoked_at else "active"
    name = f"  {k.name}" if k.name else ""
    return f"{k.id}  {k.team:<16} {k.role:<6}  {state:<27} created {k.created_at[:19]}{name}"


@click.group("keys")
def keys() -> None:
    """Named API keys (admin): each acts for one team with one role (read, submit or admin)."""


@keys.command("create")
@click.option("--team", required=True, help="The team the key acts for (a-z, 0-9, '_', '-').")
@click.option("--role", type=click.Choice(ROLES), default="submit", show_default=True,
              help="read: the team's jobs and models; submit: also submit, upload, cancel, readapt; admin: all.")
@click.option("--name", default="", help="What the key is for (shown in lists).")
@_admin_options
def keys_create(team: str, role: str, name: str, url: str, token: str | None, as_json: bool) -> None:
    """Make a key and print it, once: it is never shown again (the API keeps its sha256 only)."""
    with ApiClient(url, token) as client:
        made = client.create_key(team, role, name)
    if as_json:
        echo_result(True, made, "")
        return
    click.echo(made.key)
    click.echo(f"key {made.id}: team {made.team}, role {made.role}. Store it now: it is shown this once "
               "(use it as T3AR_API_TOKEN or sign in to the console with it).", err=True)


@keys.command("list")
@click.option("--team", default=None, help="Only this team's keys.")
@click.option("--active", is_flag=True, help="Only keys that are not revoked.")
@_admin_options
def keys_list(team: str | None, active: bool, url: str, token: str | None, as_json: bool) -> None:
    """Every key (never the keys themselves), oldest first."""
    with ApiClient(url, token) as client:
        found = client.list_keys(team=team, revoked=not active)
    echo_result(as_json, found, "\n".join(_key_line(k) for k in found) or "(no keys)")


@keys.command("revoke")
@click.argument("key_id")
@_admin_options
def keys_revoke(key_id: str, url: str, token: str | None, as_json: bool) -> None:
    """Revoke a key: refused from the next request on, its console sessions too."""
    with ApiClient(url, token) as client:
        done = client.revoke_key(key_id)
    echo_result(as_json, done, _key_line(done))


@click.command("audit")
@click.option("--team", default=None, help="Only this team's entries.")
@click.option("--action", default=None, help="Only this action (job.submit, job.download, key.create, sign_in, ...).")
@click.option("--key", "key_id", default=None, help="Only this key id's entries.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 1000))
@click.option("--before", default=None, type=click.IntRange(1), help="Older than this entry (a page's next_before).")
@_admin_options
def audit(team: str | None, action: str | None, key_id: str | None, limit: int, before: int | None, url: str,
          token: str | None, as_json: bool) -> None:
    """The audit log (admin), newest first: when, who (key id and team), what, to what, from where."""
    with ApiClient(url, token) as client:
        page = client.audit(limit=limit, before=before, team=team, action=action, key_id=key_id)
    lines = [f"{e.at[:23]}  {e.key_id:<18} {e.team:<12} {e.action:<22} {e.target:<34} "
             f"{e.client:<15} {e.outcome}{'  ' + e.detail if e.detail else ''}" for e in page.entries]
    if page.next_before:
        lines.append(f"(older: --before {page.next_before})")
    echo_result(as_json, page, "\n".join(lines) or "(nothing recorded)")
