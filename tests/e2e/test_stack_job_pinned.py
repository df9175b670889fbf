"""A seeded job's adapted weights are the code's, not the stack's (issue 35): the checkpoint the embedded stack's
worker returns is bit-identical to what :func:`t3ar.pipeline.run_adaptation` makes in this process from the same
base checkpoint, target, retriever (the stack's own) and config, on one torch thread as the worker runs. Any
change to the job path (phases, caches, a warm work horse) that altered the weights would fail here. The job's
phase table adds up to its worker total."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
import torch
from stack_helpers import FAST_JOB, Stack, tiny_checkpoint

from t3ar.clients.retriever import RetrieverProvider
from t3ar.data.target import read_target
from t3ar.method.config import AdaptConfig
from t3ar.models.checkpoint import load_checkpoint
from t3ar.pipeline import run_adaptation
from t3ar_services.worker.phases import WORKER_PHASES


def test_the_stacks_job_gives_the_in_process_weights(stack: Stack, pool_ids: list[str], labelled_zip: Path,
                                                     tmp_path: Path) -> None:
    base = tiny_checkpoint(tmp_path / "base.pt")
    config = {**FAST_JOB, "mode": "test", "seed": 3}
    with stack.api() as api:
        model_id = str(api.upload_model(base, "pinned").id)
        accepted = api.adapt(labelled_zip, model_id, config)
        job = api.wait(accepted.id, poll=0.2, timeout=180)
        assert isinstance(job.config, AdaptConfig)  # the API answers the job's config typed
        assert job.status == "finished", job
        from_stack, _ = load_checkpoint(api.download_checkpoint(accepted.id, tmp_path / "stack.pt"))
        report = api.report(accepted.id)

    phases = report.phases
    assert list(phases) == ["queue_wait", *WORKER_PHASES] and all(v >= 0 for v in phases.values())
    inside = sum(v for k, v in phases.items() if k != "queue_wait")
    assert inside == pytest.approx(report.seconds_total, abs=0.02)  # rounding of 14 three-digit figures
    assert phases["steps"] > 0 and phases["inputs_fetched"] > 0 and phases["neighbours_fetched"] > 0

    with zipfile.ZipFile(labelled_zip) as zf:
        zf.extractall(tmp_path / "target")
    model, info = load_checkpoint(base)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # T3AR_WORKER_TORCH_THREADS=1 in the stack: reductions depend on the thread count
    try:
        with stack.retriever() as client:
            run_adaptation(model, info, read_target(tmp_path / "target", strict=True),
                           job.config, provider=RetrieverProvider(client),
                           device=torch.device("cpu"))
    finally:
        torch.set_num_threads(threads)
    mine, theirs = model.state_dict(), from_stack.state_dict()
    assert mine.keys() == theirs.keys() and len(pool_ids) > 0
    assert all(torch.equal(mine[k], theirs[k]) for k in mine), [k for k in mine if not torch.equal(mine[k], theirs[k])]
