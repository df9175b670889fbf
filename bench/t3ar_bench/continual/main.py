"""Run the continual benchmark: prepare the stream (adaptation and held-out parts of every style), run every
arm over it for every seed (:mod:`~t3ar_bench.continual.run`), summarise and write the report.

Inputs of the ``cpu`` plan, made by the existing commands (nothing is downloaded here): ``--data`` = the output
of ``t3ar data emoji`` (one ImageFolder per style), ``--pool`` = the output of ``t3ar data pool`` (the clipart
base pool), ``--model`` = a source model trained on the Google style (``t3ar train-source``), ``--frozen`` = the
method benchmark's results JSON whose ``selection`` fixes the lr and options. The ``smoke`` plan makes its own
synthetic data and a tiny model.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from t3ar.data.datasets import read_labelled, read_unlabelled
from t3ar_bench.continual.plan import PLANS, ContinualPlan, frozen_retriever, load_selection
from t3ar_bench.continual.report import summarise, write
from t3ar_bench.continual.run import Step, run_stream
from t3ar_bench.method.protocol import cap_indices, split_adapt_eval


def _steps(styles_dir: Path, stream: tuple[str, ...], eval_share: float, cap: int | None) -> list[Step]:
    steps = []
    for style in stream:
        full = read_labelled(styles_dir / style)
        assert full.labels is not None
        adapt, held = split_adapt_eval(full.labels, eval_share, seed=0)  # the same split for every arm and seed
        steps.append(Step(style, full.subset(cap_indices(adapt, cap, seed=0)), full.subset(held)))
    return steps


def _base_pool(pool: Path, cap: int | None, work: Path) -> Path:
    """The base pool as the plan caps it: the folder itself, or a seeded subset of its images copied under
    ``work`` (the same subset for every arm and seed)."""
    items = read_unlabelled(pool)
    if cap is None or len(items) <= cap:
        return pool
    capped = work / f"base-pool-{cap}"
    shutil.rmtree(capped, ignore_errors=True)
    for i in cap_indices(range(len(items)), cap, seed=0):
        dest = capped / items.ids[i]
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(items.paths[i], dest)
    return capped


def run_continual(plan_name: str | ContinualPlan, *, out_dir: Path, work: Path, frozen: Path | None = None,
                  data: Path | None = None, pool: Path | None = None, model: Path | None = None,
                  device: str = "cpu", stem: str | None = None,
                  progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    from t3ar.device import resolve_device
    from t3ar.embedder import Embedder, EmbedderSpec

    plan = PLANS[plan_name] if isinstance(plan_name, str) else plan_name
    work.mkdir(parents=True, exist_ok=True)
    if plan.name.startswith("smoke"):
        from t3ar_bench.continual.smoke import make_smoke_data, tiny_model

        made = make_smoke_data(work / "data")
        data, pool = made["styles"], made["pool"]
        model = tiny_model(work / "base.pt", plan.image_size)
    if data is None or pool is None or model is None:
        raise ValueError(f"the {plan.name} plan needs --data (t3ar data emoji), --pool (t3ar data pool) and --model "
                         "(t3ar train-source on the google style)")
    missing = [st for st in plan.stream if not (data / st).is_dir()]
    if missing:
        raise ValueError(f"{data}: no folder for the styles {missing} of the {plan.name} plan's stream; build the kit "
                         f"with t3ar data emoji --styles google,{','.join(plan.stream)}")
    t0 = time.perf_counter()
    dev = resolve_device(device)
    selection = load_selection(frozen)
    embedder = Embedder(EmbedderSpec.parse(frozen_retriever(selection), image_size=plan.image_size), device=dev)
    steps = _steps(data, plan.stream, plan.eval_share, plan.adapt_cap)
    base_pool = _base_pool(pool, plan.pool_cap, work)
    records = run_stream(plan, steps, model, base_pool, selection, work / "runs", embedder, dev, arms=plan.arms,
                         progress=progress)
    res: dict[str, Any] = {"plan": plan.describe(), "stream": list(plan.stream), "device": str(dev),
                           "frozen_from": str(frozen) if frozen else None, "selection": selection,
                           "summary": summarise(records, plan.seeds, len(steps)), "records": records,
                           "minutes": (time.perf_counter() - t0) / 60}
    write(res, out_dir, stem or f"continual-{plan.name}")
    return res
