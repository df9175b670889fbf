"""The rq job: :func:`run_adapt_job` (a top-level function with one JSON argument, see
:class:`~t3ar_services.common.job_contract.JobSpec`).

It runs in the work-horse process; every torch op runs here, never in the forking worker parent (rq forks a
work horse per job, and a child forked after the parent ran a torch op can deadlock). torch and the core are
imported inside the function: the parent has usually imported them already (:mod:`.preload`), so that costs
nothing, and a parent with ``T3AR_WORKER_PRELOAD=false`` stays free of torch.

Inputs and outputs travel over HTTP (:mod:`t3ar_services.worker.transfer`): the base checkpoint (cached by
sha256 in the worker's data dir) and the target tar are downloaded and checked against the digests the job
carries; the target is extracted into ``<data_dir>/work/<job_id>/``, which is removed when the job ends. On
success the adapted checkpoint (with its AdaptConfig and lineage inside) is uploaded to the API, then its
report and lineage, which finishes the job there; the return value is a small JSON summary. On error
the job's meta (:class:`~t3ar_services.common.job_contract.JobMeta`) holds a one-line ``error`` (what the API
shows) and the exception is re-raised so rq marks the job failed. On cancellation its ``canceled`` is true.
"""

from __future__ import annotations

import json
import logging
import shutil
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from t3ar.errors import T3arError
from t3ar.logs import REQUEST_ID, request_id_from
from t3ar.method.config import AdaptConfig
from t3ar_services.common.job_contract import (
    BASE_MODEL_ROUTE,
    HOLDOUT_ROUTE,
    MAX_LABELLED_LISTED,
    MODEL_FILE,
    TARGET_ROUTE,
    AcceptanceRecord,
    Accuracy,
    CacheStats,
    EpochPoint,
    EvalBrief,
    JobCanceledError,
    JobReport,
    JobResult,
    JobSpec,
    LabelledNeighbour,
    NeighbourQualityRecord,
    NeighbourRow,
    StepPoint,
    Transfer,
)
from t3ar_services.common.text import readable
from t3ar_services.worker import phases
from t3ar_services.worker.settings import WorkerSettings

log = logging.getLogger(__name__)


def run_adapt_job(spec: dict[str, Any]) -> dict[str, Any]:
    """Adapt the base model to the target with the job's AdaptConfig; upload the checkpoint and report."""
    from rq import get_current_job

    from t3ar_services.worker.progress import JobNoLongerStartedError, Progress

    settings = WorkerSettings()
    job = get_current_job()
    connection = job.connection if job is not None else None
    job_id = str(spec.get("job_id") or (job.id if job is not None else "unknown"))
    progress = Progress(job, connection, job_id, interval=settings.progress_interval)
    queue_wait = phases.queue_seconds(getattr(job, "enqueued_at", None), phases.forked_at)
    try:
        # the spec, and with it the config, validated once, inside the job's error handling: a spec or config the
        # worker refuses is the job's one-line error in its meta
        job_spec = JobSpec.model_validate(spec)
        config = job_spec.config
        REQUEST_ID.set(request_id_from(job_spec.request_id or job_spec.job_id))  # this work horse runs one job
        log.info("job %s started (model %s, method %s)", job_spec.job_id, job_spec.model_id, config.method)
        progress.phase("starting", epochs=getattr(config, "epochs", None))
        result = _run(job_spec, config, settings, progress, connection, queue_wait)
        return result.model_dump(mode="json", exclude_none=True)  # the job's return value: JSON, unset fields out
    except JobCanceledError:
        log.info("job %s canceled", job_id)
        raise
    except JobNoLongerStartedError:
        log.warning("job %s ended elsewhere while it ran here; stopped", job_id)
        raise
    except Exception as e:
        progress.fail(_message(e))
        raise


def _message(e: BaseException) -> str:
    from t3ar.errors import T3arError, without_paths

    text = without_paths(str(e).strip().splitlines()[0]) if str(e).strip() else type(e).__name__
    return text if isinstance(e, T3arError) else f"{type(e).__name__}: {text}"


def _run(spec: JobSpec, config: AdaptConfig, settings: WorkerSettings, progress: Any, connection: Any,
         queue_wait: float | None = None) -> JobResult:
    import torch

    import t3ar.pipeline  # noqa: F401  (without a preloading parent: counted as the work horse's imports)
    from t3ar.device import resolve_device

    t0 = time.perf_counter()
    # the phase table starts at the fork (the worker parent's mark) when there is one, else here
    since_fork = max(0.0, time.time() - phases.forked_at) if phases.forked_at is not None else 0.0
    measured: dict[str, float] = {"horse_start_imports": since_fork}
    t0 -= since_fork
    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    device = resolve_device(settings.device)
    progress.phase("loading", device=str(device))
    work = settings.work_dir() / spec.job_id
    shutil.rmtree(work, ignore_errors=True)  # a retried job starts from scratch
    work.mkdir(parents=True)
    token = settings.api_token.get_secret_value() if settings.api_token else None
    from t3ar_services.worker.transfer import WorkerApiClient

    api = WorkerApiClient(settings.api_url, token, timeout=settings.api_timeout, retries=settings.api_retries)
    api.bind_job(spec.job_secret)
    try:
        t = time.perf_counter()
        model_file, target_dir, transfer = _fetch_inputs(spec, settings, api, work)
        measured["inputs_fetched"] = time.perf_counter() - t
        progress.check_cancel(force=True)
        return _adapt(spec, settings, config, device, progress, connection, api, model_file, target_dir, work,
                      transfer, t0, measured, queue_wait)
    finally:
        api.close()
        shutil.rmtree(work, ignore_errors=True)


def _fetch_inputs(spec: JobSpec, settings: WorkerSettings, api: Any, work: Path) -> tuple[Path, Path, dict[str, Any]]:
    """Download (or take from the cache) the base model and download and extract the target, each checked
    against the job's sha256."""
    from t3ar.data.archive import ExtractLimits, safe_extract
    from t3ar_services.worker.cache import ModelCache

    t = time.perf_counter()
    cache = ModelCache(settings.model_cache_dir(), settings.model_cache_max_bytes)
    model_file, cached = cache.get(
        spec.model_sha256, scratch=work,
        fetch=lambda dest: api.download(api.route(BASE_MODEL_ROUTE, spec.job_id), dest, spec.model_sha256,
                                        what=f"the base model {spec.model_id}"))
    tar = work / "target.tar"
    n = api.download(api.route(TARGET_ROUTE, spec.job_id), tar, spec.target_sha256, what="the target")
    size = max(n, 1)  # an uncompressed tar unpacks to less than itself
    target_dir = safe_extract(tar, work / "target", ExtractLimits(max_files=max(1000, size // 512),
                                                                   max_total_bytes=size, max_file_bytes=size),
                              name="the target tar")
    tar.unlink()
    if spec.holdout_sha256 is not None:  # the acceptance holdout: extracted beside the target, never inside it
        htar = work / "holdout.tar"
        hn = max(api.download(api.route(HOLDOUT_ROUTE, spec.job_id), htar, spec.holdout_sha256, what="the holdout"), 1)
        safe_extract(htar, work / "holdout", ExtractLimits(max_files=max(1000, hn // 512), max_total_bytes=hn,
                                                            max_file_bytes=hn), name="the holdout tar")
        htar.unlink()
    transfer = {"base_model_cached": cached, "target_bytes": n, "seconds_download": round(time.perf_counter() - t, 3)}
    log.info("job %s: inputs fetched (base model %s, target %d bytes) in %.2fs", spec.job_id,
             "from the cache" if cached else "downloaded", n, transfer["seconds_download"])
    return model_file, target_dir, transfer


def _adapt(spec: JobSpec, settings: WorkerSettings, config: AdaptConfig, device: Any, progress: Any, connection: Any,
           api: Any, model_file: Path, target_dir: Path, work: Path, transfer: dict[str, Any],
           t0: float, measured: dict[str, float], queue_wait: float | None) -> JobResult:
    from t3ar.clients.retriever import RetrieverClient
    from t3ar.data.target import read_target
    from t3ar.models.checkpoint import load_checkpoint, save_checkpoint
    from t3ar.pipeline import run_adaptation
    from t3ar_services.worker.cache import CachedRetrieverProvider, ImageCache

    t = time.perf_counter()
    model, info = load_checkpoint(model_file, device=device)
    target = read_target(target_dir, strict=True)
    from t3ar_services.worker.memory import check_job_memory

    rows = spec.subsample_rows  # drawn once, at submission
    if max(rows) >= len(target) or min(rows) < 0:
        raise T3arError(f"the job's subsample names image {max(rows)} of a target of {len(target)}: the target it "
                        "fetched is not the one the job was submitted with")
    kept = len(rows)
    configs = [config]
    if spec.acceptance is not None:  # every candidate runs here, one after the other
        from t3ar.acceptance_options import candidate_config, candidate_names

        configs = [candidate_config(config, name) for name in candidate_names(spec.acceptance, config)]
    for c in configs:
        check_job_memory(c, kept, info.spec.image_size, model.feature_dim, info.spec.num_classes, device)
    measured["model_loaded"] = time.perf_counter() - t

    provider = None
    client = None
    if any(c.uses_retrieval for c in configs):
        cache = ImageCache(settings.image_cache_dir(), settings.cache_max_bytes)
        if connection is not None and (n := cache.forget_withdrawn(connection)):
            log.info("dropped %d withdrawn pool image(s) from the cache", n)
        token = settings.retriever_token.get_secret_value() if settings.retriever_token else None
        client = RetrieverClient(settings.retriever_url, token, timeout=settings.retriever_timeout,
                                 retries=settings.retriever_retries)
        provider = CachedRetrieverProvider(client, cache, checkpoint=progress.check_cancel)
        progress.phase("retrieving")
    acceptance: AcceptanceRecord | None = None
    try:
        if spec.acceptance is not None:
            outcome, config, acceptance, phase_seconds = _candidates(spec, config, model, info, target, provider,
                                                                     device, progress, work / "holdout")
        else:
            outcome = run_adaptation(model, info, target, config, provider=provider, device=device,
                                     on_step=progress.step, rows=rows)
            phase_seconds = outcome.phase_seconds
    finally:
        if client is not None:
            client.close()
    progress.check_cancel(force=True)
    progress.phase("saving")

    res = outcome.result
    metrics = outcome.checkpoint_metrics()  # the same keys as a checkpoint made by `t3ar adapt`
    if acceptance is not None:
        # in the checkpoint, and so in its ONNX / safetensors metadata
        metrics["acceptance"] = acceptance.model_dump(mode="json")
    measured.update(phase_seconds)
    t = time.perf_counter()
    sha = save_checkpoint(work / MODEL_FILE, model, info.spec, adapt_config=config.model_dump(),
                          lineage=outcome.lineage, metrics=metrics)
    t_up = time.perf_counter()
    measured["checkpoint_written"] = t_up - t
    api.upload_checkpoint(spec.job_id, work / MODEL_FILE, sha)
    transfer["seconds_upload_checkpoint"] = round(time.perf_counter() - t_up, 3)
    measured["checkpoint_uploaded"] = time.perf_counter() - t_up
    # the worker total ends here: the report cannot hold the time of its own upload (one small PUT)
    total = time.perf_counter() - t0
    report = _report(spec, config, outcome, metrics, sha, str(device), provider, total, transfer)
    report.acceptance = acceptance
    report.phases = phases.build_phases(measured, total, queue_wait=queue_wait)
    lineage = {"job_id": spec.job_id, "model_id": spec.model_id, "parent_id": spec.parent_id,
               "checkpoint_sha256": sha, **outcome.lineage.model_dump(mode="json")}
    # readable(): a diverged run's NaN loss is reported as null (the API refuses what JSON answers cannot hold)
    api.put_result(spec.job_id, readable(report.model_dump(mode="json")), lineage)  # finishes the job
    labelled = bool(report.labelled_neighbours_total)  # labelled neighbours: the first few (report: more)
    summary = JobResult(
        checkpoint_sha256=sha, pool_ids_used=len(outcome.lineage.pool_ids), steps=res.steps,
        seconds_adapt=metrics["seconds_adapt"], seconds=round(time.perf_counter() - t0, 3),
        labelled_neighbours_total=report.labelled_neighbours_total if labelled else None,
        labelled_neighbours=report.labelled_neighbours[:_SUMMARY_LABELLED] if labelled else None,
        labelled_per_label=labelled_per_label(outcome.labelled_neighbours) if labelled else None,  # all of them
        winner=acceptance.winner if acceptance is not None else None,  # the whole record: the job's meta
        accuracy_before=metrics["before"]["top1"] if "after" in metrics else None,
        accuracy_after=metrics["after"]["top1"] if "after" in metrics else None,
        neighbour_quality=report.neighbour_quality)  # GET /jobs/{id} and `t3ar jobs show` read it here
    progress.done(steps=res.steps, seconds_adapt=metrics["seconds_adapt"])
    return summary


class AcceptanceRefusedError(T3arError):
    """A job with ``require_gain`` whose candidates did not beat the base model on its holdout."""


def _candidates(spec: JobSpec, config: AdaptConfig, model: Any, info: Any, target: Any, provider: Any, device: Any,
                progress: Any, holdout_dir: Path) -> tuple[Any, AdaptConfig, AcceptanceRecord, dict[str, float]]:
    """Run the job's candidates on its holdout (t3ar.candidates); ``model`` ends with the winner's weights. Returns
    the winner's outcome and config, the acceptance record (also in the job's meta, where GET /jobs/{id} shows
    it) and the candidates' phases added up. With ``require_gain`` a base-model winner fails the job."""
    from t3ar.acceptance import gain_refusal
    from t3ar.candidates import run_candidates
    from t3ar.data.holdout import read_holdout

    options = spec.acceptance
    assert options is not None
    holdout = read_holdout(holdout_dir)

    def started(name: str, i: int, n: int) -> None:
        progress.phase("adapting" if name == config.method else "candidate", candidate=f"{name} ({i + 1}/{n})")

    done = run_candidates(model, info, target, config, options, holdout, provider=provider, device=device,
                          on_step=progress.step, on_candidate=started, rows=spec.subsample_rows)
    record = done.record(require_gain=options.require_gain)
    progress.meta.acceptance = record
    if options.require_gain and (why := gain_refusal(done.acceptance)) is not None:
        raise AcceptanceRefusedError(why)
    return done.winner.outcome, done.winner.config, record, done.phase_seconds()


def labelled_per_label(uses: Sequence[Any]) -> dict[str, int]:
    """How many of the labelled neighbours ``uses`` (:class:`t3ar.pipeline.LabelledUse`) carry each label."""
    counts: dict[str, int] = {}
    for u in uses:
        counts[u.label] = counts.get(u.label, 0) + 1
    return counts


def _brief_eval(ev: dict[str, Any] | None) -> EvalBrief | None:
    if ev is None:
        return None
    return EvalBrief.model_validate({k: ev[k] for k in ("top1", "mean_class_accuracy", "n") if k in ev} | {
        "per_class": ev.get("per_class", {})})


_MAX_STEP_POINTS = 500
_SUMMARY_LABELLED = 20  # labelled neighbours named in the job's result (the report lists up to MAX_LABELLED_LISTED)


def _report(spec: JobSpec, config: AdaptConfig, outcome: Any, metrics: dict[str, Any], sha: str, device: str,
            provider: Any, seconds: float, transfer: dict[str, Any]) -> JobReport:
    res = outcome.result
    history = res.history
    per_epoch: dict[int, list[Any]] = {}
    for s in history:
        per_epoch.setdefault(s.epoch, []).append(s)
    epochs = [EpochPoint(epoch=e, loss=sum(s.loss for s in ss) / len(ss), loss_ce=sum(s.loss_ce for s in ss) / len(ss),
                         loss_contrastive=sum(s.loss_contrastive for s in ss) / len(ss),
                         pl_change_rate=ss[-1].pl_change_rate) for e, ss in sorted(per_epoch.items())]
    accuracy = None
    if "after" in metrics:
        accuracy = Accuracy(before=_brief_eval(metrics["before"]), after=_brief_eval(metrics["after"]),
                            labels_used_for_training=config.mode == "train")
    return JobReport(
        job_id=spec.job_id, model_id=spec.model_id, parent_id=spec.parent_id,
        method=config.method, mode=config.mode, config=config.model_dump(mode="json"),
        target_size=outcome.lineage.target_size, checkpoint_sha256=sha,
        pool_ids_used=len(outcome.lineage.pool_ids), retriever=outcome.lineage.retriever,
        device=device, worker_host=socket.gethostname(), seconds_total=round(seconds, 3),
        metrics=json.loads(json.dumps({k: v for k, v in metrics.items() if k not in ("before", "after", "acceptance")},
                                      default=str)),
        epochs=epochs, accuracy=accuracy,
        # for charts (the web console): per step, thinned to at most _MAX_STEP_POINTS points
        step_history=[StepPoint(step=s.step, epoch=s.epoch, loss=s.loss, loss_ce=s.loss_ce,
                                loss_contrastive=s.loss_contrastive, pl_change_rate=s.pl_change_rate)
                      for s in history[::max(1, -(-len(history) // _MAX_STEP_POINTS))]],
        # what retrieval did: a sample of target images and the pool neighbours drawn for them, with scores
        neighbour_sample=[NeighbourRow.model_validate(n) for n in outcome.neighbour_sample],
        # the neighbours that served as labelled training data, the most used first
        labelled_neighbours=[LabelledNeighbour(pool_id=u.pool_id, label=u.label, uses=u.uses) for u in sorted(
            outcome.labelled_neighbours, key=lambda u: (-u.uses, u.pool_id))[:MAX_LABELLED_LISTED]],
        labelled_neighbours_total=len(outcome.labelled_neighbours),
        neighbour_quality=(NeighbourQualityRecord.model_validate(outcome.neighbour_quality)
                           if outcome.neighbour_quality is not None else None),
        image_cache=CacheStats(hits=provider.hits, misses=provider.misses) if provider is not None else None,
        transfer=Transfer.model_validate(transfer),
    )
