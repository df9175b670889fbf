"""The in-process arm of the job-overhead benchmark: the stack job's adaptation without the stack.

:func:`adapt_once` loads the checkpoint, reads the target, runs :func:`t3ar.pipeline.run_adaptation` with the
stack's retriever (the same neighbours as the job) and saves the checkpoint; it returns the wall seconds and a
phase table with the worker's phase names, so the report can put the two side by side.

It runs in two kinds of process, both measured in every round:

- **fresh** (``python -m t3ar_bench.job.arm SPEC.json``): a new interpreter per round, as ``t3ar adapt`` is. Its
  imports are timed apart and left out of its wall (``imports_s``), as the stack's worker imports once before it
  forks (``T3AR_WORKER_PRELOAD``): what is left is the same cold process a job's work horse is.
- **warm** (:func:`adapt_once` in the benchmark's own process): after the first round this process has run the
  same shapes before (oneDNN's primitive cache, the allocator's retained blocks), which no job's fresh work horse
  has. It shows what a process kept warm across jobs would gain.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any


def adapt_once(spec: dict[str, Any]) -> dict[str, Any]:
    """One adaptation as the stack's job runs it. ``spec``: ``retriever_url``, ``retriever_token``, ``model``,
    ``target``, ``config`` (AdaptConfig JSON), ``threads``, ``out`` (checkpoint path). Returns ``wall_s`` and
    ``phases`` (model_loaded, the pipeline's phases, checkpoint_written)."""
    import torch

    from t3ar.clients.retriever import RetrieverClient, RetrieverProvider
    from t3ar.data.target import read_target
    from t3ar.method.config import AdaptConfig
    from t3ar.models.checkpoint import load_checkpoint, save_checkpoint
    from t3ar.pipeline import run_adaptation

    torch.set_num_threads(int(spec["threads"]))
    t = time.perf_counter()
    model, info = load_checkpoint(Path(spec["model"]))
    config = AdaptConfig.model_validate(spec["config"])
    target = read_target(Path(spec["target"]), strict=True)
    phases: dict[str, float] = {"model_loaded": time.perf_counter() - t}
    with RetrieverClient(spec["retriever_url"], spec["retriever_token"]) as client:
        outcome = run_adaptation(model, info, target, config, provider=RetrieverProvider(client),
                                 device=torch.device("cpu"))
    phases.update(outcome.phase_seconds)
    t_save = time.perf_counter()
    save_checkpoint(Path(spec["out"]), model, info.spec, adapt_config=config.model_dump(), lineage=outcome.lineage,
                    metrics=outcome.checkpoint_metrics())
    phases["checkpoint_written"] = time.perf_counter() - t_save
    wall = time.perf_counter() - t
    return {"wall_s": wall, "phases": {k: round(v, 3) for k, v in phases.items()}}


def main(argv: list[str] | None = None) -> int:
    """``python -m t3ar_bench.job.arm SPEC.json``: import, then :func:`adapt_once`; prints one JSON line with
    ``imports_s`` added."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m t3ar_bench.job.arm SPEC.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(args[0]).read_text())
    t = time.perf_counter()
    import torch  # noqa: F401  (the imports a preloading worker does once, timed apart)

    import t3ar.pipeline  # noqa: F401
    imports = time.perf_counter() - t
    out = adapt_once(spec)
    print(json.dumps({**out, "imports_s": round(imports, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
