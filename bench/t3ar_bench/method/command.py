"""``t3ar bench adapt``: does retrieval make adaptation better? (the method benchmark)

The click command only; the benchmark lives in :mod:`t3ar_bench.method.main` (imported when the command runs,
so that ``t3ar --help`` stays fast). Writes ``adaptation-<plan>.md``, ``.json`` (every run) and PNG plots.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from t3ar.logs import configure_logging
from t3ar_bench.method.plans import BenchPlan


def default_cache() -> str:
    """Where downloaded npm/Debian packages are kept: $T3AR_CACHE_DIR or .cache/t3ar."""
    return os.environ.get("T3AR_CACHE_DIR") or str(Path(".cache") / "t3ar")


def _only_fractions(plan: BenchPlan, spec: str) -> BenchPlan:
    """``plan`` restricted to the comma-separated fractions in ``spec`` (each must be one of the plan's)."""
    import dataclasses

    try:
        wanted = {float(x) for x in spec.split(",") if x.strip()}
    except ValueError:
        raise click.BadParameter(f"not a comma-separated list of numbers: {spec!r}", param_hint="--fractions") from None
    unknown = wanted - set(plan.fractions) - set(plan.train_fractions)
    if not wanted or unknown:
        raise click.BadParameter(f"choose among the plan's fractions {sorted({*plan.fractions, *plan.train_fractions})}"
                                 f", got {spec!r}", param_hint="--fractions")
    keep = tuple(f for f in plan.fractions if f in wanted)
    needed = {plan.select_fraction, plan.ablation_fraction}
    if not needed <= set(keep):
        raise click.BadParameter(f"the plan chooses and ablates at {sorted(needed)}: keep those",
                                 param_hint="--fractions")
    return dataclasses.replace(plan, fractions=keep, low_fractions=tuple(f for f in plan.low_fractions if f in wanted),
                               train_fractions=tuple(f for f in plan.train_fractions if f in wanted),
                               notes=(*plan.notes, f"restricted to fractions {spec} (--fractions)"))


def _restricted(plan: BenchPlan, seeds: str | None, shifts: str | None) -> BenchPlan:
    """``plan`` on a subset of its evaluation seeds and/or shifts (a note says which)."""
    import dataclasses

    notes = list(plan.notes)
    if seeds is not None:
        try:
            want = tuple(int(s) for s in seeds.split(","))
        except ValueError as exc:
            raise click.BadParameter(f"{seeds!r}: give seeds as N,N,...", param_hint="--seeds") from exc
        if not want or not set(want) <= set(plan.seeds):
            raise click.BadParameter(f"choose among the plan's seeds {list(plan.seeds)}", param_hint="--seeds")
        plan = dataclasses.replace(plan, seeds=want)
        notes.append(f"restricted to seeds {list(want)} (--seeds)")
    if shifts is not None:
        names = tuple(s.strip() for s in shifts.split(",") if s.strip())
        if not names or not set(names) <= set(plan.eval_shifts):
            raise click.BadParameter(f"choose among the plan's shifts {list(plan.eval_shifts)}", param_hint="--shifts")
        plan = dataclasses.replace(plan, eval_shifts=names)
        notes.append(f"restricted to the evaluation shifts {list(names)} (--shifts)")
    return dataclasses.replace(plan, notes=tuple(notes))


@click.command("adapt")
@click.option("--plan", "plan_name", type=click.Choice(["quick", "cpu", "paper", "drift", "contrastive"]),
              default="quick", show_default=True,
              help="quick: smoke run (minutes); cpu: the acceptance round's grid with capped steps (9 evaluation "
                   "shifts, 2 validation shifts, 3 seeds: hours on 2 cores; may run in two starts with --shifts, "
                   "sharing the run cache); "
                   "paper: the paper's 30-epoch schedule, for a CUDA GPU; drift: per-epoch diagnostic curves "
                   "of the contrastive methods over 30 epochs on google -> twitter; contrastive: the term retrieval "
                   "acts through, at its defaults and as validation chose it, with and without retrieval, against "
                   "the cross-entropy alone, at 30 epochs on every shift (a diagnostic, about 45 minutes on 2 "
                   "cores).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where adaptation-<plan>.md/.json/.png go [default: docs/benchmarks; quick: WORK_DIR/quick].")
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=Path(".cache/bench-adapt"),
              show_default=True, help="Data kits, source models, embeddings and per-run results (reused).")
@click.option("--cache", type=click.Path(file_okay=False, path_type=Path), default=default_cache,
              show_default="$T3AR_CACHE_DIR or .cache/t3ar", help="Downloaded npm/Debian packages (reused).")
@click.option("--device", default="auto", show_default=True, help="auto (CUDA when present), cpu, cuda[:N].")
@click.option("--workers", type=click.IntRange(1, 64), default=None,
              help="Parallel run processes [default: the plan's; paper: 12]. On a GPU at these sizes the device is "
                   "mostly idle, so several processes share it well.")
@click.option("--fractions", default=None, metavar="F,F,...",
              help="Run only these of the plan's fractions (test- and train-time), e.g. 0.1,0.3 for the low-data "
                   "cells. Runs are cached per run, so a later full run reuses them.")
@click.option("--seeds", default=None, metavar="N,N,...",
              help="Run only these of the plan's evaluation seeds (a smaller grid; the report says so).")
@click.option("--shifts", default=None, metavar="S,S,...",
              help="Run only these of the plan's evaluation shifts (a smaller grid; the report says so).")
def adapt_bench(plan_name: str, out_dir: Path | None, work_dir: Path, cache: Path, device: str,
                workers: int | None, fractions: str | None, seeds: str | None, shifts: str | None) -> None:
    """Method benchmark: does adaptation help, and can a job tell? Chooses every hyper-parameter on the validation
    shifts (google -> fluent3d; the cpu plan also -> Fluent high-contrast, by the worse of the two), then compares
    the plan's arms (source, bn-adapt, the baselines, the T3AR family, the labelled pool and its random control,
    the winner on a labelled acceptance holdout) on the evaluation shifts, paired with 95 % CIs, with label-free
    selection criteria measured leave-one-shift-out.

    \b
    Example:
      t3ar bench adapt --plan quick
      t3ar bench adapt --plan cpu --shifts twitter,openmoji,openmoji-black,noto-v1   # then: --plan cpu
      t3ar bench adapt --plan paper --device cuda
    """
    import dataclasses

    from t3ar.device import resolve_device
    from t3ar.errors import T3arError
    from t3ar_bench.method.contrastive_study import run_contrastive_study
    from t3ar_bench.method.main import run_drift_study, run_method_benchmark
    from t3ar_bench.method.plans import PLANS

    configure_logging("INFO")  # force: the CLI root configured WARNING
    plan = PLANS[plan_name]
    if workers is not None:
        plan = dataclasses.replace(plan, workers=workers)
    if fractions is not None:
        plan = _only_fractions(plan, fractions)
    if seeds is not None or shifts is not None:
        plan = _restricted(plan, seeds, shifts)
    out_dir = out_dir or (work_dir / "quick" if plan_name == "quick" else Path("docs/benchmarks"))
    try:
        if plan_name in ("drift", "contrastive"):
            study = run_drift_study if plan_name == "drift" else run_contrastive_study
            study(plan, out_dir=out_dir, work=work_dir, cache=cache, device=resolve_device(device))
            click.echo(f"wrote {out_dir / f'adaptation-{plan_name}.md'}")
            return
        res = run_method_benchmark(plan, out_dir=out_dir, work=work_dir, cache=cache, device=resolve_device(device))
    except T3arError as exc:
        raise click.ClickException(str(exc)) from exc
    stem = f"adaptation-{plan_name}"
    click.echo(json.dumps({"verdict": res["verdict"], "minutes": round(res["minutes"]["total"], 1)}, indent=2,
                          default=str))
    click.echo(f"wrote {out_dir / (stem + '.md')} and {out_dir / (stem + '.json')}")
