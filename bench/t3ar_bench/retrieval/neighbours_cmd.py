"""``t3ar bench neighbours``: neighbour precision per shift for every retriever option (issue 52, item 1)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import click

from t3ar.logs import configure_logging
from t3ar_bench.method.command import default_cache


def _floats(spec: str) -> list[float]:
    try:
        return [float(x) for x in spec.split(",") if x.strip()]
    except ValueError as e:
        raise click.BadParameter(f"not a comma-separated list of numbers: {spec!r}") from e


def work_and_cache_options(command: Callable[..., None]) -> Callable[..., None]:
    """``--work`` (kits, source models and caches; one directory for both commands, so each reuses the other's) and
    ``--cache`` (downloaded packages)."""
    command = click.option("--cache", type=click.Path(file_okay=False, path_type=Path), default=default_cache,
                           help="Downloaded packages ($T3AR_CACHE_DIR or .cache/t3ar).")(command)
    return click.option("--work", type=click.Path(file_okay=False, path_type=Path),
                        default=Path(".cache/bench-neighbours"), show_default=True,
                        help="Kits, source models and caches (shared by `bench neighbours` and `bench mixed`)."
                        )(command)


@click.command("neighbours")
@work_and_cache_options
@click.option("--shifts", default="twitter,openmoji,openmoji-black,fluent3d", show_default=True,
              help="Target styles of the emoji kit (comma-separated).")
@click.option("--fractions", default="0.1,0.3", show_default=True)
@click.option("--seeds", default="0", show_default=True)
@click.option("--source-epochs", type=click.IntRange(1), default=6, show_default=True,
              help="The source model's schedule (the cpu plan's: 6).")
@click.option("--shrinkage", type=click.FloatRange(0.0, 1.0, min_open=True), default=None,
              help="The label map's shrinkage of the within-class covariance (default: t3ar.label_metric's).")
@click.option("--no-label-adapted", is_flag=True, help="Leave out the options that fit a map on the pool's labels.")
@click.option("--threads", type=click.IntRange(1), default=None, help="torch threads (default: torch's).")
@click.option("--validation", default="fluent3d", show_default=True,
              help="The validation shift: the report's choice of option is made on it alone.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("docs/benchmarks"), show_default=True, help="Where neighbours.md/.json are written.")
def neighbours(work: Path, cache: Path, shifts: str, fractions: str, seeds: str, source_epochs: int,
               shrinkage: float | None, no_label_adapted: bool, threads: int | None, validation: str,
               out_dir: Path) -> None:
    """Precision@5 of each retriever option (R, the base model's features with and without the target's BatchNorm
    statistics, re-ranking, class-conditional, R re-ranked in a space fit on the pool's labels, class-conditional
    on a pseudo-label refined by the labelled neighbours, random, class-matched random) beside the pseudo-labels'
    accuracy."""
    import torch

    from t3ar.label_metric import DEFAULT_SHRINKAGE
    from t3ar_bench.retrieval.neighbours import markdown, run_neighbours, summary, summary_markdown

    configure_logging("INFO")
    if threads:
        torch.set_num_threads(threads)
    results = run_neighbours(work, cache, shifts=[s for s in shifts.split(",") if s], fractions=_floats(fractions),
                             seeds=[int(s) for s in _floats(seeds)], source_epochs=source_epochs,
                             shrinkage=DEFAULT_SHRINKAGE if shrinkage is None else shrinkage,
                             label_adapted=not no_label_adapted)
    results["summary"] = summary(results, validation)
    text = markdown(results) + "\n" + summary_markdown(results["summary"])
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "neighbours.json").write_text(json.dumps(results, indent=2) + "\n")
    (out_dir / "neighbours.md").write_text("# Neighbour precision per retriever option (issue 52)\n\n" + text)
    click.echo(text)
    click.echo(f"wrote {out_dir / 'neighbours.md'} and {out_dir / 'neighbours.json'}")


def _part(spec: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in spec.split("/"))
    except ValueError as e:
        raise click.BadParameter(f"not I/N: {spec!r}") from e
    if not 0 <= i < n:
        raise click.BadParameter(f"part {spec!r}: I must be in 0..N-1")
    return i, n


@click.command("mixed")
@work_and_cache_options
@click.option("--icons", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="The icon store (t3ar.datakit.icons; default WORK/icons, built there when missing).")
@click.option("--shifts", default="fluent3d,twitter,openmoji,openmoji-black", show_default=True,
              help="Target styles of the emoji kit; the first is the validation shift, which chooses the options.")
@click.option("--seeds", default="0,1,2", show_default=True)
@click.option("--fractions", default="0.1,0.3", show_default=True)
@click.option("--arms", default=None, help="Only these arms (comma-separated labels; default every arm).")
@click.option("--part", default="0/1", show_default=True,
              help="I/N: run every N-th run from the I-th (split the grid over processes; runs are cached).")
@click.option("--threads", type=click.IntRange(1), default=None, help="torch threads (default: torch's).")
@click.option("--cached-only", is_flag=True, help="Run nothing: report the runs already in the cache.")
@click.option("--icon-cap", type=click.IntRange(1), default=None, help="At most this many icons per set.")
@click.option("--clipart-cap", type=click.IntRange(1), default=None, help="At most this many per clipart source.")
@click.option("--max-steps", type=click.IntRange(1), default=40, show_default=True)
@click.option("--max-adapt", type=click.IntRange(2), default=None)
@click.option("--max-eval", type=click.IntRange(2), default=None)
@click.option("--workers", type=click.IntRange(1), default=2, show_default=True, help="Icon rendering processes.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("docs/benchmarks"),
              show_default=True, help="Where mixed-pool.md/.json are written (by a run of the whole grid, part 0/1).")
@click.option("--adopt/--no-adopt", default=False, show_default=True,
              help="Also add the goals (and OUT/neighbours.json's precision) to OUT/adaptation-cpu.{json,md,png}.")
def mixed(work: Path, cache: Path, icons: Path | None, shifts: str, seeds: str, fractions: str, arms: str | None,
          part: str, threads: int | None, cached_only: bool, icon_cap: int | None, clipart_cap: int | None,
          max_steps: int,
          max_adapt: int | None, max_eval: int | None, workers: int, out_dir: Path, adopt: bool) -> None:
    """The mixed-pool arms (T3AR with retrieval, t3ar-random, class-matched random labelled items, no retrieval,
    bn-adapt, the whole-pool reference, the ranking options and the recipe) on a pool where the relevant emoji are
    <= 5 %, over shifts x seeds x fractions, with the issue's goals in points."""
    import torch

    from t3ar.datakit.icons import build_icons
    from t3ar_bench.retrieval.mixed_grid import run_mixed_grid
    from t3ar_bench.retrieval.mixed_report import markdown, report

    configure_logging("INFO")
    if threads:
        torch.set_num_threads(threads)
    store = icons or work / "icons"
    built = build_icons(store, cache=cache, workers=workers)
    shift_list = [s for s in shifts.split(",") if s]
    results = run_mixed_grid(work, cache, store, shifts=shift_list, seeds=[int(s) for s in _floats(seeds)],
                             fractions=_floats(fractions), arms=[a for a in arms.split(",") if a] if arms else None,
                             part=_part(part), icon_cap=icon_cap, clipart_cap=clipart_cap, max_steps=max_steps,
                             max_adapt=max_adapt, max_eval=max_eval, cached_only=cached_only)
    results["icon_store"] = {"total": built.total, "seconds_to_build": built.seconds, "reused": built.reused}
    if _part(part) != (0, 1):
        click.echo(f"part {part}: {len(results['records'])} runs done (the whole grid's call writes the report)")
        return
    full = report(results, validation=shift_list[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "mixed-pool.json").write_text(json.dumps(full, indent=2) + "\n")
    (out_dir / "mixed-pool.md").write_text(markdown(full))
    click.echo(markdown(full))
    click.echo(f"wrote {out_dir / 'mixed-pool.md'} and {out_dir / 'mixed-pool.json'}")
    if adopt:
        import datetime
        import subprocess

        from t3ar_bench.retrieval.mixed_adopt import write

        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                check=False).stdout.strip() or "unknown"
        source = (f"`t3ar bench mixed` on {datetime.date.today().isoformat()} (commit {commit}, "
                  f"{len(full['records'])} runs)")
        npath = out_dir / "neighbours.json"
        neighbours_json = json.loads(npath.read_text()) if npath.is_file() else None
        click.echo(f"adopted into {write(out_dir, full, neighbours_json, source=source)}")
