"""The adaptation API's answers as models: the API serves them (its OpenAPI schema is generated from them) and
:class:`~t3ar.clients.api.ApiClient` returns them, so the CLI reads typed fields.

They live in the library because the CLI reads them too (the library never imports the services); the API's
:mod:`t3ar_services.api.schemas` imports them from here.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from t3ar.clients.job_report import AcceptanceRecord, JobReport, LabelledNeighbour, NeighbourQualityRecord
from t3ar.method.config import AdaptConfig

log = logging.getLogger(__name__)

_M = TypeVar("_M", bound=BaseModel)


def read_leniently(model: type[_M], value: Mapping[str, Any], what: str) -> _M:
    """``value`` as ``model``, a field that does not fit left out (and logged, naming ``what``); the model's
    defaults where what is left still does not fit. How a job's answer reads what a worker wrote without failing
    on it (:meth:`JobResult.read`, and the services' ``JobMeta.read``)."""
    try:
        return model.model_validate(value)
    except ValidationError as e:
        bad = {err["loc"][0] for err in e.errors() if err["loc"]}
        log.warning("%s does not fit the contract; left out: %s", what, ", ".join(map(str, sorted(bad))))
        try:
            return model.model_validate({k: v for k, v in value.items() if k not in bad})
        except ValidationError:
            return model()


JobStatusName = Literal["queued", "started", "finished", "failed", "canceled"]


class Progress(BaseModel):
    """A job's progress as the worker running it last wrote it (throttled; phase changes go out at once)."""

    phase: str | None = Field(default=None, description="starting, loading, retrieving, adapting, saving, done")
    epoch: int | None = None
    epochs: int | None = None
    step: int | None = None
    total_steps: int | None = None
    loss: float | None = None
    loss_ce: float | None = None
    loss_contrastive: float | None = None
    pl_change_rate: float | None = Field(default=None, description="share of pseudo-labels that changed")
    lr: float | None = None
    candidate: str | None = Field(default=None, description="a job with a holdout: the candidate running, e.g. "
                                                            "'bn-adapt (2/3)'")
    device: str | None = None
    host: str | None = Field(default=None, description="machine running the job")
    pid: int | None = Field(default=None, description="process running the job")
    updated_at: str | None = None


class ReadyResponse(BaseModel):
    ready: bool
    redis: bool
    retriever: bool
    workers: int = Field(description="rq workers listening on the adaptation queue")
    detail: str | None = None


class ModelOut(BaseModel):
    id: str
    name: str
    sha256: str
    size: int
    arch: str
    image_size: int
    num_classes: int
    classes: list[str]
    uploaded_at: str


class ModelList(BaseModel):
    models: list[ModelOut]


class TargetInfo(BaseModel):
    images: int
    labelled: bool
    skipped: int = Field(description="unreadable files dropped (only with skip_bad_images=true)")
    adapted: int | None = Field(default=None, description="the images the job adapts to: its subsample of the "
                                                          "config's fraction (None when its record cannot be read)")


class Contribution(BaseModel):
    """A job's contribution of its target images to the pool (``contribute=true`` on POST /adapt)."""

    requested: bool
    status: Literal["not_requested", "waiting", "pending", "done", "none", "withdrawing", "withdrawn"] = Field(
        description="not_requested; waiting (the job has not finished); pending (finished, being added); done; "
                    "none (the job failed or was canceled: nothing contributed); withdrawing; withdrawn")
    source: str | None = Field(default=None, description="the pool source of its items: target:<job id>")
    images: int | None = Field(default=None, description="target images offered")
    added: int | None = Field(default=None, description="images that joined the pool")
    skipped_exact: int | None = Field(default=None, description="skipped: the same file (sha256) was in the pool")
    skipped_near: int | None = Field(default=None, description="skipped: R's near-duplicate of a pool item (cosine "
                                                               ">= the pool's duplicate_threshold)")
    rejected: int | None = None
    attempts: int | None = Field(default=None, description="failed attempts so far (retried)")
    error: str | None = None
    withdrawn_at: str | None = None
    withdrawn_items: int | None = None


class NeighbourSource(BaseModel):
    job_id: str | None = Field(description="the job whose contribution it is (null: another team's job, not named)")
    source: str
    items_used: int = Field(description="of its items, how many this job retrieved and used")


class ReportOut(JobReport):
    """A finished job's report as ``GET /jobs/{id}/report`` serves it: what the worker reported, and what the API
    knows now (not at finishing)."""

    contribution: Contribution = Field(description="whether this job's target joined the pool, and how it went")
    neighbours_from_contributions: list[NeighbourSource] = Field(
        default_factory=list, description="earlier jobs' contributions its retrieved neighbours came from")


class ExportParity(BaseModel):
    """The check an export passed before it was kept: the exported model against the checkpoint."""

    images: int
    images_source: str = Field(description="which images: the job's target (topped up with generated ones)")
    max_abs_diff: float = Field(description="largest |logit difference| over those images")
    top1_agreement: float = Field(description="share of the images with the same top-1 class (1.0 = all)")
    tolerance: float
    ok: bool


class ExportOut(BaseModel):
    """A finished job's checkpoint in a serving format, made on its first download and kept."""

    format: Literal["onnx", "safetensors"]
    url: str
    sha256: str
    size: int
    created_at: str
    parity: ExportParity


class StoredConfig(BaseModel):
    """A job's config as it was stored, where this version's :class:`~t3ar.method.config.AdaptConfig` no longer
    reads it (an option removed or renamed since the job ran): the options as they were."""

    model_config = ConfigDict(extra="allow")

    method: str
    mode: str = "test"


#: a job's config in the API's answers: its method's AdaptConfig (one schema per method, keyed by ``method``), or,
#: for a job stored by an earlier version whose options this one no longer reads, the options as stored
JobConfig = Annotated[AdaptConfig | StoredConfig, Field(
    union_mode="left_to_right", description="the job's adaptation config, as validated at submission (its mode "
                                            "resolved): the options of its method, each group nested")]


def job_config(stored: Mapping[str, Any]) -> AdaptConfig | StoredConfig:
    """A job's stored config (what a job record keeps: its AdaptConfig's dump) as the API answers it."""
    return TypeAdapter(JobConfig).validate_python(stored)


class JobResult(BaseModel):
    """A finished job's summary, as its worker returned it (the job's report has the whole story)."""

    checkpoint_sha256: str | None = None
    pool_ids_used: int | None = Field(default=None, description="distinct pool items the job retrieved")
    steps: int | None = Field(default=None, description="optimiser steps run")
    seconds_adapt: float | None = Field(default=None, description="seconds of adaptation")
    seconds: float | None = Field(default=None, description="the worker's seconds for the whole job")
    labelled_neighbours_total: int | None = Field(default=None, description="pool neighbours that served as "
                                                                            "labelled training data")
    labelled_neighbours: list[LabelledNeighbour] | None = Field(
        default=None, description="the first few of them, the most used first (the report lists more)")
    labelled_per_label: dict[str, int] | None = Field(default=None, description="how many of them carry each "
                                                                                "label (all of them)")
    winner: str | None = Field(default=None, description="a job with a holdout: the candidate whose checkpoint it "
                                                         "returns")
    accuracy_before: float | None = Field(default=None, description="top-1 on the target labels before adapting")
    accuracy_after: float | None = Field(default=None, description="top-1 on the target labels after adapting")
    neighbour_quality: NeighbourQualityRecord | None = Field(
        default=None, description="how good the job's neighbours were (issue 52; the report's neighbour_quality)")

    @classmethod
    def read(cls, value: Any) -> JobResult | None:
        """What a worker returned, read leniently: a field that does not fit is left out (a job's answer never
        fails on what a worker wrote); None when it is not an object."""
        if not isinstance(value, dict):
            return None
        return read_leniently(cls, value, "a job's result")


class Registration(BaseModel):
    """A job's model version in the MLflow registry (an API with ``T3AR_MLFLOW_TRACKING_URI`` set)."""

    state: Literal["pending", "done", "failed", "skipped"] = Field(
        description="pending: registered once the job finished (retried with backoff while the registry does not "
                    "answer); done: registered; failed: every attempt failed (error says why; POST "
                    "/jobs/{id}/registration tries again); skipped: the job did not finish")
    name: str = Field(description="the registered model (in the team's namespace: <team>.<name>)")
    alias: str | None = Field(default=None, description="the alias the job's request asked for (set with the version)")
    version: str | None = None
    model_uri: str | None = Field(default=None, description="models:/<name>/<version>: mlflow.pyfunc.load_model")
    run_id: str | None = None
    run_url: str | None = Field(default=None, description="the run in the MLflow UI")
    version_url: str | None = Field(default=None, description="the version in the MLflow UI")
    attempts: int = 0
    next_attempt_at: str | None = Field(default=None, description="pending after a failed attempt: the next one")
    error: str | None = Field(default=None, description="the last attempt's error (credentials never shown)")
    stale: bool = Field(default=False, description="a pool item the job used was withdrawn: its version is tagged "
                                                   "t3ar.stale with the item and the time")
    superseded_by: str | None = Field(default=None, description="<name>/<version> of the re-run's version")
    tags_pending: int = Field(default=0, description="version tags (stale marks, links) not yet in the registry")


class JobOut(BaseModel):
    id: str
    url: str
    status: JobStatusName
    model_id: str
    parent_id: str | None = Field(default=None, description="the job this one re-runs (readapt)")
    created_at: str
    enqueued_at: str | None = None
    started_at: str | None = None
    ended_at: str | None = None
    queue_position: int | None = None
    worker: str | None = None
    config: JobConfig
    target: TargetInfo
    progress: Progress | None = None
    error: str | None = None
    result: JobResult | None = Field(default=None, description="a finished job: its summary")
    checkpoint_url: str | None = None
    report_url: str | None = None
    exports: dict[str, ExportOut] = Field(
        default_factory=dict, description="the serving formats made so far, by format: `checkpoint_url` with "
                                          "`?format=onnx` or `?format=safetensors` makes one on first request")
    contribution: Contribution = Field(description="whether this job's target joins the pool, and how it went")
    neighbours_from_contributions: list[NeighbourSource] = Field(
        default_factory=list, description="earlier jobs' contributions that this job's retrieved neighbours came "
                                          "from (finished jobs; from its lineage)")
    acceptance: AcceptanceRecord | None = Field(
        default=None, description="a job with a holdout, once its candidates were scored: each candidate's top-1 with "
                                  "its 95 % CI and paired differences to the base model and bn-adapt (points), the "
                                  "rule and the winner (the job's checkpoint; with require_gain a base-model winner "
                                  "fails the job)")
    used_withdrawn: int | None = Field(
        default=None, description="GET /jobs/{id} of a finished job: how many of the pool items it retrieved were "
                                  "withdrawn since (above 0: its checkpoint is stale, readapt it); None in lists")
    withdrawn_pool_ids: list[str] | None = Field(
        default=None, description="GET /jobs/{id} of a finished job: the pool items it retrieved that were withdrawn "
                                  "since (the first 100; used_withdrawn counts them all); None in lists")
    superseded_by: list[str] | None = Field(
        default=None, description="GET /jobs/{id}: the jobs that re-run this one (readapts), newest first; None in "
                                  "lists")
    registration: Registration | None = Field(
        default=None, description="its model version in the MLflow registry: pending, done (run and version, with "
                                  "links), failed (with the reason) or skipped; None when the API registers none")


class JobAccepted(BaseModel):
    id: str
    url: str
    status: JobStatusName = "queued"
    parent_id: str | None = None
    config: JobConfig
    target: TargetInfo
    contribute: bool = Field(default=False, description="the target joins the pool once the job finished")
    warnings: list[str] = Field(default_factory=list)


class JobList(BaseModel):
    jobs: list[JobOut]
    total: int
    next_before: str | None = Field(default=None, description="pass as ?before= for the next (older) page")


class CancelResponse(BaseModel):
    id: str
    status: Literal["canceled", "canceling"]


class LineageJob(BaseModel):
    job_id: str
    url: str
    checkpoint_url: str
    readapt_url: str
    model_id: str | None = None
    finished_at: str | None = None


class LineageResponse(BaseModel):
    pool_id: str
    jobs: list[LineageJob] = Field(description="finished jobs whose adaptation retrieved this pool item")
    in_flight: list[str] = Field(default_factory=list,
                                 description="jobs running now; they may have retrieved it already")


class DeleteResponse(LineageResponse):
    deleted: bool = True
    lineage_error: str | None = Field(default=None, description="set when the item was withdrawn but its lineage "
                                                                "could not be read (then ``jobs`` may be incomplete)")


class ContributionWithdrawn(BaseModel):
    job_id: str
    source: str
    withdrawn: list[str] = Field(description="the pool ids of the contribution this withdrawal deleted (not those "
                                             "removed before, e.g. by compaction)")
    jobs: list[LineageJob] = Field(description="finished jobs that retrieved any of them: readapt them")
    in_flight: list[str] = Field(default_factory=list, description="jobs running now; they may have used them")


class CompactRemoval(BaseModel):
    id: str
    source: str
    size: int
    duplicate_of: str
    score: float


class CompactResponse(BaseModel):
    dry_run: bool
    plan_id: str
    threshold: float
    sources: list[str]
    remove: list[CompactRemoval] = Field(description="dry-run: what the plan removes; real run: what it removed")
    bytes_freed: int = Field(description="image bytes the removals free (dry-run: would free)")
    clusters: int | None = None
    scanned: int | None = None
    items: int | None = None
    method: str | None = None
    seconds: dict[str, float] = Field(default_factory=dict)
    jobs: list[LineageJob] = Field(default_factory=list, description="real run: finished jobs that used a removed "
                                                                     "item")
    in_flight: list[str] = Field(default_factory=list)


class KeyOut(BaseModel):
    id: str = Field(description="the key's id: not secret; names it in lists and the audit log")
    team: str
    role: str
    name: str
    created_at: str
    created_by: str = Field(description="the key id that made it")
    revoked_at: str | None = None


class KeyCreated(KeyOut):
    key: str = Field(description="the key itself: shown this once, never stored (only its sha256)")


class KeyList(BaseModel):
    keys: list[KeyOut]


class AuditOut(BaseModel):
    seq: int
    at: str
    key_id: str
    team: str
    action: str
    target: str
    client: str = Field(description="the client address as the API saw it")
    outcome: str
    detail: str


class AuditList(BaseModel):
    entries: list[AuditOut]
    next_before: int | None = Field(description="the `before` of the next (older) page; null on the last")
