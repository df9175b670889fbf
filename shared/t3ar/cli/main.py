"""The `t3ar` command line. Logging is configured here, once.

Commands of other packages plug in through the ``t3ar.commands`` entry-point group (the services' ``serve``,
``up`` and ``worker``; the benchmarks' ``bench``, from their own distribution): the library never names them. A
plugin that cannot be loaded stays listed, and using it prints why instead of taking the whole CLI down.
"""

from __future__ import annotations

import os
from importlib.metadata import EntryPoint, entry_points

import click

from t3ar import __version__
from t3ar.cli.compact_cmd import compact
from t3ar.cli.data_cmd import data
from t3ar.cli.export_cmd import export_cmd
from t3ar.cli.job_cmd import jobs, models, submit, withdraw
from t3ar.cli.keys_cmd import audit, keys
from t3ar.cli.model_cmds import adapt_cmd, evaluate_cmd, train_source
from t3ar.cli.pool_cmd import pool
from t3ar.logs import configure_logging


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="t3ar")
@click.option("--log-level", default=lambda: os.environ.get("T3AR_LOG_LEVEL", "WARNING"), show_default="WARNING",
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
              help="Logging verbosity (env T3AR_LOG_LEVEL).")
def cli(log_level: str) -> None:
    """t3ar: Train/Test-Time Adaptation with Retrieval.

    Adapt an image classifier to new target data with pseudo-labels and a contrastive loss whose
    negatives are retrieved from an unlabelled auxiliary pool.
    """
    try:
        configure_logging(log_level)
    except ValueError as e:  # T3AR_LOG_FORMAT
        raise click.UsageError(str(e)) from None


PLUGIN_GROUP = "t3ar.commands"


def _unavailable(ep: EntryPoint, error: Exception) -> click.Command:
    """A stand-in for a plugin command that failed to load: listed in --help, says why when used."""
    why = f"{type(error).__name__}: {error}"

    def fail() -> None:
        raise click.ClickException(f"the `{ep.name}` command could not be loaded ({ep.value}): {why}; "
                                   f"is the package that provides it installed with its extras?")

    return click.Command(ep.name, callback=fail, help=f"(unavailable: {why})",
                         context_settings={"ignore_unknown_options": True, "allow_extra_args": True})


def add_plugins(group: click.Group, entry_point_group: str = PLUGIN_GROUP) -> None:
    """Add every command named in ``entry_point_group`` (installed distributions' metadata) to ``group``."""
    for ep in sorted(entry_points(group=entry_point_group), key=lambda e: e.name):
        try:
            command = ep.load()
            if not isinstance(command, click.Command):
                raise TypeError(f"{ep.value} is a {type(command).__name__}, not a click command")
        except Exception as e:  # any failure of a plugin import must leave the core CLI usable
            command = _unavailable(ep, e)
        group.add_command(command, ep.name)


for _command in (train_source, adapt_cmd, evaluate_cmd, export_cmd, data, pool, submit, jobs, models, withdraw, keys,
                 audit):
    cli.add_command(_command)
pool.add_command(compact)
add_plugins(cli)
add_plugins(pool, "t3ar.pool_commands")  # `t3ar pool migrate` (the services' pool commands)


def main() -> None:
    cli(prog_name="t3ar")


if __name__ == "__main__":
    main()
