"""The rq job: :func:`run_adapt_job` (a top-level function with one JSON argument, see
:class:`~t3ar_services.common.job_contract.JobSpec`).

It runs in the work-horse process. torch and the core are imported here, inside the function, so the
forking worker parent stays free of torch (DESIGN.md: fork after a torch op can deadlock).

Outcome: on success ``artifacts/<job_id>/`` holds ``model.pt`` (the adapted checkpoint, with its AdaptConfig
and lineage inside), ``report.json`` and, written last, ``lineage.json``; the return value is a small JSON
summary. On error ``job.meta['error']`` holds a one-line message (what the API shows) and the exception is
re-raised so rq marks the job failed. On cancellation ``job.meta['canceled']`` is true.
"""

from __future__ import annotations

import logging
import shutil
import socket
import time
from typing import Any

from t3ar.logs import REQUEST_ID, request_id_from
from t3ar_services.common.job_contract import (
    LINEAGE_FILE,
    MODEL_FILE,
    REPORT_FILE,
    WITHDRAWN_KEY,
    JobCanceledError,
    JobSpec,
    artifacts_dir,
    resolve_inside,
    write_json_atomic,
)
from t3ar_services.worker.settings import WorkerSettings

log = logging.getLogger(__name__)


def run_adapt_job(spec: dict[str, Any]) -> dict[str, Any]:
    """Adapt the base model to the target with the job's AdaptConfig; write the checkpoint atomically."""
    from rq import get_current_job

    settings = WorkerSettings()
    job_spec = JobSpec.model_validate(spec)
    job = get_current_job()
    connection = job.connection if job is not None else None
    from t3ar_services.worker.progress import Progress

    progress = Progress(job, connection, job_spec.job_id, interval=settings.progress_interval,
                        epochs=int(job_spec.config.get("epochs", 0)) or None)
    REQUEST_ID.set(request_id_from(job_spec.request_id or job_spec.job_id))  # this work horse runs one job
    log.info("job %s started (model %s, method %s)", job_spec.job_id, job_spec.model_id,
             job_spec.config.get("method", "t3ar"))
    try:
        return _run(job_spec, settings, progress, connection)
    except JobCanceledError:
        log.info("job %s canceled", job_spec.job_id)
        raise
    except Exception as e:
        progress.meta["error"] = _message(e)
        progress.phase("failed")
        raise


def _message(e: BaseException) -> str:
    from t3ar.errors import T3arError, without_paths

    text = without_paths(str(e).strip().splitlines()[0]) if str(e).strip() else type(e).__name__
    return text if isinstance(e, T3arError) else f"{type(e).__name__}: {text}"


def _run(spec: JobSpec, settings: WorkerSettings, progress: Any, connection: Any) -> dict[str, Any]:
    import torch

    from t3ar.clients.retriever import RetrieverClient
    from t3ar.data.target import read_target
    from t3ar.device import resolve_device
    from t3ar.method.config import AdaptConfig
    from t3ar.models.checkpoint import load_checkpoint, save_checkpoint
    from t3ar.pipeline import run_adaptation
    from t3ar_services.worker.cache import CachedRetrieverProvider, ImageCache

    t0 = time.perf_counter()
    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    config = AdaptConfig.model_validate(spec.config)
    device = resolve_device(settings.device)
    progress.phase("loading", device=str(device))
    model, info = load_checkpoint(resolve_inside(settings.data_dir, spec.model_path), device=device)
    target = read_target(resolve_inside(settings.data_dir, spec.target_dir), strict=True)

    provider = None
    client = None
    if config.uses_retrieval:
        cache = ImageCache(settings.image_cache_dir(), settings.cache_max_bytes)
        if connection is not None:
            withdrawn = [m.decode() if isinstance(m, bytes) else str(m) for m in connection.smembers(WITHDRAWN_KEY)]
            if n := cache.forget(withdrawn):
                log.info("dropped %d withdrawn pool image(s) from the cache", n)
        token = settings.retriever_token.get_secret_value() if settings.retriever_token else None
        client = RetrieverClient(settings.retriever_url, token, timeout=settings.retriever_timeout,
                                 retries=settings.retriever_retries)
        provider = CachedRetrieverProvider(client, cache, checkpoint=progress.check_cancel)
        progress.phase("retrieving", k=config.k, r=config.r)
    try:
        outcome = run_adaptation(model, info, target, config, provider=provider, device=device,
                                 on_step=progress.step)
    finally:
        if client is not None:
            client.close()
    progress.check_cancel(force=True)
    progress.phase("saving")

    res = outcome.result
    metrics = outcome.checkpoint_metrics()  # the same keys as a checkpoint made by `t3ar adapt`
    out_dir = artifacts_dir(settings.data_dir, spec.job_id)
    if out_dir.exists():  # a retried job starts from scratch; lineage.json must not outlive its checkpoint
        shutil.rmtree(out_dir)
    sha = save_checkpoint(out_dir / MODEL_FILE, model, info.spec, adapt_config=config.model_dump(),
                          lineage=outcome.lineage, metrics=metrics)
    report = _report(spec, config, outcome, metrics, sha, str(device), provider, time.perf_counter() - t0)
    write_json_atomic(out_dir / REPORT_FILE, report)
    lineage = {"job_id": spec.job_id, "model_id": spec.model_id, "parent_id": spec.parent_id,
               "checkpoint_sha256": sha, **outcome.lineage.model_dump(mode="json")}
    write_json_atomic(out_dir / LINEAGE_FILE, lineage)  # last: its presence marks the job's artifacts complete
    summary = {"checkpoint_sha256": sha, "pool_ids_used": len(outcome.lineage.pool_ids), "steps": res.steps,
               "seconds_adapt": metrics["seconds_adapt"], "seconds": round(time.perf_counter() - t0, 3)}
    if "after" in metrics:
        summary["accuracy_before"] = metrics["before"]["top1"]
        summary["accuracy_after"] = metrics["after"]["top1"]
    progress.done(**summary)
    return summary


def _brief_eval(ev: dict[str, Any] | None) -> dict[str, Any] | None:
    if ev is None:
        return None
    return {k: ev[k] for k in ("top1", "mean_class_accuracy", "n") if k in ev} | {
        "per_class": ev.get("per_class", {})}


def _report(spec: JobSpec, config: Any, outcome: Any, metrics: dict[str, Any], sha: str, device: str,
            provider: Any, seconds: float) -> dict[str, Any]:
    res = outcome.result
    history = res.history
    per_epoch: dict[int, list[Any]] = {}
    for s in history:
        per_epoch.setdefault(s.epoch, []).append(s)
    epochs = [{"epoch": e, "loss": sum(s.loss for s in ss) / len(ss),
               "loss_ce": sum(s.loss_ce for s in ss) / len(ss),
               "loss_contrastive": sum(s.loss_contrastive for s in ss) / len(ss),
               "pl_change_rate": ss[-1].pl_change_rate} for e, ss in sorted(per_epoch.items())]
    report: dict[str, Any] = {
        "job_id": spec.job_id, "model_id": spec.model_id, "parent_id": spec.parent_id,
        "method": config.method, "mode": config.mode, "config": config.model_dump(),
        "target_size": outcome.lineage.target_size, "checkpoint_sha256": sha,
        "pool_ids_used": len(outcome.lineage.pool_ids), "retriever": outcome.lineage.retriever,
        "device": device, "worker_host": socket.gethostname(), "seconds_total": round(seconds, 3),
        "metrics": {k: v for k, v in metrics.items() if k not in ("before", "after")},
        "epochs": epochs, "accuracy": None,
    }
    if provider is not None:
        report["image_cache"] = {"hits": provider.hits, "misses": provider.misses}
    if "after" in metrics:
        report["accuracy"] = {"before": _brief_eval(metrics["before"]), "after": _brief_eval(metrics["after"]),
                              "labels_used_for_training": config.mode == "train"}
    return report
