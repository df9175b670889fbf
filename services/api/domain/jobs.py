"""Jobs: submit (validated before enqueueing), readapt, cancel, list, describe, and a finished job's report and
checkpoint. Blocking work (extraction, image decoding, Redis): callers run these off the event loop (FastAPI's
thread pool for sync routes, ``run_in_threadpool`` in the console)."""

from __future__ import annotations

import datetime as dt
import json
import logging
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from pydantic import ValidationError

from t3ar.acceptance_options import AcceptanceOptions, candidate_config, candidate_names, parse_options
from t3ar.errors import InvalidInputError, T3arError
from t3ar.method.config import AdaptConfig, error_lines
from t3ar_services.api import schemas as s
from t3ar_services.api.deps import ApiState
from t3ar_services.api.domain import Links
from t3ar_services.api.errors import ConflictError, NotFoundError, classify
from t3ar_services.api.holdout import HOLDOUT_DIR, holdout_of, prepare_holdout
from t3ar_services.api.jobs import JobState, artifact, require_job
from t3ar_services.api.registry import require_file, require_model
from t3ar_services.api.store import JobRow, ModelRow
from t3ar_services.api.transfer import target_tar
from t3ar_services.api.uploads import (
    Subsample,
    check_job_size,
    discard,
    parse_config,
    prepare_target,
    read_subsample,
    save_upload,
    sent_name,
)
from t3ar_services.common.job_contract import LINEAGE_FILE, MODEL_FILE, REPORT_FILE, new_job_secret

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TargetUpload:
    """A submission: the target archive (a readable binary stream and the name the client gave it), the base
    model, the ``config`` form field as sent (a JSON object of AdaptConfig fields) and the two switches."""

    archive: BinaryIO
    filename: str | None
    model_id: str
    config: str = "{}"
    skip_bad_images: bool = False
    contribute: bool = False
    # the acceptance holdout (a readable binary stream and its name) and the job-level options that go with it
    holdout: BinaryIO | None = None
    holdout_filename: str | None = None
    candidates: str = ""
    require_gain: bool = False
    winner_rule: str = ""
    # the MLflow model registry (T3AR_MLFLOW_TRACKING_URI): the registered model's name (in the team's namespace)
    # and the one alias the finished job's version gets (none unless asked)
    register_as: str = ""
    register_alias: str = ""


@dataclass(frozen=True)
class Accepted:
    """An enqueued job: its record, the config it was enqueued with (the one validated), what was skipped on the
    way, and whether its target joins the pool."""

    row: JobRow
    config: AdaptConfig
    warnings: list[str] = field(default_factory=list)
    contribute: bool = False


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def _check_pool(state: ApiState, config: AdaptConfig) -> None:
    """Retrieval methods need at least k pool items; say so now rather than fail in the worker."""
    retrieval = config.retrieval_options
    if retrieval is None:
        return
    count = state.retriever.stats().count
    if count < retrieval.k:
        raise InvalidInputError(f"the pool has {count} item(s) but method {config.method} retrieves "
                                f"k={retrieval.k} per image: ingest more (t3ar pool ingest) or lower k")


def _check_size(state: ApiState, config: AdaptConfig, n_kept: int, model: ModelRow) -> None:
    """The operator's per-job caps (steps, memory), with the base model's input size, feature width and head."""
    check_job_size(state.settings, config, n_kept, model.image_size, model.feature_dim, len(model.classes))


def _enqueue(state: ApiState, row: JobRow, config: AdaptConfig, secret: str, model: ModelRow, subsample: Subsample,
             holdout: tuple[str, AcceptanceOptions] | None) -> None:
    data_dir = state.settings.data_dir
    state.jobs.enqueue(row, config, model.sha256, target_tar(data_dir, row.target_dir), secret, subsample,
                       holdout=target_tar(data_dir, holdout[0]) if holdout else None,
                       acceptance=holdout[1] if holdout else None)
    state.metrics.jobs_submitted.labels(config.method, "readapt" if row.parent_id else "adapt").inc()


def _acceptance_options(upload: TargetUpload) -> AcceptanceOptions | None:
    """The job's acceptance options when it sends a holdout; options without a holdout are refused (422)."""
    options = parse_options(upload.candidates, upload.require_gain, upload.winner_rule or None)
    if upload.holdout is None:
        if options != AcceptanceOptions():
            raise InvalidInputError("candidates, require_gain and winner_rule decide on a holdout: send a holdout "
                                    "part (class folders, or images and labels.csv, as a zip or tar)")
        return None
    return options


def _check_steps(state: ApiState, configs: list[AdaptConfig], n_kept: int) -> None:
    """Every candidate runs in the one job: their optimiser steps together stay under the per-job cap."""
    from t3ar.jobsize import planned_steps

    if len(configs) < 2:
        return
    steps = sum(planned_steps(c, n_kept) for c in configs)
    if steps > state.settings.max_job_steps:
        raise InvalidInputError(f"the job's {len(configs)} candidates would run {steps} optimiser steps together; this "
                                f"API allows {state.settings.max_job_steps} per job (T3AR_API_MAX_JOB_STEPS): lower "
                                "epochs or list fewer candidates")


def _registration(state: ApiState, register_as: str, alias: str, team: str | None,
                  model: ModelRow) -> tuple[str, str | None] | None:
    """The registered model's name and the alias a job asked for (checked), or None when registration is off
    (asking for either there is refused: 422)."""
    from t3ar_services.api.modelreg.settings import check_alias, check_name, registered_name

    if not state.registrar.enabled:
        if register_as or alias:
            raise InvalidInputError("this API registers no models (T3AR_MLFLOW_TRACKING_URI is not set): leave out "
                                    "register_as and register_alias")
        return None
    name = registered_name(register_as=check_name(register_as) if register_as else None,
                           base_model_name=model.name, team=team)
    return name, check_alias(alias) if alias else None


def submit(state: ApiState, upload: TargetUpload, owner: tuple[str, str] | None = None,
           model: ModelRow | None = None) -> Accepted:
    """Validate the target (safe extraction, every image readable, labels known to the model, options valid,
    pool large enough) and enqueue an adaptation job. Nothing is enqueued, and nothing stays on disk, when any
    check fails (a :class:`~t3ar.errors.T3arError`, counted as a rejected upload). ``owner``: the (team, key id)
    the job belongs to, recorded before it is enqueued. ``model``: the base model's record when the caller looked
    it up already (its access check), else it is looked up here."""
    settings = state.settings
    job_id = uuid.uuid4().hex
    job_dir = settings.data_dir / "jobs" / job_id
    state.submissions.add(job_id)  # before its folder exists: the leftover sweep leaves it alone
    try:
        model = require_model(state.store, settings, upload.model_id) if model is None \
            else require_file(settings, model)
        draft = parse_config(upload.config)
        registration = _registration(state, upload.register_as, upload.register_alias,
                                     owner[0] if owner is not None else None, model)
        archive = job_dir / "upload"
        save_upload(upload.archive, archive, settings.max_upload_bytes, "the target archive",
                    "T3AR_API_MAX_UPLOAD_BYTES")
        prepared, cfg = prepare_target(archive, job_dir, settings, model.classes, draft,
                                       skip_bad_images=upload.skip_bad_images,
                                       sent=sent_name(upload.filename, "archive"))
        archive.unlink()
        options = _acceptance_options(upload)
        configs, digests, holdout = [cfg], {}, None
        if options is not None:
            assert upload.holdout is not None
            digests = prepare_holdout(upload.holdout, sent_name(upload.holdout_filename, "holdout"), job_dir,
                                      prepared.target_dir, settings, model.classes, options)
            configs = [candidate_config(cfg, name) for name in candidate_names(options, cfg)]
            holdout = ((job_dir / HOLDOUT_DIR).relative_to(settings.data_dir).as_posix(), options)
        assert prepared.subsample is not None
        for c in configs:
            _check_size(state, c, prepared.n_kept, model)
            _check_pool(state, c)
        _check_steps(state, configs, prepared.n_kept)
        if options is not None and any(c.uses_retrieval for c in configs):
            from t3ar.data.holdout import refuse_pooled

            refuse_pooled(digests, state.retriever.exists(sorted(set(digests.values()))))
        secret, digest = new_job_secret()
        row = JobRow(id=job_id, model_id=model.id, parent_id=None, created_at=_now(), config=cfg.model_dump(),
                     target_dir=prepared.target_dir.relative_to(settings.data_dir).as_posix(),
                     n_images=prepared.n_images, labelled=prepared.labelled, skipped=len(prepared.skipped),
                     secret_sha256=digest)
        state.store.add_job(row)
        if owner is not None:
            state.store.add_owner("job", job_id, *owner)
        if upload.contribute:
            state.contributor.records.request(job_id)  # before enqueueing: a quick job finds it
        if registration is not None:
            state.registrar.request(job_id, *registration)
        try:
            _enqueue(state, row, cfg, secret, model, prepared.subsample, holdout)
        except BaseException:
            state.contributor.records.forget(job_id)
            state.registrar.records.forget(job_id)
            state.store.delete_job(job_id)
            raise
        return Accepted(row, cfg, [f"skipped {rel}: {why}" for rel, why in prepared.skipped[:20]],
                        upload.contribute)
    except T3arError as e:
        state.metrics.uploads_rejected.labels(classify(e)[1]).inc()
        discard(job_dir)
        raise
    except BaseException:
        discard(job_dir)
        raise
    finally:
        state.submissions.discard(job_id)  # after its record, or after its folder is gone


def readapt(state: ApiState, job_id: str, by: str = "") -> Accepted:
    """Re-run a job with the same base model, target and config against the *current* pool (so without withdrawn
    items); the new job records ``parent_id`` and belongs to the team of the job it re-runs (``by``: the key id
    that asked). 409 when the target is no longer stored, or when its stored config no longer validates (an option
    this version removed or no longer lets its method take)."""
    orig = require_job(state.store, job_id)
    model = require_model(state.store, state.settings, orig.model_id)
    if not (state.settings.data_dir / orig.target_dir).is_dir():
        raise ConflictError(f"the target images of job {job_id} are no longer stored; submit them again")
    try:
        cfg = AdaptConfig.model_validate(orig.config)
    except ValidationError as e:
        raise ConflictError(f"job {job_id}'s config no longer validates in this version (an option removed, or one "
                            f"its method {orig.config.get('method', '?')} does not take): {'; '.join(error_lines(e))}"
                            "; submit it again with today's options (GET /config-schema lists them)") from None
    found = holdout_of(state.settings.data_dir, orig.target_dir)  # the parent's holdout, next to the target
    configs = [candidate_config(cfg, name) for name in candidate_names(found[1], cfg)] if found else [cfg]
    subsample = read_subsample(state.settings.data_dir, orig.target_dir)  # the same target and config
    n_kept = len(subsample.rows)
    for c in configs:
        _check_size(state, c, n_kept, model)  # the caps may have changed
        _check_pool(state, c)
    _check_steps(state, configs, n_kept)
    secret, digest = new_job_secret()
    row = JobRow(id=uuid.uuid4().hex, model_id=orig.model_id, parent_id=orig.id, created_at=_now(),
                 config=orig.config, target_dir=orig.target_dir, n_images=orig.n_images, labelled=orig.labelled,
                 skipped=orig.skipped, secret_sha256=digest)
    state.store.add_job(row)
    teams = sorted(state.store.teams_of("job", orig.id))
    for team in teams:
        state.store.add_owner("job", row.id, team, by)
    if state.registrar.enabled:  # under the name the re-run job registered as; no alias (none was asked for)
        parent = state.registrar.records.get(orig.id)
        state.registrar.request(row.id, parent.name if parent is not None else _registration(
            state, "", "", teams[0] if teams else None, model)[0], None)  # type: ignore[index]
    try:
        _enqueue(state, row, cfg, secret, model, subsample, found)
    except BaseException:
        state.registrar.records.forget(row.id)
        state.store.delete_job(row.id)
        raise
    return Accepted(row, cfg)


def cancel(state: ApiState, job_id: str) -> str:
    """``canceled`` (a queued job, at once) or ``canceling`` (a running one stops at its next step)."""
    return state.jobs.cancel(require_job(state.store, job_id))


def job_view(state: ApiState, links: Links, row: JobRow, st: JobState) -> s.JobOut:
    finished = st.status == "finished"
    return s.JobOut(
        id=row.id, url=links("get_job", row.id), status=st.status,  # type: ignore[arg-type]
        model_id=row.model_id, parent_id=row.parent_id, created_at=row.created_at,
        enqueued_at=st.enqueued_at, started_at=st.started_at, ended_at=st.ended_at, queue_position=st.position,
        worker=st.worker, config=s.job_config(row.config),
        target=s.TargetInfo(images=row.n_images, labelled=row.labelled, skipped=row.skipped,
                            adapted=_adapted(state, row)),
        progress=st.progress, error=st.error, result=st.result,
        checkpoint_url=links("get_checkpoint", row.id) if finished else None,
        report_url=links("get_report", row.id) if finished else None,
        exports=exports_view(state, links, row.id) if finished else {},
        contribution=s.Contribution(**state.contributor.describe(row.id, st.status)),
        neighbours_from_contributions=[s.NeighbourSource(**n) for n in state.contributor.neighbours(row.id)]
        if finished else [],
        acceptance=st.acceptance,
        registration=registration_view(state, row.id),
    )


def _adapted(state: ApiState, row: JobRow) -> int | None:
    """How many target images the job adapts to (its recorded subsample), None when the record cannot be read."""
    try:
        return len(read_subsample(state.settings.data_dir, row.target_dir).rows)
    except ConflictError:
        return None


def retry_registration(state: ApiState, job_id: str) -> s.Registration:
    """A failed registration pending again (see :meth:`Registrar.retry`); 404 / 409 as the route says."""
    require_job(state.store, job_id)
    reg = state.registrar.records.get(job_id)
    if reg is None:
        raise NotFoundError(f"job {job_id} has no MLflow registration (T3AR_MLFLOW_TRACKING_URI was not set when "
                            "it was submitted)")
    if not state.registrar.retry(job_id):
        raise ConflictError(f"job {job_id}'s registration is {reg.state}, not failed: nothing to retry")
    view = registration_view(state, job_id)
    assert view is not None
    return view


def registration_view(state: ApiState, job_id: str) -> s.Registration | None:
    """The job's MLflow registration as the API shows it (None: registration is off, or the job predates it)."""
    from t3ar_services.api.modelreg.view import view

    return view(state.registrar, job_id)


def exports_view(state: ApiState, links: Links, job_id: str) -> dict[str, s.ExportOut]:
    """The serving formats made of the job's checkpoint so far (:mod:`.exports`), by format."""
    base = links("get_checkpoint", job_id)
    return {fmt: s.ExportOut(format=e.format, url=f"{base}?format={fmt}", sha256=e.sha256,  # type: ignore[arg-type]
                             size=e.size, created_at=e.created_at, parity=s.ExportParity.model_validate(e.parity))
            for fmt, e in state.store.exports_of(job_id).items()}


def list_jobs(state: ApiState, links: Links, limit: int = 50, before: str | None = None,
              team: str | None = None) -> s.JobList:
    """Jobs (with ``team``: that team's), newest first; the next page starts ``before`` this page's
    ``next_before``."""
    rows = state.store.list_jobs(limit=limit, before=before, team=team)
    rq_jobs = state.jobs.fetch_many([r.id for r in rows])
    out = [job_view(state, links, r, state.jobs.state(r, j)) for r, j in zip(rows, rq_jobs, strict=True)]
    return s.JobList(jobs=out, total=state.store.count_jobs(team),
                     next_before=rows[-1].id if len(rows) == limit else None)


def describe(state: ApiState, links: Links, job_id: str) -> s.JobOut:
    """Status, progress, timings, and the error when failed (404 for an unknown job); with what happened since
    (:func:`supersession`): how many of its retrieved pool items were withdrawn, and its re-runs."""
    row = require_job(state.store, job_id)
    st = state.jobs.state(row)
    since = supersession(state, job_id, finished=st.status == "finished")
    return job_view(state, links, row, st).model_copy(update={
        "used_withdrawn": len(since.withdrawn) if st.status == "finished" else None,
        "withdrawn_pool_ids": since.withdrawn[:100] if st.status == "finished" else None,
        "superseded_by": [r.job_id for r in since.reruns]})


@dataclass(frozen=True)
class Rerun:
    """A job that re-runs another (a readapt): its id, status and when it was made."""

    job_id: str
    status: str
    created_at: str


@dataclass(frozen=True)
class Supersession:
    """What happened to a job since it ran: ``withdrawn``, the pool items it retrieved that were withdrawn since
    (its checkpoint still carries what it learned from them: stale), and ``reruns``, its readapts, newest first."""

    withdrawn: list[str]
    reruns: list[Rerun]


def supersession(state: ApiState, job_id: str, *, finished: bool) -> Supersession:
    """:class:`Supersession` of a job (``finished``: whether it finished; only a finished job has a lineage)."""
    used = retrieved(state, job_id) if finished else []
    gone = state.contributor.records.withdrawal_reasons(used) if used else {}
    reruns = [Rerun(r.id, state.jobs.state(r).status, r.created_at) for r in state.store.reruns_of(job_id)]
    return Supersession([p for p in used if p in gone], reruns)


def finished_artifact(state: ApiState, job_id: str, name: str) -> Path:
    """The path of a finished job's artifact ``name``: 409 while the job is not finished, 404 when missing."""
    row = require_job(state.store, job_id)
    st = state.jobs.state(row)
    if st.status != "finished":
        raise ConflictError(f"job {job_id} is {st.status}, not finished: no {name} yet"
                            + (f" ({st.error})" if st.error else ""))
    path = artifact(state.settings, job_id, name)
    if not path.is_file():
        raise NotFoundError(f"job {job_id} finished but its {name} is missing from the artifact store")
    return path


def checkpoint(state: ApiState, job_id: str) -> Path:
    """The adapted checkpoint's file (t3ar format)."""
    return finished_artifact(state, job_id, MODEL_FILE)


def report(state: ApiState, job_id: str) -> s.ReportOut:
    """The finished job's report, with its contribution as it stands now (not at finishing) and the earlier
    contributions its retrieved neighbours came from. The report was validated when it arrived: one that does
    not read now is a damaged file (409)."""
    path = finished_artifact(state, job_id, REPORT_FILE)
    extra = {"contribution": state.contributor.describe(job_id, "finished"),
             "neighbours_from_contributions": state.contributor.neighbours(job_id)}
    try:
        return s.ReportOut.model_validate({**json.loads(path.read_text()), **extra})
    except ValueError:  # not JSON, or not the contract's report
        raise ConflictError(f"job {job_id}'s stored report does not fit the job contract") from None


def retrieved(state: ApiState, job_id: str) -> list[str]:
    """The pool ids a finished job retrieved (its stored lineage); empty when there is none to read."""
    path = artifact(state.settings, job_id, LINEAGE_FILE)
    try:
        return [str(p) for p in json.loads(path.read_text()).get("pool_ids") or []]
    except (OSError, ValueError):
        return []
