"""MLflow's own tracking server as a child process (``t3ar up --mlflow``, and the tests marked ``mlflow_server``):
a SQLite backend store and a local artifact store under one folder, served (with its model registry and the
artifact proxy) on 127.0.0.1.

    <folder>/mlflow.sqlite3     runs, experiments, registered models and versions
    <folder>/artifacts/         the runs' files and logged models (uploaded through the server)
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


class MlflowMissingError(RuntimeError):
    """The ``mlflow`` extra is not installed."""


def mlflow_command() -> str:
    """The ``mlflow`` console script of this interpreter's environment (the ``mlflow`` extra)."""
    here = Path(sys.executable).with_name("mlflow")
    found = str(here) if here.is_file() else shutil.which("mlflow")
    if not found:
        raise MlflowMissingError("`mlflow` is not installed: pip install 't3ar[mlflow]' (scripts/setup.sh installs "
                                 "it)")
    return found


def server_argv(folder: Path, port: int, host: str = "127.0.0.1") -> list[str]:
    """The command line of a tracking server keeping everything under ``folder`` (made if missing)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "artifacts").mkdir(exist_ok=True)
    return [mlflow_command(), "server", "--backend-store-uri", f"sqlite:///{(folder / 'mlflow.sqlite3').resolve()}",
            "--artifacts-destination", str((folder / "artifacts").resolve()), "--serve-artifacts",
            "--host", host, "--port", str(port), "--workers", "1"]


def health_url(url: str) -> str:
    return f"{url.rstrip('/')}/health"
