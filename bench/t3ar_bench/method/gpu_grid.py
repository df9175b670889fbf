"""Runs a GPU pack (:mod:`t3ar_bench.method.pack`): the frozen arms of the method benchmark on a lent GPU.

``PYTHONPATH=shared:bench python -m t3ar_bench.method.gpu_grid --pack DIR --out DIR [--workers N] [--device cuda]``
(``scripts/gpu_grid.sh`` is the device call). Needs torch, timm, numpy, pillow and pydantic (plus the packaged
Lite0 weights); never faiss, a retriever model, the data kits or the services.

1. checks the pack (complete, intact, this code version: else one line and exit status 2);
2. trains the source model of each seed on the device (:func:`t3ar_bench.method.data.source_model`), in parallel;
3. runs every arm of :func:`t3ar_bench.method.grid.grid_arms` under the pack's frozen selection with
   :func:`t3ar_bench.method.runs.run_arm` in ``--workers`` processes (spawned; each loads the pack once), seed by
   seed, longest runs first, and the source model's accuracy per (shift, seed);
4. summarises with :func:`t3ar_bench.method.grid.summarise_grid` (paired per seed, 95 % CIs, the goals in points)
   and writes ``adaptation-gpu.md``, ``.json`` and ``-goals.png`` (:mod:`t3ar_bench.method.gpu_report`).

``--budget-s`` stops starting runs after that many seconds; the report then covers the seeds whose every run
finished and says so (``partial``). Runs are cached under ``--work`` (the code, arm, source model and data key
them), so a rerun there continues.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import platform
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the module imports torch and the bench only when it runs (a fast --help)
    from t3ar_bench.method.data import SourceModel
    from t3ar_bench.method.plans import BenchPlan
    from t3ar_bench.method.runs import Context

log = logging.getLogger("t3ar_bench.method.gpu_grid")

#: relative cost of an arm (ordering only: the longest start first so that the last ones to finish are short)
_COST = {"bn-adapt": 0.05, "adacontrast": 1.2}


@dataclasses.dataclass
class Job:
    """What every run process is told: the pack, its unpacked images, the work folder, the device, its torch threads
    and the effective plan (the pack's, with ``--seeds`` and ``--max-steps`` applied) as ``BenchPlan.as_dict()``."""

    pack: Path
    images: Path
    work: Path
    device: str
    threads: int
    plan: dict[str, Any]


_STATE: dict[str, Any] = {}


def _init(job: Job) -> None:
    """Per run process: one thread budget, the pack loaded once."""
    import torch

    from t3ar_bench.method.pack import load_pack, plan_from_dict, read_manifest

    torch.set_num_threads(job.threads)
    _STATE["job"] = job
    _STATE["plan"] = plan_from_dict(job.plan)
    _STATE["data"] = load_pack(job.pack, read_manifest(job.pack, check_code=False), job.images)


def _source(seed: int) -> SourceModel:
    import torch

    from t3ar_bench.method.data import source_model
    from t3ar_bench.method.runs import source_config

    job, data, plan = _STATE["job"], _STATE["data"], _STATE["plan"]
    return source_model(job.work, data.source, source_config(plan, seed), plan.image_size,
                        data.manifest["kit_request"], torch.device(job.device))


def _context() -> Context:
    """The run context of this process (source models loaded from ``work/models`` once trained)."""
    if "ctx" not in _STATE:
        import torch

        from t3ar_bench.method.runs import Context, code_hash

        job, data, plan = _STATE["job"], _STATE["data"], _STATE["plan"]
        sources = {seed: _source(seed) for seed in plan.seeds}
        _STATE["ctx"] = Context(plan, torch.device(job.device), job.work, data.targets, sources,
                                dict(data.pools), data.side, code_hash())
    ctx: Context = _STATE["ctx"]
    return ctx


def _train_source(seed: int) -> dict[str, Any]:
    src = _source(seed)
    return {"seed": seed, "sha256": src.sha256, "reused": src.reused, "seconds": src.metrics.get("seconds")}


def _run(arm: Mapping[str, Any]) -> dict[str, Any]:
    from t3ar_bench.method.runs import run_arm, source_record

    ctx = _context()
    if arm["method"] == "source":
        return {"phase": "main", "label": "source", "shift": arm["shift"], "seed": arm["seed"],
                "fraction": arm["fraction"], "method": "source",
                **source_record(ctx, arm["shift"], arm["seed"], arm["fraction"])}
    return run_arm(ctx, arm)


def _plan(plan: BenchPlan, max_steps: int | None) -> BenchPlan:
    return plan if max_steps is None else dataclasses.replace(plan, max_steps=max_steps)


def ordered_arms(plan: BenchPlan, selection: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every arm of the grid plus one ``source`` evaluation per (shift, seed, fraction): seed by seed (so that a
    stopped run leaves whole seeds), longest first within a seed."""
    from t3ar_bench.method.grid import grid_arms

    arms = grid_arms(plan, selection)
    arms += [{"phase": "main", "shift": sh, "seed": s, "fraction": f, "method": "source", "label": "source"}
             for sh in plan.eval_shifts for s in plan.seeds for f in plan.fractions]
    return sorted(arms, key=lambda a: (plan.seeds.index(a["seed"]),
                                       -a["fraction"] * _COST.get(a["method"], 1.0 if a["method"] != "source" else 0)))


def complete_seeds(plan: BenchPlan, arms: Sequence[Mapping[str, Any]], done: Sequence[Mapping[str, Any]]) -> list[int]:
    """The seeds whose every arm has a record."""
    need: dict[int, int] = {}
    for a in arms:
        need[a["seed"]] = need.get(a["seed"], 0) + 1
    got: dict[int, int] = {}
    for r in done:
        got[r["seed"]] = got.get(r["seed"], 0) + 1
    return [s for s in plan.seeds if got.get(s, 0) == need.get(s, 0) and need.get(s, 0)]


def _runs(ex: ProcessPoolExecutor, arms: Sequence[Mapping[str, Any]], *, deadline: float | None
          ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], bool]:
    """Every arm on ``ex``, in order; none started after ``deadline`` (perf_counter). Returns (records, failures:
    the arm and its error for each run that raised, whether the deadline stopped it)."""
    futures: dict[Future[dict[str, Any]], Mapping[str, Any]] = {ex.submit(_run, a): a for a in arms}
    records: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    t_start, pending, stopped = time.perf_counter(), set(futures), False

    def collect(done: set[Future[dict[str, Any]]]) -> None:
        for f in done:
            try:
                records.append(f.result())
            except Exception as exc:  # a failed run (or a broken pool): reported, and its seed left out
                failures.append({"arm": dict(futures[f]), "error": f"{type(exc).__name__}: {exc}"})
                log.error("run failed: %s: %s", futures[f], exc)
        n = len(records) + len(failures)
        if done and (n // 10 > (n - len(done)) // 10 or not pending):
            el = time.perf_counter() - t_start
            log.info("[%d/%d] runs, %.0f s, ~%.0f s left", n, len(arms), el, el / n * (len(arms) - n))

    while pending:
        left = None if deadline is None else deadline - time.perf_counter()
        done, pending = wait(pending, timeout=None if left is None else max(0.0, left), return_when="FIRST_COMPLETED")
        collect(done)
        if left is not None and left <= 0 and pending:
            stopped = True
            not_started = sum(f.cancel() for f in pending)
            log.warning("time budget spent: %d runs not started", not_started)
            running = {f for f in pending if not f.cancelled()}
            pending = set()
            collect(wait(running).done)
    return records, failures, stopped


def check_selection(manifest: Mapping[str, Any], root: Path) -> None:
    """Refuse (PackError) a pack whose frozen selection is no longer the committed one: when the results file it
    came from exists under ``root`` and its sha256 differs from the one recorded at build time."""
    from t3ar.digest import file_sha256
    from t3ar_bench.method.pack import PackError

    origin = manifest["selection_origin"]
    path = Path(origin["file"]) if Path(origin["file"]).is_absolute() else root / origin["file"]
    if path.is_file() and file_sha256(path) != origin["sha256"]:
        raise PackError(f"{path} changed since the pack was built (its selection is frozen into the pack): rebuild "
                        "the pack with `t3ar bench gpu-pack`")


def run_grid(pack: Path, out: Path, *, work: Path, workers: int, device: str, max_steps: int | None = None,
             budget_s: float | None = None, seeds: Sequence[int] | None = None, threads: int | None = None
             ) -> dict[str, Any]:
    """Steps 1-4 of the module docstring; returns the results written to ``out``. ``threads``: torch threads per
    run process (default: the CPU cores shared out among the processes)."""
    import torch

    from t3ar.device import resolve_device
    from t3ar_bench.method.gpu_report import write_gpu_report
    from t3ar_bench.method.grid import summarise_grid
    from t3ar_bench.method.pack import pack_code, plan_from_dict, read_manifest, unpack_images

    t0 = time.perf_counter()
    manifest = read_manifest(pack)
    check_selection(manifest, Path.cwd())
    dev = resolve_device(device)
    plan = _plan(plan_from_dict(manifest["plan"]), max_steps)
    if seeds is not None:
        if not set(seeds) <= set(plan.seeds):
            raise ValueError(f"--seeds: choose among the pack's seeds {list(plan.seeds)}")
        plan = dataclasses.replace(plan, seeds=tuple(seeds))
    images = unpack_images(pack, manifest, work / "unpacked")
    t_unpack = time.perf_counter()
    log.info("pack checked and unpacked in %.0f s", t_unpack - t0)
    selection = manifest["selection"]
    arms = ordered_arms(plan, selection)
    job = Job(pack, images, work, str(dev), threads or max(1, (os.cpu_count() or 1) // workers), plan.as_dict())
    log.info("%d runs on %s in %d processes (pack %s, plan %s)", len(arms), dev, workers, pack, plan.name)
    import multiprocessing as mp

    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=_init, initargs=(job,)) as ex:
        sources = [f.result() for f in [ex.submit(_train_source, s) for s in plan.seeds]]
        t_sources = time.perf_counter()
        log.info("source models ready in %.0f s", t_sources - t_unpack)
        records, failures, stopped = _runs(ex, arms, deadline=None if budget_s is None else t0 + budget_s)
    t_runs = time.perf_counter()
    kept = complete_seeds(plan, arms, records)
    summary: dict[str, Any] = {}
    if kept:
        summary = summarise_grid(dataclasses.replace(plan, seeds=tuple(kept)), selection,
                                 [r for r in records if r["seed"] in kept])
    res: dict[str, Any] = {
        "plan": plan.as_dict(), "pack": {k: v for k, v in manifest.items() if k not in ("plan", "selection")},
        "code": pack_code(), "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda"
        else f"{os.cpu_count()} CPU cores, {platform.machine()}",
        "machine": {"cpus": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version()},
        "workers": workers, "selection": selection, "frozen_from": manifest["selection_origin"],
        "sources": sources, "failures": failures, "seeds_reported": kept,
        "partial": stopped or kept != list(plan.seeds),
        "runs": {"planned": len(arms), "done": len(records),
                 "executed": sum(1 for r in records if r.get("cached") is False),
                 "cached": sum(1 for r in records if r.get("cached"))},
        "seconds": {"unpack": t_unpack - t0, "sources": t_sources - t_unpack, "runs": t_runs - t_sources,
                    "total": time.perf_counter() - t0},
        "run_seconds_total": sum(float(r.get("seconds") or 0.0) for r in records),
        "steps_total": sum(int(r.get("steps") or 0) for r in records),
        **{k: summary[k] for k in ("evaluation_shifts", "goals", "cells", "vs_bn_adapt_all", "label_use",
                                   "label_free_selection", "label_free_verdict") if k in summary},
        # each run's target predictions served the agreement criterion (in the summary): not kept
        "records": [{k: v for k, v in r.items() if k != "target_predictions"} for r in records]}
    write_gpu_report(res, out, stem="adaptation-gpu")
    return res


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module docstring); exit 0, or 2 with one line on stderr for a bad pack or
    option."""
    ap = argparse.ArgumentParser(prog="python -m t3ar_bench.method.gpu_grid", description=__doc__.split("\n")[0])
    ap.add_argument("--pack", type=Path, required=True, help="the pack folder (t3ar bench gpu-pack)")
    ap.add_argument("--out", type=Path, required=True, help="where adaptation-gpu.md/.json/-goals.png go")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "t3ar-gpu-grid",
                    help="source models, unpacked images and the run cache (a rerun continues) [%(default)s]")
    ap.add_argument("--workers", type=int, default=None, help="run processes [the pack plan's: 12 for the GPU plan]")
    ap.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda[:N] [%(default)s]")
    ap.add_argument("--max-steps", type=int, default=None, help="cap optimiser steps per run (a smoke, not results)")
    ap.add_argument("--budget-s", type=float, default=None, help="start no run after this many seconds")
    ap.add_argument("--seeds", default=None, help="only these of the pack's seeds, e.g. 0,1")
    ap.add_argument("--threads", type=int, default=None, help="torch threads per run process [cores / workers]")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    from t3ar.errors import T3arError
    from t3ar_bench.method.pack import plan_from_dict, read_manifest

    try:
        manifest = read_manifest(args.pack)
        workers = args.workers or plan_from_dict(manifest["plan"]).workers
        seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else None
        res = run_grid(args.pack, args.out, work=args.work, workers=workers, device=args.device,
                       max_steps=args.max_steps, budget_s=args.budget_s, seeds=seeds, threads=args.threads)
    except (T3arError, ValueError) as exc:
        print(f"gpu_grid: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.out / 'adaptation-gpu.md'}: {res['runs']['done']}/{res['runs']['planned']} runs, "
          f"{res['seconds']['total']:.0f} s on {res['device_name']}" + (" (partial)" if res["partial"] else ""))
    return 0


if __name__ == "__main__":
    from t3ar_bench.method.gpu_grid import main as _main  # the module's functions, not __main__'s, reach workers

    sys.exit(_main())
