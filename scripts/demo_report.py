"""The demo's helpers (scripts/demo.sh): which labelled styles its pool takes, which retrieval ranking its job uses,
and what it prints at the end.

    python scripts/demo_report.py pool-styles TARGET SOURCE   # the kit's styles outside both artwork families
    python scripts/demo_report.py ranking [--benchmark FILE]  # T3AR_DEMO_RANKING, else the benchmark's choice
    python scripts/demo_report.py report DEMO_DIR START DEVICE [--benchmark FILE]

The report prints the job's figures (acceptance table, accuracy before -> after, pool items used, neighbour
quality) and, beside them, the mixed-pool benchmark's aggregate (docs/benchmarks/mixed-pool.json) so that no reader
takes the demo's one shift for the whole; a line says so when that file does not exist yet.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, get_args

REPO = Path(__file__).resolve().parents[1]
BENCHMARK = REPO / "docs" / "benchmarks" / "mixed-pool.json"
#: the benchmark's goals the demo prints beside its own figures: (goal key, what it compares)
GOALS: tuple[tuple[str, str], ...] = (
    ("labelled_vs_bn_adapt", "T3AR with the pool's labels - bn-adapt"),
    ("accepted_vs_bn_adapt_labelled", "the holdout's winner (source, bn-adapt, T3AR with labels) - bn-adapt"),
    ("mixed_labelled_vs_uniform", "T3AR with labels - uniform random draws, their labelled items as data"),
)


def rankings() -> tuple[str, ...]:
    """The retrieval rankings a job may ask for (``retrieval.ranking``)."""
    from t3ar.method.config import RetrievalOptions

    return tuple(get_args(RetrievalOptions.model_fields["ranking"].annotation))


def pool_styles(target: str, source: str) -> list[str]:
    """The data kit's default styles (the method benchmark's kit) outside the target's and the source's artwork
    families, in kit order: the labelled styles of the demo's pool (the benchmark's rule,
    ``t3ar_bench.method.labelled_pool.pool_names``: a target's or the source's family never enters the pool)."""
    from t3ar.datakit.archive import family_of
    from t3ar.datakit.emoji import DEFAULT_STYLES

    gone = {family_of(target), family_of(source)}
    return [s for s in DEFAULT_STYLES if family_of(s) not in gone]


def load_benchmark(path: Path) -> dict[str, Any] | None:
    """The mixed-pool benchmark's report, or None when it does not exist (not run yet)."""
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object")
    return data


def choose_ranking(env: str | None, benchmark: Mapping[str, Any] | None) -> tuple[str, str]:
    """The job's ranking and where it came from: ``env`` (T3AR_DEMO_RANKING) when set, else the benchmark's
    validation choice (``choice.ranking``), else ``index``. ValueError for a ranking no job takes."""
    known = rankings()
    if env:
        value, why = env, "T3AR_DEMO_RANKING"
    elif benchmark is not None and isinstance(benchmark.get("choice"), Mapping) and benchmark["choice"].get("ranking"):
        value, why = str(benchmark["choice"]["ranking"]), "the mixed-pool benchmark's validation choice"
    else:
        value, why = "index", "the default: no mixed-pool benchmark to choose"
    if value not in known:
        raise ValueError(f"ranking {value!r} (from {why}) is not one of {', '.join(known)}")
    return value, why


def _pts(x: Any) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{float(x):+.1f}"


def _fraction(f: str) -> str:
    try:
        return f"{100 * float(f):g} %"
    except ValueError:
        return f


def benchmark_lines(bench: Mapping[str, Any] | None, *, shift: str, ranking: str, fraction: float,
                    path: str = "docs/benchmarks/mixed-pool.json") -> list[str]:
    """The benchmark's aggregate beside the demo: per goal and fraction, ``mean [lo, hi]`` points over ``n`` cells
    (evaluation shifts x seeds), and ``shift``'s own mean where the benchmark has it; then the line that one shift
    is not the whole. Without the benchmark: a line saying it has not been run."""
    one = (f"one shift is not the whole: this demo is one shift ({shift}), one seed, one fraction "
           f"({100 * fraction:g} %) on a small pool")
    if bench is None:
        return [f"the mixed-pool benchmark has not been run ({path} does not exist): nothing here says how "
                "T3AR with labels fares beyond this one shift", one + "; the benchmark's shifts x seeds say more"]
    choice = bench.get("choice") or {}
    shifts = bench.get("evaluation_shifts") or []
    seeds = bench.get("seeds") or []
    lines = [f"the mixed-pool benchmark ({path}): labelled arm {choice.get('labelled', '?')} (ranking "
             f"{choice.get('ranking', '?')}, chosen on {bench.get('validation_shift', '?')}), evaluation shifts "
             f"{', '.join(map(str, shifts)) or '?'} x seeds {', '.join(map(str, seeds)) or '?'}; points, mean "
             "[95 % CI] over n cells (shift x seed)"]
    if choice.get("ranking") and choice["ranking"] != ranking:
        lines.append(f"  (this job ranked by {ranking}; the benchmark's labelled arm by {choice['ranking']})")
    pools = bench.get("pools") or {}
    shares = [float(p["relevant_share"]) for p in pools.values() if isinstance(p, Mapping) and "relevant_share" in p]
    totals = [int(p["total"]) for p in pools.values() if isinstance(p, Mapping) and "total" in p]
    if shares and totals:
        lines.append(f"  its pools: {min(totals):,}-{max(totals):,} images, {100 * min(shares):.1f}-"
                     f"{100 * max(shares):.1f} % of them relevant (labelled emoji), the rest icons and clipart")
    goals = bench.get("goals") or {}
    width = max(len(words) for _, words in GOALS)
    for key, words in GOALS:
        goal = goals.get(key)
        cells = goal.get("test", goal) if isinstance(goal, Mapping) else None
        if not cells:
            lines.append(f"  {words:<{width}}  not in the file")
            continue
        parts = []
        for f, c in cells.items():
            if not isinstance(c, Mapping) or "mean" not in c:
                continue
            own = (c.get("per_shift") or {}).get(shift)
            parts.append(f"{_fraction(f)}: {_pts(c['mean'])} [{_pts(c.get('lo'))}, {_pts(c.get('hi'))}] "
                         f"n={c.get('n', '?')}" + (f" ({shift} alone {_pts(own)})" if own is not None else ""))
        lines.append(f"  {words:<{width}}  " + ("; ".join(parts) or "no cell"))
    n = max((int(c.get("n", 0)) for g in goals.values() if isinstance(g, Mapping)
             for c in (g.get("test", g) or {}).values() if isinstance(c, Mapping)), default=0)
    lines.append(one + (f"; the benchmark's {n} cells per fraction are the method's figures" if n else ""))
    return lines


def _quality_lines(quality: Mapping[str, Any] | None) -> list[str]:
    from t3ar.clients.job_report import NeighbourQualityRecord, quality_lines

    if quality is None:
        return ["neighbour quality: none reported (the returned model drew no pool neighbours)"]
    return quality_lines(NeighbourQualityRecord.model_validate(quality))


def _pool_line(d: Path) -> str | None:
    """The pool the demo ingested (its ``ingest-<order>-<source>.json`` summaries, in ingest order)."""
    parts, total, labelled = [], 0, 0
    for f in sorted(d.glob("ingest-*.json")):  # ingest-<order>-<source>.json
        s = json.loads(f.read_text())
        source = f.stem.split("-", 2)[-1]
        total += s["added"]
        labelled += s["added"] if s.get("labelled") else 0  # a style's class folders label every image
        parts.append(f"{source} {s['added']}{' labelled' if s.get('labelled') else ''}")
    if not parts:
        return None
    return f"pool: {total} items, {labelled} of them labelled ({', '.join(parts)}; exact and near-duplicates skipped)"


def report(d: Path, start: float, device: str, bench: Mapping[str, Any] | None, *, ranking: str, shift: str,
           fraction: float, bench_path: str) -> list[str]:
    """Everything the demo prints after its job: the job's figures, then the benchmark's aggregate beside them."""
    from t3ar.clients.job_report import AcceptanceRecord, acceptance_table, candidate_pool_lines
    from t3ar.job_words import noise_words

    job, before, after = (json.loads((d / f).read_text()) for f in ("job.json", "before.json", "after.json"))
    src = json.loads((d / "source.json").read_text())
    libs, rt = src["libraries"], src["runtime"]
    clipart = json.loads((d / "pool" / "manifest.json").read_text())["report"]["sources"]["openclipart"]
    res = job.get("result") or {}
    labelled = res.get("labelled_neighbours_total") or 0
    acc = job.get("acceptance") or res.get("acceptance")
    returned = f"the returned model ({acc['winner']})" if acc else "the adapted model"
    out = [f"job {job['id']} (T3AR with the pool's labels, ranking {ranking}): {job['status']} on "
           f"{job['target']['images']} target images; {returned}: {res.get('steps')} steps, "
           f"{res.get('pool_ids_used')} pool images used, {labelled} labelled pool items used as labelled data"]
    if (pool := _pool_line(d)) is not None:
        out.append(pool)
    if "accuracy_after" in res and res["accuracy_after"] is not None:
        out.append(f"accuracy on the adapted target subset: {100 * res['accuracy_before']:.1f}% -> "
                   f"{100 * res['accuracy_after']:.1f}%")
    per_candidate: list[str] = []
    if acc:
        record = AcceptanceRecord.model_validate(acc)
        out += acceptance_table(record)
        if (noise := noise_words(record)) is not None:
            out.append(noise)
        per_candidate = candidate_pool_lines(record)  # each candidate's pool use and neighbour quality, a loser's too
    out.append(f"accuracy on all {after['n']} {shift.capitalize()} emoji ({'the winner' if acc else 'adapted'}; the "
               f"holdout's images included):  {100 * before['top1']:.1f}% -> {100 * after['top1']:.1f}%")
    # the job's neighbour quality (result.neighbour_quality: the returned model's), or each candidate's where the
    # acceptance record carries them (the returned model's among them)
    out += per_candidate or _quality_lines(res.get("neighbour_quality"))
    out += benchmark_lines(bench, shift=shift, ranking=ranking, fraction=fraction, path=bench_path)
    out.append(f"these numbers depend on: device {device}, {rt['threads']} torch thread(s), CPU {rt['machine']} "
               f"{rt['cpu_capability']} ({rt.get('cpu', 'model unknown')}), torch {libs['torch']}, timm "
               f"{libs['timm']}, Pillow {libs['pillow']}, numpy {libs['numpy']}, {clipart['package']} "
               f"{clipart['version']}, {_kit_versions(d)}, training inputs {src['digest'][:12]} ({d / 'source.json'})")
    reg_file = d / "registration.json"
    if reg_file.is_file() and reg_file.stat().st_mtime >= start:
        reg = json.loads(reg_file.read_text())
        if reg and reg["state"] == "done":
            out.append(f"MLflow: registered {reg['model_uri']} (alias {reg['alias']}); version {reg['version_url']}")
            out.append(f"  serve it: MLFLOW_TRACKING_URI={reg['run_url'].split('/#/')[0]} mlflow models serve "
                       f"-m 'models:/{reg['name']}@{reg['alias']}' -p 5001 --env-manager local")
        else:
            out.append(f"MLflow: registration {reg and reg['state']}: {reg and reg['error']}")
    out.append(f"checkpoint: {d / 'adapted.pt'}   demo wall time: {time.time() - start:.0f} s")
    return out


def _kit_versions(d: Path) -> str:
    """The npm packages of the labelled pool's styles (the pool kit's manifest), e.g. ``openmoji 17.0.0``."""
    manifest = d / "emoji-pool" / "manifest.json"
    if not manifest.is_file():
        return "no labelled pool kit"
    packages = json.loads(manifest.read_text()).get("report", {}).get("packages", {})
    return ", ".join(f"{name} {version}" for name, version in sorted(packages.items())) or "pool kit versions unknown"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pool-styles")
    p.add_argument("target")
    p.add_argument("source")
    r = sub.add_parser("ranking")
    r.add_argument("--benchmark", type=Path, default=BENCHMARK)
    rep = sub.add_parser("report")
    rep.add_argument("demo_dir", type=Path)
    rep.add_argument("start", type=float)
    rep.add_argument("device")
    rep.add_argument("--benchmark", type=Path, default=BENCHMARK)
    rep.add_argument("--ranking", required=True)
    rep.add_argument("--shift", default="twitter")
    rep.add_argument("--fraction", type=float, required=True)
    args = parser.parse_args(argv)
    if args.cmd == "pool-styles":
        print(",".join(pool_styles(args.target, args.source)))
        return 0
    bench = load_benchmark(args.benchmark)
    if args.cmd == "ranking":
        try:
            value, why = choose_ranking(os.environ.get("T3AR_DEMO_RANKING") or None, bench)
        except ValueError as e:
            print(f"demo: {e}", file=sys.stderr)
            return 2
        print(f"retrieval ranking {value} ({why})", file=sys.stderr)
        print(value)
        return 0
    shown = os.path.relpath(args.benchmark, Path.cwd()) if args.benchmark.is_absolute() else str(args.benchmark)
    print("\n" + "\n".join(report(args.demo_dir, args.start, args.device, bench, ranking=args.ranking,
                                  shift=args.shift, fraction=args.fraction, bench_path=shown)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
