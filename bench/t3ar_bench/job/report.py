"""``job-overhead.md`` / ``job-overhead.json``: the job-overhead benchmark's report.

``ratio``: the median over rounds of (stack wall ÷ fresh in-process wall), both measured in the same round, one
after the other, on the same machine (the fresh arm: a new process per round, its imports timed apart, see
:mod:`t3ar_bench.job.arm`); ``ratio_warm``: the same against the adaptation in the benchmark's own, warm process;
``phases``: the median of each phase of the stack's job report over the rounds (the worker's phase table, see
``t3ar_services.worker.phases``), ``phases_fresh`` / ``phases_warm`` the in-process arms' under the same names.
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

from t3ar_bench.speed.report import _commit

GOAL_RATIO = 1.15  # a job may cost at most 15 % more than its adaptation


@dataclass(frozen=True)
class Round:
    """One round: the stack's job (submit -> checkpoint downloaded) and the in-process runs, in seconds."""

    stack_wall: float
    in_process_wall: float  # the fresh process's adaptation (imports excluded)
    phases: dict[str, float] = field(default_factory=dict)  # the stack job's report["phases"]
    worker_total: float = 0.0  # the stack job's report["seconds_total"]
    warm_wall: float = 0.0  # the adaptation in the benchmark's own process
    fresh_phases: dict[str, float] = field(default_factory=dict)
    warm_phases: dict[str, float] = field(default_factory=dict)
    fresh_imports: float = 0.0  # the fresh process's imports (torch, the core), not in its wall


def _medians(tables: Sequence[dict[str, float]]) -> dict[str, float]:
    names: list[str] = []
    for t in tables:
        names += [n for n in t if n not in names]
    return {n: round(statistics.median(t.get(n, 0.0) for t in tables), 2) for n in names}


def summarise(rounds: Sequence[Round], job: dict[str, Any]) -> dict[str, Any]:
    """The report's JSON: ratios (medians of the per-round ratios), walls and per-phase medians."""
    if not rounds:
        raise ValueError("no rounds measured")
    warm = [r for r in rounds if r.warm_wall > 0]
    return {
        "ratio": round(statistics.median(r.stack_wall / r.in_process_wall for r in rounds), 3),
        "ratio_warm": round(statistics.median(r.stack_wall / r.warm_wall for r in warm), 3) if warm else None,
        "goal_ratio": GOAL_RATIO,
        "stack_wall_s": round(statistics.median(r.stack_wall for r in rounds), 2),
        "in_process_wall_s": round(statistics.median(r.in_process_wall for r in rounds), 2),
        "warm_wall_s": round(statistics.median(r.warm_wall for r in warm), 2) if warm else None,
        "fresh_imports_s": round(statistics.median(r.fresh_imports for r in rounds), 2),
        "worker_total_s": round(statistics.median(r.worker_total for r in rounds), 2),
        "phases": _medians([r.phases for r in rounds]),
        "phases_fresh": _medians([r.fresh_phases for r in rounds]),
        "phases_warm": _medians([r.warm_phases for r in rounds]),
        "rounds": [{"stack_wall_s": round(r.stack_wall, 2), "in_process_wall_s": round(r.in_process_wall, 2),
                    "warm_wall_s": round(r.warm_wall, 2), "ratio": round(r.stack_wall / r.in_process_wall, 3),
                    "ratio_warm": round(r.stack_wall / r.warm_wall, 3) if r.warm_wall > 0 else None,
                    "fresh_imports_s": round(r.fresh_imports, 2), "phases": r.phases,
                    "phases_fresh": r.fresh_phases, "phases_warm": r.warm_phases} for r in rounds],
        "job": job,
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "load_average_at_end": [round(x, 2) for x in os.getloadavg()]},
        "commit": _commit(),
        "measured_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def _cell(v: float | None) -> str:
    return "" if v is None else f"{v:.2f}"


def markdown(summary: dict[str, Any]) -> str:
    m = summary["machine"]
    fresh, warm = summary.get("phases_fresh") or {}, summary.get("phases_warm") or {}
    warm_ratio = summary.get("ratio_warm")
    lines = [
        "# Job overhead: a job through the stack vs the same adaptation in-process",
        "",
        f"Measured {summary['measured_at']} at commit `{summary['commit']}` on {m['cores']} CPU core(s) "
        f"({m['cpu']}), load average at the end {m['load_average_at_end']} (a shared machine). "
        f"{len(summary['rounds'])} round(s), the three arms side by side in each. Written by `t3ar bench job`.",
        "",
        f"**ratio (stack wall ÷ fresh in-process wall, median): {summary['ratio']:.2f}** "
        f"(goal ≤ {summary['goal_ratio']})"
        + (f"; against the benchmark's own warm process: {warm_ratio:.2f}" if warm_ratio is not None else ""),
        "",
        f"- stack: `POST /adapt` → finished → checkpoint downloaded, median {summary['stack_wall_s']:.1f} s "
        f"(worker total {summary['worker_total_s']:.1f} s)",
        f"- fresh in-process: a new process per round (as `t3ar adapt` is), the same checkpoint, target, pool (the "
        f"stack's retriever) and config through `run_adaptation`, checkpoint saved, median "
        f"{summary['in_process_wall_s']:.1f} s; its imports ({summary.get('fresh_imports_s', 0.0):.1f} s) timed "
        "apart and left out, as the stack's worker imports once before it forks (`T3AR_WORKER_PRELOAD`)",
    ]
    if summary.get("warm_wall_s") is not None:
        lines.append(f"- warm in-process: the same in the benchmark's own process, median "
                     f"{summary['warm_wall_s']:.1f} s; from the second round on this process has run the same shapes "
                     "before (oneDNN's primitive cache, the allocator's retained blocks), which no job's fresh work "
                     "horse has")
    names = list(summary["phases"]) + [n for n in [*fresh, *warm] if n not in summary["phases"]]
    lines += [
        "",
        "## Phases (median seconds over the rounds)",
        "",
        "| phase | stack job | fresh in-process | warm in-process |",
        "|---|---:|---:|---:|",
        *[f"| {n.replace('_', ' ')} | {_cell(summary['phases'].get(n))} | {_cell(fresh.get(n))} | "
          f"{_cell(warm.get(n))} |" for n in names],
        "",
        "The stack job's phases are its report's: queue wait comes before the worker's total, the others add up to "
        "it (`other`: what no phase names). The in-process arms time the same parts under the same names.",
        "",
        "## Rounds",
        "",
        "| round | stack s | fresh in-process s | ratio | warm in-process s | ratio (warm) |",
        "|---:|---:|---:|---:|---:|---:|",
        *[f"| {i + 1} | {r['stack_wall_s']:.1f} | {r['in_process_wall_s']:.1f} | {r['ratio']:.2f} | "
          f"{_cell(r.get('warm_wall_s'))} | {_cell(r.get('ratio_warm'))} |" for i, r in enumerate(summary["rounds"])],
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
