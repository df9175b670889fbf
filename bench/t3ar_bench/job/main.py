"""The job-overhead benchmark's runs: one embedded stack (``t3ar up`` as a subprocess; the library never imports
the services), the pool ingested once, then per round the same job three ways: through the stack (``POST /adapt``
-> finished -> checkpoint downloaded), in a fresh process and in this process (:mod:`t3ar_bench.job.arm`: the same
checkpoint, target, config and seed, neighbours from the same retriever, checkpoint saved), the order reversed
every other round.

The in-process arms use the stack's retriever rather than ``t3ar adapt --pool``'s in-memory faiss pool so all arms
retrieve the same neighbours (the stack's pool was embedded at ingest; re-embedding the pool at every run would
charge the in-process arms for work the stack does once) and make bit-identical weights
(tests/e2e/test_stack_job_pinned.py).
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from t3ar.stack_process import running_up
from t3ar_bench.job.report import Round, summarise, write

log = logging.getLogger(__name__)


class Runner(Protocol):
    """Runs one arm of a round; :class:`StackRunner` for real, a fake in unit tests."""

    def stack(self) -> tuple[float, dict[str, Any]]: ...  # (wall seconds, the job's report)

    def fresh(self) -> dict[str, Any]: ...  # arm.main's answer: wall_s, phases, imports_s

    def in_process(self) -> dict[str, Any]: ...  # arm.adapt_once's answer: wall_s, phases


def run_rounds(runner: Runner, rounds: int, job: dict[str, Any], out_dir: Path,
               on_round: Callable[[Round], None] | None = None) -> dict[str, Any]:
    """``rounds`` rounds of the three arms, the order reversed every other round; writes the report after each
    round (so an interrupted run keeps the rounds it finished) and returns the last summary."""
    if rounds < 1:
        raise ValueError("no rounds measured: rounds must be >= 1")
    done: list[Round] = []
    summary: dict[str, Any] = {}
    for i in range(rounds):
        if i % 2 == 0:
            stack_wall, report = runner.stack()
            fresh = runner.fresh()
            warm = runner.in_process()
        else:
            warm = runner.in_process()
            fresh = runner.fresh()
            stack_wall, report = runner.stack()
        r = Round(stack_wall, float(fresh["wall_s"]), dict(report.get("phases") or {}),
                  float(report.get("seconds_total") or 0.0), warm_wall=float(warm["wall_s"]),
                  fresh_phases=dict(fresh.get("phases") or {}), warm_phases=dict(warm.get("phases") or {}),
                  fresh_imports=float(fresh.get("imports_s") or 0.0))
        done.append(r)
        if on_round is not None:
            on_round(r)
        # written after every round: an interrupted run keeps what it measured (the report names its rounds)
        summary = summarise(done, {**job, "rounds_planned": rounds})
        write(out_dir, summary)
    return summary


@contextmanager
def embedded_stack(data_dir: Path, threads: int, start_timeout: float = 600) -> Iterator[dict[str, Any]]:
    """``t3ar up`` (one worker on ``threads`` torch threads, CPU) in ``data_dir/stack``, its log in
    ``data_dir/up.log``; yields its stack.json. Raises :class:`t3ar.stack_process.StackStartError` on a failed
    start."""
    env = dict(os.environ, T3AR_WORKER_TORCH_THREADS=str(threads), T3AR_WORKER_DEVICE="cpu")
    with running_up(data_dir / "stack", env, data_dir / "up.log", start_timeout=start_timeout) as (_, info):
        yield info


class StackRunner:
    """The real arms: a running stack (``info``: its stack.json) with the pool ingested and the model uploaded."""

    def __init__(self, info: dict[str, Any], model: Path, target: Path, config: dict[str, Any], threads: int,
                 work: Path) -> None:
        from t3ar.clients.api import ApiClient

        self.info, self.model, self.target, self.config, self.threads, self.work = (
            info, model, target, config, threads, work)
        self.api = ApiClient(info["api_url"], info["tokens"]["api_token"])
        self.model_id = self.api.upload_model(model, "bench-job").id

    def stack(self) -> tuple[float, dict[str, Any]]:
        t = time.perf_counter()
        accepted = self.api.adapt(self.target, self.model_id, self.config)
        job = self.api.wait(accepted.id, poll=0.2, timeout=3600)
        if job.status != "finished":
            raise RuntimeError(f"the stack's job ended {job.status}: {job.error}")
        self.api.download_checkpoint(accepted.id, self.work / "stack.pt")
        wall = time.perf_counter() - t
        return wall, self.api.report(accepted.id).model_dump(mode="json", exclude_unset=True)

    def _spec(self, out: str) -> dict[str, Any]:
        return {"retriever_url": self.info["retriever_url"], "retriever_token": self.info["tokens"]["retriever_token"],
                "model": str(self.model), "target": str(self.target), "config": self.config,
                "threads": self.threads, "out": str(self.work / out)}

    def fresh(self) -> dict[str, Any]:
        spec_file = self.work / "fresh-spec.json"
        spec_file.write_text(json.dumps(self._spec("fresh.pt")))
        env = dict(os.environ, OMP_NUM_THREADS=str(self.threads), MKL_NUM_THREADS=str(self.threads))
        out = subprocess.run([sys.executable, "-m", "t3ar_bench.job.arm", str(spec_file)], env=env, check=True,
                             capture_output=True, text=True)
        answer: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        return answer

    def in_process(self) -> dict[str, Any]:
        from t3ar_bench.job.arm import adapt_once

        return adapt_once(self._spec("in-process.pt"))


def ingest(info: dict[str, Any], pool: Path, source: str) -> None:
    """``t3ar pool ingest`` as the demo runs it (one request in flight: the same images kept every run)."""
    env = dict(os.environ)
    for assignment in shlex.split(info["exports"])[1:]:
        key, _, value = assignment.partition("=")
        env[key] = value
    subprocess.run([sys.executable, "-m", "t3ar.cli.main", "pool", "ingest", str(pool), "--source", source,
                    "--in-flight", "1"], env=env, check=True)


def run_job_benchmark(model: Path, target: Path, pool: Path, config: dict[str, Any], out_dir: Path, *,
                      rounds: int = 3, threads: int = 1, source: str = "openclipart") -> dict[str, Any]:
    """Start a stack, ingest ``pool``, run ``rounds`` side-by-side rounds, write job-overhead.{md,json}."""
    with tempfile.TemporaryDirectory(prefix="t3ar-bench-job-") as tmp:
        work = Path(tmp)
        with embedded_stack(work, threads) as info:
            ingest(info, pool, source)
            runner = StackRunner(info, model, target, config, threads, work)
            job = {"model": model.name, "target": str(target), "pool": str(pool), "config": config,
                   "threads": threads}
            return run_rounds(runner, rounds, job, out_dir,
                              on_round=lambda r: log.info("round: stack %.1fs, fresh process %.1fs (ratio %.2f), "
                                                          "this process %.1fs (ratio %.2f)", r.stack_wall,
                                                          r.in_process_wall, r.stack_wall / r.in_process_wall,
                                                          r.warm_wall, r.stack_wall / r.warm_wall))
