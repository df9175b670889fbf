"""The `t3ar` CLI gets the services' commands through the ``t3ar.commands`` entry-point group; a plugin that
cannot be loaded is listed and explains itself instead of breaking the CLI."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import click
import pytest
from click.testing import CliRunner

from t3ar.cli import main as cli_main


def test_services_commands_come_from_the_entry_point_group() -> None:
    names = {ep.name for ep in cli_main.entry_points(group=cli_main.PLUGIN_GROUP)}
    assert {"serve", "up", "worker"} <= names
    assert {"serve", "up", "worker"} <= set(cli_main.cli.commands)
    serve = cli_main.cli.commands["serve"]
    assert isinstance(serve, click.Group) and set(serve.commands) == {"api", "retriever"}


def test_a_broken_plugin_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = EntryPoint("broken", "t3ar_no_such_package.cli:cmd", cli_main.PLUGIN_GROUP)
    not_a_command = EntryPoint("odd", "os:getcwd", cli_main.PLUGIN_GROUP)
    monkeypatch.setattr(cli_main, "entry_points", lambda group: [broken, not_a_command])
    group = click.Group("t")
    cli_main.add_plugins(group)
    assert set(group.commands) == {"broken", "odd"}
    runner = CliRunner()
    listing = runner.invoke(group, ["--help"])
    assert listing.exit_code == 0 and "unavailable: ModuleNotFoundError" in listing.output
    used = runner.invoke(group, ["broken", "--port", "1"])
    assert used.exit_code == 1
    assert "the `broken` command could not be loaded (t3ar_no_such_package.cli:cmd)" in used.output
    assert "not a click command" in runner.invoke(group, ["odd"]).output
