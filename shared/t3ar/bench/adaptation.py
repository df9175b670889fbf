"""``t3ar bench adapt``: does retrieval help adaptation when target data is scarce? (issue 5)

The click command only; the benchmark lives in :mod:`t3ar.bench.adaptation_main` (imported when the command
runs, so that ``t3ar --help`` stays fast). Writes ``adaptation.md``, ``adaptation.json`` (every run) and PNG
plots.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import click


def _default_cache() -> str:
    return os.environ.get("T3AR_CACHE_DIR") or str(Path(".cache") / "t3ar")


@click.command("adapt")
@click.option("--quick", is_flag=True,
              help="Smoke run (~3 min): 1 shift, 1 seed, small caps. Writes adaptation-quick.*")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the report, JSON and plots go [default: docs/benchmarks; with --quick: WORK_DIR/quick].")
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=Path(".cache/bench-adapt"),
              show_default=True, help="Data kits, source models, embeddings and per-run results (reused).")
@click.option("--cache", type=click.Path(file_okay=False, path_type=Path), default=_default_cache,
              show_default="$T3AR_CACHE_DIR or .cache/t3ar", help="Downloaded npm/Debian packages (reused).")
@click.option("--device", default="auto", show_default=True, help="auto (CUDA when present), cpu, cuda[:N].")
@click.option("--clip-weights", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="open_clip checkpoint file: adds a CLIP retriever to the retriever ablation.")
@click.option("--clip-model", default="ViT-B-32", show_default=True, help="open_clip model of --clip-weights.")
@click.option("--fresh", is_flag=True, help="Re-run every adaptation instead of reusing cached results.")
def adapt_bench(quick: bool, out_dir: Path | None, work_dir: Path, cache: Path, device: str, clip_weights: Path | None,
                clip_model: str, fresh: bool) -> None:
    """Adaptation benchmark: source / TENT / SHOT-IM / AdaContrast / T3AR-random / T3AR on 4 emoji style shifts,
    at 1 %, 10 % and 100 % of the target, 3 seeds; ablations, retrieval diagnostics, speed ratios, plots.

    \b
    The full run takes about 45 minutes on 2 unshared CPU cores from a fresh clone (less with warm caches
    under --work-dir: source models, embeddings and finished runs are reused); --quick about 3.
    Example:
      t3ar bench adapt --quick
    """
    from t3ar.bench.adaptation_main import run_adaptation_benchmark
    from t3ar.bench.adaptation_protocol import FULL, QUICK
    from t3ar.device import resolve_device
    from t3ar.errors import T3arError

    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)-7s %(name)s: %(message)s")
    plan = QUICK if quick else FULL
    out_dir = out_dir or (work_dir / "quick" if quick else Path("docs/benchmarks"))
    try:
        res = run_adaptation_benchmark(plan, out_dir=out_dir, work=work_dir, cache=cache,
                                       device=resolve_device(device), clip_weights=clip_weights,
                                       clip_model=clip_model, fresh=fresh)
    except T3arError as exc:
        raise click.ClickException(str(exc)) from exc
    stem = "adaptation-quick" if quick else "adaptation"
    click.echo(json.dumps({"verdict": res["verdict"], "minutes": round(res["timings"]["total"] / 60, 1)}, indent=2))
    click.echo(f"wrote {out_dir / (stem + '.md')} and {out_dir / (stem + '.json')}")
