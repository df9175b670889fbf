"""``t3ar bench``: benchmarks that measure and write results files (never timed tests)."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import click

from t3ar.logs import configure_logging
from t3ar_bench.method.command import adapt_bench, default_cache
from t3ar_bench.method.gpu_command import gpu_pack
from t3ar_bench.retrieval.neighbours_cmd import mixed as mixed_bench
from t3ar_bench.retrieval.neighbours_cmd import neighbours as neighbours_bench
from t3ar_bench.retrieval.pool10m_cmd import pool as pool_bench


@click.group("bench")
def bench() -> None:
    """Run a benchmark and write its results under docs/benchmarks/."""


@bench.command("retrieval")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("docs/benchmarks"), show_default=True, help="Where retrieval.md/.json are written.")
@click.option("--quick", is_flag=True, help="Small sizes (20k/100k vectors instead of 100k/1M): a smoke run.")
@click.option("--backends-vectors", type=click.IntRange(1000), default=None,
              help="Vectors in the pool backends section (default 100k, 20k with --quick).")
@click.option("--milvus-uri", default=None, metavar="URI",
              help="A Milvus server (http://HOST:19530) to measure as a third pool backend; it is not started here "
                   "(without it the section says the server was not measured).")
@click.option("--no-milvus-lite", "no_lite", is_flag=True,
              help="Leave milvus-lite out of the backends section (e.g. at 1M vectors: faiss beside the server).")
@click.option("--only", type=click.Choice(["backends"]), default=None,
              help="Run only this section; the last full run's results in OUT stay and this one is added beside "
                   "them, saying when and how it was measured.")
def retrieval(out_dir: Path, quick: bool, backends_vectors: int | None, milvus_uri: str | None,
              no_lite: bool, only: str | None) -> None:
    """Retriever service vs in-process baselines: search QPS and latency, ingest rate, 1M-vector deletes/memory.

    The full run takes 5-25 minutes (5 on a quiet 2-core machine; the ``ann`` section trains IVF indexes at 1M
    vectors) and needs ~5 GB of RAM and ~6 GB of temporary disk. ``--only backends`` takes a few minutes.
    """
    if os.environ.get("OMP_WAIT_POLICY") is None:
        # OpenMP reads its wait policy once, when the runtime loads: the CLI's imports (torch) loaded it already,
        # and with the default (active) policy the in-process faiss baseline burnt ~4x the CPU per batch of the
        # service on this 2-core machine, inflating the QPS ratio. Start again with the policy set.
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        os.execv(sys.executable, [sys.executable, "-m", "t3ar.cli.main", *sys.argv[1:]])
    from t3ar_bench.retrieval.main import run_retrieval_benchmark

    configure_logging("INFO")  # force: the CLI root configured WARNING
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if only == "backends":
        from t3ar_bench.retrieval.main import run_backends_only

        sep = run_backends_only(out_dir, quick=quick, backends_vectors=backends_vectors,
                                milvus_uri=milvus_uri, lite=not no_lite)["backends_separate"]
        click.echo(json.dumps({name: {k: sep[name].get(k) for k in ("vectors", "ingest_vectors_per_s", "qps", "single",
                                                                     "recall_at_k", "delete",
                                                                     "deleted_returned_after_2xx")}
                               for name in ("faiss", "milvus", "milvus_server") if "qps" in sep.get(name, {})},
                              indent=2))
        click.echo(f"wrote {out_dir / 'retrieval.md'} and {out_dir / 'retrieval.json'}")
        return
    results = run_retrieval_benchmark(out_dir, quick=quick, backends_vectors=backends_vectors, milvus_uri=milvus_uri,
                                      lite=not no_lite)
    click.echo(json.dumps({"search_qps_ratio": round(results["search"]["qps_ratio"], 3),
                           "ingest_ratio": round(results["ingest"]["ratio"], 3),
                           "delete_p99_ms": round(results["large"]["delete"]["p99_ms"], 1),
                           "rss_ratio": round(results["large"]["rss_ratio"], 3),
                           "ann_recall_at_50": round(results["ann"]["recall_at_50"], 3),
                           "ann_single_query_p50_ms": round(results["ann"]["single_query_p50_ms"], 1)}, indent=2))
    click.echo(f"wrote {out_dir / 'retrieval.md'} and {out_dir / 'retrieval.json'}")


@bench.command("speed")
@click.option("--device", "device_name", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="cpu, cuda, or auto = every device available here.")
@click.option("--rounds", type=click.IntRange(1, 50), default=3, show_default=True,
              help="Timed rounds (one epoch each).")
@click.option("--images", type=click.IntRange(64, 2000), default=192, show_default=True,
              help="Target images per round (an epoch of images/batch steps).")
@click.option("--batch-size", type=click.IntRange(2, 1024), default=32, show_default=True)
@click.option("--k", type=click.IntRange(1, 20), default=5, show_default=True, help="Retrieved neighbours per image.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("docs/benchmarks"),
              show_default=True, help="Where speed.md/.json/.png are written.")
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=Path(".cache/bench-adapt"),
              show_default=True, help="Data kits and the prepared speed data (reused).")
@click.option("--cache", type=click.Path(file_okay=False, path_type=Path), default=default_cache,
              show_default="$T3AR_CACHE_DIR or .cache/t3ar", help="Downloaded npm/Debian packages (reused).")
@click.option("--data", "data_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="A prepared speed-data file (WORK_DIR/speed/data-*.pt) instead of the data kits.")
@click.option("--no-profile", is_flag=True, help="Skip the torch.profiler table.")
@click.option("--views-inline", is_flag=True, help="The same as --variant views_inline.")
@click.option("--variant", "variants", multiple=True,
              type=click.Choice(["views_ahead", "views_inline", "joint_pass", "separate_passes"]),
              help="Also time the steps a setting concerns with it changed, side by side, stated apart (repeatable): "
                   "views_ahead / views_inline (views made one step ahead / inline), joint_pass / separate_passes "
                   "(the T3AR family's queries forwarded with / apart from its no-gradient pass).")
@click.option("--no-write", is_flag=True, help="Measure only; write no files.")
@click.option("--json", "as_json", is_flag=True, help="Print {devices: {cpu|cuda: {ratios, step_s}}} as JSON.")
def speed(device_name: str, rounds: int, images: int, batch_size: int, k: int, out_dir: Path, work_dir: Path,
          cache: Path, data_file: Path | None, no_profile: bool, views_inline: bool, variants: tuple[str, ...],
          no_write: bool, as_json: bool) -> None:
    """Step speed of T3AR, T3AR without retrieval and AdaContrast relative to a supervised step, side by side.

    \b
    A CPU run takes about 3 minutes on 2 cores (plus building the data kits the first time).
    Example:
      t3ar bench speed --device cpu --json
    """
    import torch

    from t3ar.device import resolve_device
    from t3ar_bench.speed.main import SpeedData, prepare_data, run_speed_benchmark
    from t3ar_bench.speed.report import write_report

    configure_logging("INFO")  # force: the CLI root configured WARNING
    if device_name == "auto":
        devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    else:
        devices = [resolve_device(device_name)]
    data = SpeedData.load(data_file) if data_file else prepare_data(work_dir, cache, n_images=images, k=k,
                                                                     device=devices[-1])
    res = run_speed_benchmark(devices, data, rounds=rounds, batch_size=batch_size, k=k, profile=not no_profile,
                              variants=tuple(dict.fromkeys(variants + (("views_inline",) if views_inline else ()))))
    if not no_write:
        write_report(res, out_dir)
    if as_json:
        click.echo(json.dumps({"devices": {d: {"ratios": v["ratios"], "step_s": v["step_s"],
                                               **{key: v[key] for key in ("approximations", "variants")
                                                  if v.get(key)}}
                                           for d, v in res["devices"].items()}}, indent=2))
    elif not no_write:
        click.echo(f"wrote {out_dir / 'speed.md'} and {out_dir / 'speed.json'}")


@bench.command("compaction")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("docs/benchmarks"),
              show_default=True, help="Where compaction.md/.json are written.")
@click.option("--items", type=click.IntRange(1000), default=1_000_000, show_default=True,
              help="Synthetic pool size (vectors-only retriever, 512-d).")
@click.option("--share", type=click.FloatRange(0, 0.5), default=0.02, show_default=True,
              help="Share of the pool that are planted near-duplicates.")
@click.option("--threshold", type=click.FloatRange(0, 1, min_open=True), default=0.98, show_default=True)
@click.option("--nprobe", type=click.IntRange(1, 1024), default=2, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
def compaction(out_dir: Path, items: int, share: float, threshold: float, nprobe: int, as_json: bool) -> None:
    """Time pool compaction's near-duplicate scan on a large synthetic pool, over HTTP (a few minutes at 1M).

    \b
    Example:
      t3ar bench compaction --items 1000000
    """
    from t3ar_bench.curation.main import run_compaction_benchmark

    res = run_compaction_benchmark(out_dir, items=items, share=share, threshold=threshold, nprobe=nprobe)
    click.echo(json.dumps(res, indent=2) if as_json else
               f"{res['items']:,} items: scan {res['http_seconds']} s over HTTP, recall {res['recall']}, "
               f"{res['false_removals']} false removals; written to {out_dir / 'compaction.md'}")


@bench.command("continual")
@click.option("--plan", "plan_name", type=click.Choice(["smoke", "cpu", "cpu-data"]), default="smoke",
              show_default=True,
              help="smoke: synthetic styles and a tiny model (about a minute; plumbing only); cpu: the emoji styles "
                   "with the frozen configuration; cpu-data: a diagnostic (static and growing pools with retrieved "
                   "neighbours as data added).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where continual-<plan>.md/.json/.png go (default: docs/benchmarks for cpu plans, the work dir for "
                   "smoke).")
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=Path(".cache/bench-continual"),
              show_default=True)
@click.option("--frozen", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="The method benchmark's results JSON (docs/benchmarks/adaptation-<plan>.json): its frozen lr and "
                   "options are used, never tuned here.")
@click.option("--data", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="cpu: the emoji styles (t3ar data emoji --out DIR --styles google,twitter,openmoji,"
                   "openmoji-black,fluent3d,fluentflat).")
@click.option("--pool", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="cpu: the clipart base pool (the openclipart folder of t3ar data pool --out DIR).")
@click.option("--model", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="cpu: the source model (t3ar train-source on the google style).")
@click.option("--device", default="cpu", show_default=True)
def continual(plan_name: str, out_dir: Path | None, work_dir: Path, frozen: Path | None, data: Path | None,
              pool: Path | None, model: Path | None, device: str) -> None:
    """A stream of target styles adapted one after the other from the same base model, under four pool arms:
    static, growing (earlier targets contributed by the real mechanism), growing + compaction, no retrieval.

    \b
    Example (smoke):   t3ar bench continual --plan smoke
    Example (full):    t3ar bench continual --plan cpu --data data/emoji6 --pool data/pool/openclipart \\
                           --model runs/source.pt --frozen docs/benchmarks/adaptation-cpu.json
    """
    from t3ar_bench.continual.main import run_continual

    out = out_dir or (Path("docs/benchmarks") if plan_name.startswith("cpu") else work_dir)
    try:
        res = run_continual(plan_name, out_dir=out, work=work_dir, frozen=frozen, data=data, pool=pool, model=model,
                            device=device, progress=lambda line: click.echo(line, err=True))
    except ValueError as e:  # missing inputs, a results file without a selection
        raise click.ClickException(str(e)) from e
    from t3ar_bench.continual.report import verdict

    click.echo(f"{verdict(res['summary'])}\nwritten to {out}/continual-{plan_name}.md ({res['minutes']:.1f} min)")


bench.add_command(adapt_bench, "adapt")
bench.add_command(gpu_pack, "gpu-pack")
bench.add_command(pool_bench, "pool")
bench.add_command(neighbours_bench, "neighbours")
bench.add_command(mixed_bench, "mixed")


@bench.command("job")
@click.option("--model", "model", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=Path(".cache/demo/source.pt"), show_default=True, help="Base checkpoint (the demo's).")
@click.option("--target", type=click.Path(exists=True, file_okay=False, path_type=Path),
              default=Path(".cache/demo/target"), show_default=True, help="Target folder (the demo's).")
@click.option("--pool", type=click.Path(exists=True, file_okay=False, path_type=Path),
              default=Path(".cache/demo/pool"), show_default=True, help="Pool folder, ingested once (the demo's).")
@click.option("--config", "config_json", default='{"method": "t3ar", "mode": "test", "k": 5, "epochs": 2, '
              '"batch_size": 32}', show_default=True, help="The job's AdaptConfig as JSON (the demo's job).")
@click.option("--rounds", type=click.IntRange(1), default=3, show_default=True)
@click.option("--threads", type=click.IntRange(1), default=1, show_default=True,
              help="torch threads of both arms (the demo's OMP_NUM_THREADS).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("docs/benchmarks"), show_default=True, help="Where job-overhead.md/.json are written.")
@click.option("--registry", is_flag=True,
              help="Instead: the job on a plain stack and on `t3ar up --mlflow` (every finished job registered in "
                   "MLflow), side by side; writes job-registry.md/.json (needs the mlflow extra).")
def job(model: Path, target: Path, pool: Path, config_json: str, rounds: int, threads: int, out_dir: Path,
        registry: bool) -> None:
    """A job through the embedded stack vs the same adaptation in-process, side by side.

    Starts `t3ar up` in a temporary folder, ingests the pool, then per round submits the job and downloads its
    checkpoint, and runs the same adaptation in a fresh process (imports timed apart) and in this process.
    Writes the median ratios (stack wall ÷ fresh in-process wall; ÷ this process's) and the per-phase medians of
    the three arms. Run `bash scripts/demo.sh` first for the default inputs.
    """
    from t3ar_bench.job.main import run_job_benchmark

    configure_logging("INFO")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    config = json.loads(config_json)
    if not isinstance(config, dict):
        raise click.BadParameter("--config must be a JSON object")
    if registry:
        from t3ar_bench.job.registry import run_registry_benchmark

        done = run_registry_benchmark(model, target, pool, config, out_dir, rounds=rounds, threads=threads)
        click.echo(json.dumps({k: done[k] for k in ("off_median_s", "on_median_s", "overhead_pct",
                                                   "paired_overhead_pct_median", "registration_median_s")}, indent=2))
        click.echo(f"wrote {out_dir / 'job-registry.md'} and {out_dir / 'job-registry.json'}")
        return
    summary = run_job_benchmark(model, target, pool, config, out_dir, rounds=rounds, threads=threads)
    click.echo(json.dumps({k: summary[k] for k in ("ratio", "ratio_warm", "stack_wall_s", "in_process_wall_s",
                                                   "warm_wall_s", "phases")},
                          indent=2))
    click.echo(f"wrote {out_dir / 'job-overhead.md'} and {out_dir / 'job-overhead.json'}")
