"""The `t3ar` command line. Logging is configured here, once."""

from __future__ import annotations

import importlib
import logging
import os

import click

from t3ar import __version__
from t3ar.cli.model_cmds import adapt_cmd, evaluate_cmd, train_source

# Command groups that live in their own modules: (module, attribute).
_GROUPS = [
    ("t3ar.cli.data_cmd", "data"),
    ("t3ar.cli.pool_cmd", "pool"),
    ("t3ar.cli.serve_cmd", "serve"),
    ("t3ar.cli.bench_cmd", "bench"),
    ("t3ar.cli.stack_cmd", "up"),
    ("t3ar.cli.stack_cmd", "worker"),
]


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
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


cli.add_command(train_source)
cli.add_command(adapt_cmd)
cli.add_command(evaluate_cmd)
for _module, _attr in _GROUPS:
    try:
        cli.add_command(getattr(importlib.import_module(_module), _attr))
    except (ModuleNotFoundError, AttributeError) as _exc:
        if not getattr(_exc, "name", "").startswith("t3ar.cli") and not isinstance(_exc, AttributeError):
            raise


def main() -> None:
    cli(prog_name="t3ar")


if __name__ == "__main__":
    main()
