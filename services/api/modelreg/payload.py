"""What a finished job registers, from what the API stored of it: params, metrics, tags and the lineage document
(:func:`build`). Pure: no MLflow, no files, no network; the registrar reads the inputs and passes the results on.

- params: the method and its config (nested groups as dotted keys), the job id, the base model's id and sha256,
  the target's digest, fraction, seed, mode and the winner rule;
- metrics: each acceptance candidate's top-1 and CI bounds and paired differences, accuracy before and after (a
  target with labels), steps, and seconds per phase;
- tags (the run's and the version's): ``t3ar.job_id``, ``t3ar.base_model``, ``t3ar.winner``, ``t3ar.pool_items``
  (count and digest of the sorted ids), ``t3ar.team``, and ``t3ar.parent_job`` for a re-run.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from typing import Any

PARAM_MAX = 6000  # MLflow's longest param value
_KEY = re.compile(r"[^A-Za-z0-9_\-. /]")


@dataclass(frozen=True)
class Payload:
    params: dict[str, str]
    metrics: dict[str, float]
    tags: dict[str, str]
    lineage: dict[str, Any]


def _key(text: str) -> str:
    return _KEY.sub("_", text)


def flatten(prefix: str, value: Any, out: dict[str, str]) -> None:
    """Nested dicts as dotted keys; lists and scalars as their text (cut at MLflow's limit)."""
    if isinstance(value, dict):
        for k, v in value.items():
            flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
        return
    text = "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    out[_key(prefix)] = text[:PARAM_MAX]


def pool_digest(pool_ids: list[str]) -> str:
    """sha256 of the sorted, newline-joined pool ids: equal for two jobs that used the same items."""
    return hashlib.sha256("\n".join(sorted(pool_ids)).encode()).hexdigest()


def _finite(out: dict[str, float], key: str, value: Any) -> None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(float(value)):
        out[_key(key)] = float(value)


def build(report: dict[str, Any], lineage: dict[str, Any], *, job_id: str, base_model_id: str,
          base_model_name: str, base_model_sha256: str, team: str | None,
          items: dict[str, dict[str, Any]] | None = None) -> Payload:
    """The payload of one finished job: its stored ``report`` (JobReport JSON) and ``lineage`` (lineage.json), the
    base model's record, the job's team and the pool items' records (``id -> {source, label}``, as far as looked
    up; an id missing there is listed with its id only)."""
    config = dict(report.get("config") or {})
    acceptance = report.get("acceptance") or None
    pool_ids = [str(p) for p in lineage.get("pool_ids") or []]
    params: dict[str, str] = {}
    flatten("config", config, params)
    params.update({
        "method": str(report.get("method") or config.get("method") or ""),
        "job_id": job_id, "base_model_id": base_model_id, "base_model_sha256": base_model_sha256,
        "target_sha256": str(lineage.get("target_sha256") or ""),
        "target_size": str(lineage.get("target_size") or report.get("target_size") or ""),
        "fraction": str(config.get("fraction", "")), "seed": str(config.get("seed", "")),
        "mode": str(report.get("mode") or config.get("mode") or ""),
        "winner_rule": str(acceptance.get("rule")) if acceptance else "none",
        "retriever": str(report.get("retriever") or lineage.get("retriever") or ""),
    })
    metrics: dict[str, float] = {}
    for cand in (acceptance or {}).get("candidates") or []:
        name = f"acceptance.{cand.get('name')}"
        _finite(metrics, f"{name}.top1", cand.get("top1"))
        ci = cand.get("ci") or []
        if len(ci) == 2:
            _finite(metrics, f"{name}.ci_lo", ci[0])
            _finite(metrics, f"{name}.ci_hi", ci[1])
        for versus in ("vs_source", "vs_bn_adapt"):
            diff = cand.get(versus) or {}
            for part in ("points", "lo", "hi"):
                _finite(metrics, f"{name}.{versus}.{part}", diff.get(part))
    accuracy = report.get("accuracy") or {}
    for when in ("before", "after"):
        _finite(metrics, f"accuracy.{when}.top1", (accuracy.get(when) or {}).get("top1"))
    m = report.get("metrics") or {}
    _finite(metrics, "steps", m.get("steps"))
    _finite(metrics, "seconds_adapt", m.get("seconds_adapt"))
    _finite(metrics, "seconds_total", report.get("seconds_total"))
    for phase, seconds in (report.get("phases") or {}).items():
        _finite(metrics, f"phase.{phase}.seconds", seconds)
    winner = str(acceptance.get("winner")) if acceptance else str(report.get("method") or "")
    tags = {"t3ar.job_id": job_id, "t3ar.base_model": f"{base_model_name} ({base_model_id})",
            "t3ar.winner": winner, "t3ar.pool_items": f"{len(pool_ids)} sha256:{pool_digest(pool_ids)}",
            "t3ar.team": team or ""}
    if report.get("parent_id"):
        tags["t3ar.parent_job"] = str(report["parent_id"])
    known = items or {}
    doc = {"job_id": job_id, "base_model_id": base_model_id, "base_model_sha256": base_model_sha256,
           "checkpoint_sha256": lineage.get("checkpoint_sha256"), "target_sha256": lineage.get("target_sha256"),
           "retriever": lineage.get("retriever"), "created_at": lineage.get("created_at"),
           "pool_items_digest": pool_digest(pool_ids),
           "pool_items": [{"id": p, **({k: known[p].get(k) for k in ("source", "label")} if p in known else {})}
                          for p in pool_ids]}
    return Payload(params, metrics, tags, doc)
