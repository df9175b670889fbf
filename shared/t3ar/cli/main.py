"""The `t3ar` command line. Logging is configured here, once.

Service commands import their heavy dependencies (uvicorn, rq, ...) inside the command, so `t3ar --help`
stays fast and the core CLI works without the service extras installed.
"""

from __future__ import annotations

import os

import click

from t3ar import __version__
from t3ar.cli.bench_cmd import bench
from t3ar.cli.data_cmd import data
from t3ar.cli.job_cmd import jobs, models, submit, withdraw
from t3ar.cli.model_cmds import adapt_cmd, evaluate_cmd, train_source
from t3ar.cli.pool_cmd import pool
from t3ar.cli.serve_api import api
from t3ar.cli.serve_cmd import serve
from t3ar.cli.stack_cmd import up, worker
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


serve.add_command(api)
for _command in (train_source, adapt_cmd, evaluate_cmd, data, pool, serve, bench, up, worker, submit, jobs, models,
                 withdraw):
    cli.add_command(_command)


def main() -> None:
    cli(prog_name="t3ar")


if __name__ == "__main__":
    main()
