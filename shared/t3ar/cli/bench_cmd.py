"""``t3ar bench``: benchmarks that measure and write results files (never timed tests)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import click

from t3ar.bench.adaptation import adapt_bench


@click.group("bench")
def bench() -> None:
    """Run a benchmark and write its results under docs/benchmarks/."""


@bench.command("retrieval")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("docs/benchmarks"), show_default=True, help="Where retrieval.md/.json are written.")
@click.option("--quick", is_flag=True, help="Small sizes (20k/100k vectors instead of 100k/1M): a smoke run.")
def retrieval(out_dir: Path, quick: bool) -> None:
    """Retriever service vs in-process baselines: search QPS and latency, ingest rate, 1M-vector deletes/memory.

    The full run takes 5-10 minutes and needs ~3 GB of RAM and ~6 GB of temporary disk.
    """
    from t3ar.bench.retrieval import run_retrieval_benchmark

    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)-7s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    results = run_retrieval_benchmark(out_dir, quick=quick)
    click.echo(json.dumps({"search_qps_ratio": round(results["search"]["qps_ratio"], 3),
                           "ingest_ratio": round(results["ingest"]["ratio"], 3),
                           "delete_p99_ms": round(results["large"]["delete"]["p99_ms"], 1),
                           "rss_ratio": round(results["large"]["rss_ratio"], 3)}, indent=2))
    click.echo(f"wrote {out_dir / 'retrieval.md'} and {out_dir / 'retrieval.json'}")


bench.add_command(adapt_bench, "adapt")
