"""``t3ar up`` (the embedded stack: Redis + retriever + API + workers on 127.0.0.1) and ``t3ar worker``.

``up`` runs every part as a child process with one data directory::

    <data-dir>/redis/       Redis' append-only file     <data-dir>/retriever/  the pool
    <data-dir>/api/         models, jobs, artifacts     <data-dir>/logs/       one log per process
    <data-dir>/worker/      the workers' caches and scratch (never the API's: they fetch over HTTP, as a
                            worker on another machine does)
    <data-dir>/stack.json   URLs, tokens, pids (0600)   <data-dir>/tokens.json tokens kept across restarts
    <data-dir>/mlflow/      with --mlflow: MLflow's tracking server (SQLite backend, local artifact store), which
                            the API registers every finished job's model in (T3AR_MLFLOW_TRACKING_URI)

It waits until everything is healthy, prints URLs and tokens, restarts a worker that dies, and on Ctrl-C or
SIGTERM stops workers (letting a running job end or abort), then the API, the retriever (which saves its
index) and Redis. If `up` itself dies (kill -9), its children die with it (a parent-death signal: SIGTERM
for Redis and the services, SIGKILL for workers), and `up` refuses a directory whose earlier stack still
runs (a service holding its data directory's lock, or a process stack.json recorded).
"""

from __future__ import annotations

import fcntl
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import click

from t3ar.ports import free_port
from t3ar.urls import redact_url
from t3ar_services.cli.stack_procs import (
    PY,
    Child,
    earlier_stack,
    load_tokens,
    redis_config,
    redis_server_binary,
    start_time,
    wait_http,
    wait_redis,
    write_private,
)
from t3ar_services.common.private import keep_private


def plan(data_dir: Path, ports: dict[str, int], workers: int, no_auth: bool,
         mlflow_port: int | None = None) -> tuple[list[Child], dict[str, Any]]:
    """The child processes and the stack description (URLs, tokens) for these ports; with ``mlflow_port`` an MLflow
    tracking server too, started before the API, which registers in it."""
    logs = data_dir / "logs"
    for sub in ("redis", "retriever", "api", "worker", "logs"):
        (data_dir / sub).mkdir(parents=True, exist_ok=True)
    tokens = load_tokens(data_dir / "tokens.json")
    redis_url = f"redis://:{tokens['redis_password']}@127.0.0.1:{ports['redis']}/0"
    retriever_url = f"http://127.0.0.1:{ports['retriever']}"
    api_url = f"http://127.0.0.1:{ports['api']}"
    base = dict(os.environ)
    auth: dict[str, str] = {
        "T3AR_RETRIEVER_TOKEN": tokens["retriever_token"],
        "T3AR_RETRIEVER_ADMIN_TOKEN": tokens["retriever_admin_token"],
        "T3AR_API_TOKEN": tokens["api_token"], "T3AR_API_ADMIN_TOKEN": tokens["api_admin_token"],
        "T3AR_API_WORKER_TOKEN": tokens["api_worker_token"]}
    if no_auth:
        auth = {"T3AR_RETRIEVER_AUTH_DISABLED": "true", "T3AR_API_AUTH_DISABLED": "true"}
    retriever_env = {**base, **{k: v for k, v in auth.items() if k.startswith("T3AR_RETRIEVER_")}}
    api_env = {**base, **{k: v for k, v in auth.items() if k.startswith("T3AR_API_")},
               "T3AR_API_REDIS_URL": redis_url, "T3AR_API_RETRIEVER_URL": retriever_url,
               "T3AR_API_RETRIEVER_TOKEN": tokens["retriever_token"],
               "T3AR_API_RETRIEVER_ADMIN_TOKEN": tokens["retriever_admin_token"],
               "T3AR_API_DATA_DIR": str(data_dir / "api")}
    mlflow_url = f"http://127.0.0.1:{mlflow_port}" if mlflow_port else None
    if mlflow_url:
        api_env["T3AR_MLFLOW_TRACKING_URI"] = mlflow_url
    # the workers get only URLs and tokens (and a data dir of their own): the same HTTP path as on another host
    worker_env = {**{k: v for k, v in base.items() if not k.startswith("T3AR_API_")},
                  "T3AR_WORKER_REDIS_URL": redis_url, "T3AR_WORKER_RETRIEVER_URL": retriever_url,
                  "T3AR_WORKER_RETRIEVER_TOKEN": tokens["retriever_token"], "T3AR_WORKER_API_URL": api_url,
                  "T3AR_WORKER_DATA_DIR": str(data_dir / "worker")}
    if not no_auth:
        worker_env["T3AR_WORKER_API_TOKEN"] = tokens["api_worker_token"]
    children = [
        Child("redis", [redis_server_binary(), str(redis_config(data_dir / "redis" / "redis.conf",
                                                               tokens["redis_password"])),
                        "--port", str(ports["redis"]), "--bind", "127.0.0.1",
                        "--dir", str(data_dir / "redis"), "--appendonly", "yes", "--save", "", "--daemonize", "no"],
              base, logs / "redis.log"),
        Child("retriever", [PY, "-m", "t3ar.cli.main", "serve", "retriever", "--data-dir", str(data_dir / "retriever"),
                            "--port", str(ports["retriever"])], retriever_env, logs / "retriever.log"),
    ]
    if mlflow_port:
        from t3ar_services.cli.mlflow_server import server_argv

        children.append(Child("mlflow", server_argv(data_dir / "mlflow", mlflow_port), base, logs / "mlflow.log"))
    children.append(Child("api", [PY, "-m", "t3ar_services.cli.serve", "api", "--port", str(ports["api"])], api_env,
                          logs / "api.log"))
    metrics_ports = [free_port() for _ in range(workers)]  # each worker serves its Prometheus /metrics
    children += [Child(f"worker-{i + 1}", [PY, "-m", "t3ar_services.worker"],
                       {**worker_env, "T3AR_WORKER_METRICS_PORT": str(port)}, logs / f"worker-{i + 1}.log",
                       death_signal=signal.SIGKILL)
                 for i, port in enumerate(metrics_ports)]
    info = {"api_url": api_url, "console_url": f"{api_url}/ui", "retriever_url": retriever_url, "redis_url": redis_url,
            "worker_metrics": [f"http://127.0.0.1:{port}/metrics" for port in metrics_ports],
            "data_dir": str(data_dir.resolve()), "auth": not no_auth, "mlflow_url": mlflow_url,
            "tokens": {} if no_auth else {k: tokens[k] for k in ("api_token", "api_admin_token", "api_worker_token",
                                                                 "retriever_token",
                                                                 "retriever_admin_token")}}
    return children, info


@click.command("up")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("data/stack"),
              show_default=True, help="One directory for Redis, the pool, models, jobs, artifacts and logs.")
@click.option("--api-port", default=8700, show_default=True, type=click.IntRange(0, 65535), help="0 = any free port.")
@click.option("--retriever-port", default=8701, show_default=True, type=click.IntRange(0, 65535))
@click.option("--redis-port", default=0, show_default="a free port", type=click.IntRange(0, 65535))
@click.option("--workers", default=1, show_default=True, type=click.IntRange(0, 64))
@click.option("--no-auth", is_flag=True, help="Disable auth on the API and retriever (this machine only).")
@click.option("--ready-timeout", default=300.0, show_default=True, type=float, help="Seconds to wait for health.")
@click.option("--mlflow", "with_mlflow", is_flag=True,
              help="Also start MLflow's tracking server (SQLite backend, local artifact store, under "
                   "<data-dir>/mlflow; port T3AR_MLFLOW_PORT or a free one): the API registers every finished job's "
                   "model there (needs the mlflow extra).")
def up(data_dir: Path, api_port: int, retriever_port: int, redis_port: int, workers: int, no_auth: bool,
       ready_timeout: float, with_mlflow: bool) -> None:
    """Start Redis, the retriever, the API and worker(s) on 127.0.0.1; stop them all with Ctrl-C.

    \b
    Example:
      t3ar up --data-dir data/stack     # prints URLs, tokens and an `export ...` line; in another shell:
      export T3AR_API_URL=... T3AR_API_TOKEN=...; t3ar submit data/target --model runs/source.pt
      t3ar up --mlflow                  # and an MLflow tracking server the finished jobs register in
    """
    keep_private(data_dir)  # before anything is written: Redis' AOF, the logs, every service's files 0600
    lock = open(data_dir / ".lock", "w")  # noqa: SIM115 - held (and released by the OS) for the process' life
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        raise click.ClickException(f"another `t3ar up` is using {data_dir}; stop it or pick another --data-dir") from e
    if (running := earlier_stack(data_dir)) is not None:
        raise click.ClickException(f"{running}: stop it (or wait for it to exit) before starting a stack on "
                                   f"{data_dir}, or pick another --data-dir")
    ports = {"api": api_port or free_port(), "retriever": retriever_port or free_port(),
             "redis": redis_port or free_port()}
    mlflow_port = None
    if with_mlflow:
        from t3ar_services.cli.mlflow_server import MlflowMissingError, mlflow_command

        try:
            mlflow_command()
        except MlflowMissingError as e:
            raise click.ClickException(str(e)) from e
        mlflow_port = int(os.environ.get("T3AR_MLFLOW_PORT") or 0) or free_port()
    children, info = plan(data_dir, ports, workers, no_auth, mlflow_port)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    started: list[Child] = []
    deadline = time.monotonic() + ready_timeout
    try:
        for child in children:
            child.start()
            started.append(child)
            if child.name == "redis":
                wait_redis(info["redis_url"], child, deadline, stop)
            elif child.name == "retriever":
                wait_http(f"{info['retriever_url']}/ready", child, deadline, stop)
            elif child.name == "mlflow":
                wait_http(f"{info['mlflow_url']}/health", child, deadline, stop)
            elif child.name == "api":
                wait_http(f"{info['api_url']}/ready", child, deadline, stop)
        time.sleep(0.5)
        if dead := [c.name for c in started if not c.alive()]:
            raise click.ClickException(f"{', '.join(dead)} exited during start-up; see {data_dir / 'logs'}")
        _announce(data_dir, info, children)
        while not stop.wait(0.5):
            _supervise(data_dir, info, children)
    finally:
        click.echo("stopping the stack...", err=True)
        for child in reversed(started):
            child.stop(15 if child.name.startswith("worker") else 60 if child.name in ("retriever", "mlflow") else 20,
                       second_signal=child.name.startswith("worker"))
        (data_dir / "stack.json").unlink(missing_ok=True)
        click.echo("stopped", err=True)


def _supervise(data_dir: Path, info: dict[str, Any], children: list[Child]) -> None:
    """Restart a dead worker (at most 5 times a minute); any other dead part stops the stack."""
    for child in children:
        if child.alive():
            continue
        code = child.proc.returncode if child.proc else "?"
        if not child.name.startswith("worker"):
            raise click.ClickException(f"{child.name} exited (code {code}); stopping the stack. Its log:\n"
                                       f"{child.tail()}")
        child.restarts = [t for t in child.restarts if t > time.monotonic() - 60] + [time.monotonic()]
        if len(child.restarts) > 5:
            raise click.ClickException(f"{child.name} keeps dying; see {child.log_path}")
        click.echo(f"{child.name} exited (code {code}); restarting", err=True)
        child.start()
        _write_stack(data_dir, info, children)


def _write_stack(data_dir: Path, info: dict[str, Any], children: list[Child]) -> None:
    payload = {**info, "exports": _exports(info), "pids": {c.name: c.pid for c in children},
               "processes": {c.name: {"pid": c.pid, "start_time": start_time(c.pid)} for c in children if c.pid},
               "logs": {c.name: str(c.log_path) for c in children}}
    write_private(data_dir / "stack.json", payload)


def _exports(info: dict[str, Any]) -> str:
    t = info["tokens"]
    return (f"export T3AR_API_URL={info['api_url']} T3AR_RETRIEVER_URL={info['retriever_url']}" +
            (f" T3AR_API_TOKEN={t['api_token']} T3AR_API_ADMIN_TOKEN={t['api_admin_token']}"
             f" T3AR_TOKEN={t['retriever_token']}" if t else "") +
            (f" MLFLOW_TRACKING_URI={info['mlflow_url']}" if info.get("mlflow_url") else ""))


def _announce(data_dir: Path, info: dict[str, Any], children: list[Child]) -> None:
    _write_stack(data_dir, info, children)
    t = info["tokens"]
    lines = [f"t3ar stack is up (data dir {info['data_dir']}; logs in {data_dir / 'logs'})",
             f"  console    {info['console_url']}   (open it in a browser; sign in with a token below)",
             f"  api        {info['api_url']}   (docs: {info['api_url']}/docs)",
             f"  retriever  {info['retriever_url']}",
             f"  redis      {redact_url(info['redis_url'])} (password in stack.json)",
             *([f"  mlflow     {info['mlflow_url']}   (MLflow tracking server and model registry: every finished "
                "job registers a version)"] if info.get("mlflow_url") else []),
             f"  workers    {sum(c.name.startswith('worker') for c in children)}"]
    if t:
        lines += [f"  user token       {t['api_token']}   (T3AR_API_TOKEN; console and API: jobs, pool, models)",
                  f"  admin token      {t['api_admin_token']}   (T3AR_API_ADMIN_TOKEN; also withdraws pool items, "
                  "keys, audit)",
                  f"  retriever token  {t['retriever_token']}   (t3ar pool: ingest, search; deletes go through the "
                  "API: t3ar withdraw)"]
    else:
        lines.append("  AUTH DISABLED (--no-auth): anyone on this machine can use and delete")
    lines += ["Use it from another shell (also in stack.json):", "  " + _exports(info), "Press Ctrl-C to stop."]
    click.echo("\n".join(lines))


@click.command("worker")
@click.option("--redis-url", envvar="T3AR_WORKER_REDIS_URL", default="redis://127.0.0.1:6379/0", show_default=True)
@click.option("--retriever-url", envvar="T3AR_WORKER_RETRIEVER_URL", default="http://127.0.0.1:8701",
              show_default=True)
@click.option("--retriever-token", envvar="T3AR_WORKER_RETRIEVER_TOKEN", default=None,
              help="The retriever's read/write token (env T3AR_WORKER_RETRIEVER_TOKEN; prefer the env var).")
@click.option("--api-url", envvar="T3AR_WORKER_API_URL", default="http://127.0.0.1:8700", show_default=True,
              help="The API: the worker downloads a job's inputs from it and uploads the checkpoint to it.")
@click.option("--data-dir", envvar="T3AR_WORKER_DATA_DIR", type=click.Path(file_okay=False, path_type=Path),
              default=Path("data/worker"), show_default=True,
              help="This worker's own directory (caches, scratch); nothing is shared with the API.")
@click.option("--queue", envvar="T3AR_WORKER_QUEUE", default="t3ar-adapt", show_default=True)
@click.option("--device", envvar="T3AR_WORKER_DEVICE", default="auto", show_default=True,
              help="auto (CUDA when present), cpu, cuda or cuda:N.")
@click.option("--name", envvar="T3AR_WORKER_NAME", default=None, help="Worker name (default <host>.<pid>).")
@click.option("--burst", is_flag=True, help="Exit when the queue is empty.")
def worker(redis_url: str, retriever_url: str, retriever_token: str | None, api_url: str, data_dir: Path, queue: str,
           device: str, name: str | None, burst: bool) -> None:
    """Run an adaptation worker: takes jobs from Redis, fetches their inputs from the API, talks to the
    retriever, uploads checkpoints to the API.

    Runs `python -m t3ar_services.worker` in place of this process so the worker parent never imports torch
    (forking after torch can deadlock). The API's worker token comes from T3AR_WORKER_API_TOKEN (env only);
    other settings: T3AR_WORKER_* (services/worker/README.md).

    \b
    Example (a second machine: no shared storage, only URLs and tokens):
      T3AR_WORKER_API_TOKEN=... T3AR_WORKER_RETRIEVER_TOKEN=... t3ar worker \\
          --redis-url redis://:PASSWORD@queue:6379/0 --api-url http://api:8700 --retriever-url http://pool:8701
    """
    env = dict(os.environ, T3AR_WORKER_REDIS_URL=redis_url, T3AR_WORKER_RETRIEVER_URL=retriever_url,
               T3AR_WORKER_API_URL=api_url, T3AR_WORKER_DATA_DIR=str(data_dir), T3AR_WORKER_QUEUE=queue,
               T3AR_WORKER_DEVICE=device)
    if retriever_token:
        env["T3AR_WORKER_RETRIEVER_TOKEN"] = retriever_token
    if name:
        env["T3AR_WORKER_NAME"] = name
    argv = [PY, "-m", "t3ar_services.worker"] + (["--burst"] if burst else [])
    sys.stdout.flush()
    os.execve(PY, argv, env)
