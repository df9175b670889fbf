"""The `t3ar` CLI gets the services' commands through the ``t3ar.commands`` entry-point group; a plugin that
cannot be loaded is listed and explains itself instead of breaking the CLI."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

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


def test_bench_commands_come_from_the_benchmarks_distribution() -> None:
    """`t3ar bench` is not the product's: the t3ar-bench distribution (bench/, installed by scripts/setup.sh)
    registers it in the same group, with the same sub-commands as when it lived in the product."""
    (ep,) = [ep for ep in cli_main.entry_points(group=cli_main.PLUGIN_GROUP) if ep.name == "bench"]
    assert ep.value == "t3ar_bench.cli:bench"
    bench = cli_main.cli.commands["bench"]
    assert isinstance(bench, click.Group) and bench.callback is not None
    assert bench.callback.__module__ == "t3ar_bench.cli"
    assert set(bench.commands) == {"adapt", "compaction", "continual", "gpu-pack", "job", "mixed", "neighbours", "pool",
                                   "retrieval", "speed"}


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


def test_the_cli_and_a_vectors_only_retriever_do_not_load_torch(tmp_path: Path) -> None:
    """`t3ar` starts every command, services included: loading torch up front cost the retriever's process
    ~0.6 GB resident that a vectors-only pool never uses. Commands import it when they run."""
    code = f"""
import sys, time, click
from fastapi.testclient import TestClient
from t3ar.cli.main import cli
def walk(group, ctx):
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if isinstance(cmd, click.Group):
            walk(cmd, click.Context(cmd, parent=ctx))
walk(cli, click.Context(cli))
assert "torch" not in sys.modules, "importing the CLI's commands loaded torch"
from t3ar_services.retriever.main import create_app
from t3ar_services.retriever.settings import RetrieverSettings
settings = RetrieverSettings(data_dir={str(tmp_path)!r}, token="a", admin_token="b", embedder="none", vector_dim=8,
                             vector_identity="s")
with TestClient(create_app(settings)) as client:
    while client.get("/ready").status_code != 200:
        time.sleep(0.05)
assert "torch" not in sys.modules, "a vectors-only retriever loaded torch"
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_pool_subcommands_come_from_their_own_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """`t3ar pool migrate` (issue 12) lives in the services and joins the library's `pool` group."""
    migrate = EntryPoint("migrate", "t3ar_services.cli.pool_migrate:migrate", "t3ar.pool_commands")
    monkeypatch.setattr(cli_main, "entry_points", lambda group: [migrate] if group == "t3ar.pool_commands" else [])
    group = click.Group("pool")
    cli_main.add_plugins(group, "t3ar.pool_commands")
    assert set(group.commands) == {"migrate"}
    out = CliRunner().invoke(group, ["migrate", "--help"])
    assert out.exit_code == 0 and "Usage: pool migrate" in out.output and "--to" in out.output
