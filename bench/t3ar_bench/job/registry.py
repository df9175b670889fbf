"""What MLflow registration adds to a job (issue 51): two embedded stacks side by side, one plain (``t3ar up``) and
one with MLflow's tracking server (``t3ar up --mlflow``, every finished job registered), the same pool ingested in
both, then per round the same job on each (the order reversed every other round): ``POST /adapt`` -> finished ->
checkpoint downloaded, timed as the job benchmark times its stack arm. Registration runs after a job finished, in
the API's background: its own seconds (finished -> version registered) are measured apart, and the next job starts
only once it is done, so it never overlaps a timed job. Writes ``job-registry.md`` and ``job-registry.json``."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from t3ar.stack_process import running_up, up_argv
from t3ar_bench.job.main import ingest

log = logging.getLogger(__name__)


def _job(api: Any, model_id: str, target: Path, config: dict[str, Any], work: Path) -> tuple[float, str]:
    t = time.perf_counter()
    accepted = api.adapt(target, model_id, config)
    job = api.wait(accepted.id, poll=0.2, timeout=3600)
    if job.status != "finished":
        raise RuntimeError(f"the job ended {job.status}: {job.error}")
    api.download_checkpoint(accepted.id, work / "job.pt")
    return time.perf_counter() - t, accepted.id


def _registered(api: Any, job_id: str, timeout: float = 1800) -> tuple[float, Any]:
    t = time.perf_counter()
    deadline = t + timeout
    while time.perf_counter() < deadline:
        reg = api.job(job_id).registration
        if reg is not None and reg.state == "done":
            return time.perf_counter() - t, reg
        if reg is None or reg.state in ("failed", "skipped"):
            raise RuntimeError(f"job {job_id}'s registration: {reg}")
        time.sleep(0.5)
    raise RuntimeError(f"job {job_id} not registered within {timeout:g} s")


def run_registry_benchmark(model: Path, target: Path, pool: Path, config: dict[str, Any], out_dir: Path, *,
                           rounds: int = 3, threads: int = 1, source: str = "openclipart") -> dict[str, Any]:
    from t3ar.clients.api import ApiClient

    env = dict(os.environ, T3AR_WORKER_TORCH_THREADS=str(threads), T3AR_WORKER_DEVICE="cpu")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="t3ar-bench-registry-") as tmp:
        work = Path(tmp)
        with running_up(work / "off", env, work / "off.log", start_timeout=600) as (_, off), \
                running_up(work / "on", env, work / "on.log", start_timeout=600,
                           argv=[*up_argv(work / "on"), "--mlflow"]) as (_, on):
            apis = {}
            for name, info in (("off", off), ("on", on)):
                ingest(info, pool, source)
                api = ApiClient(info["api_url"], info["tokens"]["api_token"])
                apis[name] = (api, api.upload_model(model, "bench-registry").id)
            for i in range(rounds):
                row: dict[str, Any] = {"round": i + 1}
                for arm in (("off", "on") if i % 2 == 0 else ("on", "off")):
                    api, model_id = apis[arm]
                    row[f"{arm}_s"], job_id = _job(api, model_id, target, config, work)
                    if arm == "on":
                        row["registration_s"], reg = _registered(api, job_id)
                        row["version"] = reg.model_uri
                rows.append(row)
                log.info("round %d: off %.1f s, on %.1f s (+%.1f %%), registration %.1f s after the job (%s)",
                         i + 1, row["off_s"], row["on_s"], 100 * (row["on_s"] / row["off_s"] - 1),
                         row["registration_s"], row["version"])
                summary = _summary(rows, {"model": model.name, "target": str(target), "pool": str(pool),
                                          "config": config, "threads": threads, "rounds_planned": rounds})
                _write(out_dir, summary)
    return summary


def _summary(rows: list[dict[str, Any]], job: dict[str, Any]) -> dict[str, Any]:
    off = statistics.median(r["off_s"] for r in rows)
    on = statistics.median(r["on_s"] for r in rows)
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {"measured_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "commit": commit,
            "cpus": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()], "job": job,
            "rounds": rows, "off_median_s": round(off, 2), "on_median_s": round(on, 2),
            "overhead_pct": round(100 * (on / off - 1), 2),
            "paired_overhead_pct_median": round(statistics.median(100 * (r["on_s"] / r["off_s"] - 1)
                                                                  for r in rows), 2),
            "registration_median_s": round(statistics.median(r["registration_s"] for r in rows), 2)}


#: the goal: registration adds at most this much to a job's wall time, in percent
GOAL_PCT = 2.0


def _verdict(s: dict[str, Any]) -> str:
    """Whether the rounds can tell the goal at all: when their paired overheads spread over more than the goal's
    width on both sides, the difference is noise, and the line says so instead of a pass or a fail."""
    pcts = [100 * (r["on_s"] / r["off_s"] - 1) for r in s["rounds"]]
    lo, hi = min(pcts), max(pcts)
    if hi - lo > 2 * GOAL_PCT:
        return (f"Within noise: the rounds' paired overheads run from {lo:+.1f} % to {hi:+.1f} %, wider than the "
                f"goal's +-{GOAL_PCT:.0f} %: these rounds can neither meet nor miss it (a quiet machine and more "
                "rounds can).")
    met = s["paired_overhead_pct_median"] <= GOAL_PCT
    return f"Goal {'met' if met else 'not met'}: every round within {lo:+.1f} % to {hi:+.1f} %."


def _write(out_dir: Path, s: dict[str, Any]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "job-registry.json").write_text(json.dumps(s, indent=2) + "\n")
    lines = ["# MLflow registration: a job with the registry on vs off", "",
             f"Measured {s['measured_at']} at commit `{s['commit']}` on {s['cpus']} CPU core(s), load average at the "
             f"end {s['load_average']} (a shared machine). {len(s['rounds'])} round(s), the two stacks side by side. "
             "Written by `t3ar bench job --registry`.", "",
             f"**a job's wall time with registration on: {s['on_median_s']} s against {s['off_median_s']} s off "
             f"(median; {s['overhead_pct']:+.2f} %, the rounds' paired median {s['paired_overhead_pct_median']:+.2f} "
             "%)** (goal: at most +2 %)", "", _verdict(s), "",
             f"- the job: {s['job']['model']} on {s['job']['target']}, pool {s['job']['pool']}, config "
             f"`{json.dumps(s['job']['config'])}`, {s['job']['threads']} torch thread(s)",
             "- timed per arm: `POST /adapt` -> finished -> checkpoint downloaded; the `on` stack is "
             "`t3ar up --mlflow` (MLflow's tracking server beside it, every finished job registered)",
             f"- registration itself runs after the job finished, in the API's background: median "
             f"{s['registration_median_s']} s from the job's end to its version (the ONNX export, parity check and "
             "upload); the next job starts after it, so no timed job overlaps one", "",
             "| round | off s | on s | on/off | registration s | version |", "|---:|---:|---:|---:|---:|---|"]
    lines += [f"| {r['round']} | {r['off_s']:.1f} | {r['on_s']:.1f} | {r['on_s'] / r['off_s']:.3f} | "
              f"{r['registration_s']:.1f} | `{r['version']}` |" for r in s["rounds"]]
    (out_dir / "job-registry.md").write_text("\n".join(lines) + "\n")
