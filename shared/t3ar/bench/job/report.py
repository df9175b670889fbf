"""``job-overhead.md`` / ``job-overhead.json``: the job-overhead benchmark's report.

``ratio``: the median over rounds of (stack wall ÷ in-process wall), both measured in the same round, one after
the other, on the same machine; ``phases``: the median of each phase of the stack's job report over the rounds
(the worker's phase table, see ``t3ar_services.worker.phases``).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from t3ar.bench.speed.report import _commit

GOAL_RATIO = 1.15  # issue 35: a job may cost at most 15 % more than its adaptation


@dataclass(frozen=True)
class Round:
    """One round: the stack's job (submit -> checkpoint downloaded) and the in-process run, in seconds."""

    stack_wall: float
    in_process_wall: float
    phases: dict[str, float] = field(default_factory=dict)  # the stack job's report["phases"]
    worker_total: float = 0.0  # the stack job's report["seconds_total"]


def summarise(rounds: Sequence[Round], job: dict[str, Any]) -> dict[str, Any]:
    """The report's JSON: ratio (median of the per-round ratios), walls and per-phase medians."""
    if not rounds:
        raise ValueError("no rounds measured")
    names: list[str] = []
    for r in rounds:
        names += [n for n in r.phases if n not in names]
    return {
        "ratio": round(statistics.median(r.stack_wall / r.in_process_wall for r in rounds), 3),
        "goal_ratio": GOAL_RATIO,
        "stack_wall_s": round(statistics.median(r.stack_wall for r in rounds), 2),
        "in_process_wall_s": round(statistics.median(r.in_process_wall for r in rounds), 2),
        "worker_total_s": round(statistics.median(r.worker_total for r in rounds), 2),
        "phases": {n: round(statistics.median(r.phases.get(n, 0.0) for r in rounds), 2) for n in names},
        "rounds": [{"stack_wall_s": round(r.stack_wall, 2), "in_process_wall_s": round(r.in_process_wall, 2),
                    "ratio": round(r.stack_wall / r.in_process_wall, 3), "phases": r.phases} for r in rounds],
        "job": job,
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "load_average_at_end": [round(x, 2) for x in os.getloadavg()]},
        "commit": _commit(),
        "measured_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def markdown(summary: dict[str, Any]) -> str:
    m = summary["machine"]
    lines = [
        "# Job overhead: a job through the stack vs the same adaptation in-process",
        "",
        f"Measured {summary['measured_at']} at commit `{summary['commit']}` on {m['cores']} CPU core(s) "
        f"({m['cpu']}), load average at the end {m['load_average_at_end']} (a shared machine). "
        f"{len(summary['rounds'])} round(s), the two arms side by side in each. Written by `t3ar bench job`.",
        "",
        f"**ratio (stack wall ÷ in-process wall, median): {summary['ratio']:.2f}** (goal ≤ {summary['goal_ratio']})",
        "",
        f"- stack: `POST /adapt` → finished → checkpoint downloaded, median {summary['stack_wall_s']:.1f} s "
        f"(worker total {summary['worker_total_s']:.1f} s)",
        f"- in-process: the same checkpoint, target, pool (the stack's retriever) and config through "
        f"`run_adaptation`, checkpoint saved, median {summary['in_process_wall_s']:.1f} s",
        "",
        "## The stack job's phases (median seconds over the rounds)",
        "",
        "| phase | seconds |",
        "|---|---:|",
        *[f"| {name.replace('_', ' ')} | {v:.2f} |" for name, v in summary["phases"].items()],
        "",
        "Queue wait comes before the worker's total; the other phases add up to it (`other`: what no phase names).",
        "",
        "## Rounds",
        "",
        "| round | stack s | in-process s | ratio |",
        "|---:|---:|---:|---:|",
        *[f"| {i + 1} | {r['stack_wall_s']:.1f} | {r['in_process_wall_s']:.1f} | {r['ratio']:.2f} |"
          for i, r in enumerate(summary["rounds"])],
        "",
        f"Job: `{json.dumps(summary['job'], sort_keys=True)}`",
        "",
    ]
    return "\n".join(lines)


def write(out_dir: Path, summary: dict[str, Any]) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    md, js = out_dir / "job-overhead.md", out_dir / "job-overhead.json"
    js.write_text(json.dumps(summary, indent=2) + "\n")
    md.write_text(markdown(summary))
    return md, js
