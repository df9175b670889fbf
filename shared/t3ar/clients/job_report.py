"""The report of an adaptation job, as a versioned model: a worker builds it, the API validates it where it
arrives (``PUT /internal/jobs/{id}/result``: a report that does not fit is refused, as a bad checkpoint is) and
serves it (``GET /jobs/{id}/report``), and the console and ``t3ar jobs report`` read its typed fields.

It lives in the library because the CLI reads it too (the library never imports the services); the job contract
(:mod:`t3ar_services.common.job_contract`) names it as part of the contract between API and workers.

Versioning: :data:`REPORT_VERSION` is the shape a producer writes. Adding an *optional* field (``name: T | None =
None``, or a list with an empty default) is one line and keeps the version: a report without it still reads.
Renaming, removing, changing a field's meaning or adding a required field bumps the version; a report of a
version this side does not know is refused (a worker newer than its API says so instead of losing fields), and
unknown fields are refused (a field the contract does not name never reaches the store).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

#: the report shape this code writes and reads (see the module docstring for when it changes)
REPORT_VERSION = 1


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EpochPoint(_Part):
    """Means over an epoch's steps (and the pseudo-label change rate at its end)."""

    epoch: int
    loss: float | None = None
    loss_ce: float | None = None
    loss_contrastive: float | None = None
    pl_change_rate: float | None = None


class StepPoint(EpochPoint):
    """One optimiser step (thinned to at most 500 points)."""

    step: int


class Neighbour(_Part):
    id: str | None = Field(default=None, description="the pool id; None for a random draw")
    score: float | None = Field(default=None, description="similarity under the retriever; None for random")


class NeighbourRow(_Part):
    """A target image and the pool neighbours drawn for it."""

    target: str
    neighbours: list[Neighbour] = Field(default_factory=list)


class EvalBrief(_Part):
    top1: float | None = None
    mean_class_accuracy: float | None = None
    n: int | None = None
    per_class: dict[str, Any] = Field(default_factory=dict)


class Accuracy(_Part):
    """Accuracy on the target's labels before and after the adaptation (only for a labelled target)."""

    before: EvalBrief | None = None
    after: EvalBrief | None = None
    labels_used_for_training: bool = False


class CacheStats(_Part):
    hits: int = Field(ge=0)
    misses: int = Field(ge=0)


class Transfer(_Part):
    """How the worker got the job's inputs and sent its checkpoint."""

    base_model_cached: bool | None = None
    target_bytes: int | None = Field(default=None, ge=0)
    seconds_download: float | None = None
    seconds_upload_checkpoint: float | None = None


class LabelledNeighbour(_Part):
    """A pool neighbour that served as labelled training data: its pool label (a class of the model)
    and how many optimiser steps it served in."""

    pool_id: str
    label: str
    uses: int = Field(ge=1)


class PairedPoints(_Part):
    """A paired difference in points (a - b, top-1 x 100) and its paired 95 % CI."""

    points: float
    lo: float
    hi: float


class CandidateRecord(_Part):
    """One candidate of a job's acceptance check, scored on the holdout."""

    name: str
    method: str | None = None
    top1: float = Field(ge=0, le=1)
    ci: list[float] = Field(min_length=2, max_length=2, description="top-1's Wilson 95 % CI")
    n: int = Field(ge=0)
    vs_source: PairedPoints | None = Field(default=None, description="minus the base model, in points")
    vs_bn_adapt: PairedPoints | None = Field(default=None, description="minus bn-adapt, in points")
    seconds: float | None = Field(default=None, description="wall seconds of its adaptation and holdout scoring")
    # what the candidate drew from the pool, whether it won or not: a job's result and report carry the winner's
    # alone, so without these a retrieval candidate that lost to bn-adapt left no trace of its neighbours (issue 52)
    pool_ids_used: int | None = Field(default=None, ge=0, description="distinct pool items the candidate retrieved "
                                                                      "(None: a record from before it was kept)")
    labelled_neighbours_total: int | None = Field(
        default=None, ge=0, description="pool neighbours that served the candidate as labelled training data")
    neighbour_quality: NeighbourQualityRecord | None = Field(
        default=None, description="how good the candidate's neighbours were (None: it drew none)")


class RunnerUp(PairedPoints):
    """The best candidate after the winner, and the winner minus it in points with its paired 95 % CI."""

    name: str


class AcceptanceRecord(_Part):
    """A job's acceptance check (a job with a holdout): every candidate on the holdout, the rule, the winner (whose
    weights are the job's checkpoint) and why (t3ar.acceptance)."""

    rule: str
    winner: str
    reason: str
    n: int = Field(ge=0, description="holdout images")
    ci: str = Field(description="how a candidate's top-1 CI is computed")
    paired_ci: str = Field(description="how a paired difference's CI is computed")
    steps: list[str] = Field(default_factory=list, description="the paired rule's comparisons, in order")
    candidates: list[CandidateRecord] = Field(default_factory=list)
    require_gain: bool = False
    runner_up: RunnerUp | None = Field(default=None, description="the best other candidate and the winner's paired "
                                       "difference to it (None: one candidate, or a record from before it was kept)")
    classes: int | None = Field(default=None, description="classes with images in the holdout")


class LabelShare(_Part):
    """Of ``labelled`` labelled neighbours (of ``queries`` queries), ``matches`` carry the reference class."""

    share: float | None = Field(default=None, ge=0, le=1, description="matches / labelled; None when none is labelled")
    matches: int = Field(ge=0)
    labelled: int = Field(ge=0)
    queries: int = Field(ge=0)


class NeighbourQualityRecord(_Part):
    """How good a job's neighbours were (issue 52; t3ar.method.neighbour_quality): of the labelled neighbours, the
    share whose label is the target image's pseudo-label (the base model with BatchNorm statistics re-estimated on
    the target), and where true labels are known (a holdout, or a labelled target) the share that carry the true
    class (precision@k) and the share of queries with one such neighbour (hit rate); the neighbours by pool
    source."""

    ranking: str = Field(description="the retrieval option that drew them (index, base-rerank, class-conditional)")
    k: int = Field(ge=0)
    neighbours: int = Field(ge=0, description="neighbours drawn in all")
    pseudo_label_agreement: LabelShare | None = None
    precision_at_k: LabelShare | None = None
    precision_on: str | None = Field(default=None, description="holdout or target: whose true labels")
    hit_rate: float | None = Field(default=None, ge=0, le=1)
    sources: dict[str, int] = Field(default_factory=dict, description="drawn neighbours per pool source")


def quality_lines(q: NeighbourQualityRecord) -> list[str]:
    """The neighbour quality as text lines (CLI, console)."""
    def share(s: LabelShare | None) -> str:
        if s is None or s.share is None:
            return "no labelled neighbour"
        return f"{100 * s.share:.1f} % ({s.matches} of {s.labelled} labelled neighbours of {s.queries} images)"

    lines = [f"neighbour quality ({q.ranking}, k={q.k}, {q.neighbours} drawn): labelled neighbours with the image's "
             f"pseudo-label {share(q.pseudo_label_agreement)}"]
    if q.precision_at_k is not None:
        lines.append(f"precision@{q.k} on the {q.precision_on or '?'}'s true labels {share(q.precision_at_k)}"
                     + (f"; hit rate {100 * q.hit_rate:.1f} %" if q.hit_rate is not None else ""))
    if q.sources:
        # the most first: a record read back from JSON may hold its sources in name order
        ordered = sorted(q.sources.items(), key=lambda kv: (-kv[1], kv[0]))
        lines.append("neighbours by pool source: " + ", ".join(f"{s or '(none)'} {n}" for s, n in ordered))
    return lines


def candidate_pool_lines(acc: AcceptanceRecord) -> list[str]:
    """What each candidate that drew pool neighbours used of the pool, and how good its neighbours were (text
    lines; the returned model's own are the job's, a losing candidate's are only here); empty for a record
    without them."""
    lines = []
    for c in acc.candidates:
        if not c.pool_ids_used and c.neighbour_quality is None:
            continue
        role = "the returned model" if c.name == acc.winner else "not returned"
        lines.append(f"candidate {c.name} ({role}): {c.pool_ids_used or 0} pool images retrieved, "
                     f"{c.labelled_neighbours_total or 0} served as labelled data")
        if c.neighbour_quality is not None:
            lines += ["  " + line for line in quality_lines(c.neighbour_quality)]
    return lines


#: the most labelled neighbours a report lists (the most used first); ``labelled_neighbours_total`` counts all
MAX_LABELLED_LISTED = 2000


class JobReport(_Part):
    """What a finished job did: its config, the checkpoint it made, timings, losses per epoch and per step,
    accuracy when the target had labels, the image cache's use and a sample of the neighbours it drew."""

    version: int = Field(default=REPORT_VERSION, description="the report's shape (REPORT_VERSION when written)",
                         json_schema_extra={"minimum": 1, "maximum": REPORT_VERSION})  # checked by _known
    job_id: str
    model_id: str | None = None
    parent_id: str | None = None
    method: str | None = None
    mode: str | None = None
    config: dict[str, Any] = Field(default_factory=dict, description="the AdaptConfig the job ran with")
    target_size: int | None = Field(default=None, ge=0)
    checkpoint_sha256: str | None = None
    pool_ids_used: int | None = Field(default=None, ge=0)
    retriever: str | None = None
    device: str | None = None
    worker_host: str | None = None
    seconds_total: float | None = None
    metrics: dict[str, Any] = Field(default_factory=dict, description="the adapted checkpoint's own metrics")
    epochs: list[EpochPoint] = Field(default_factory=list)
    step_history: list[StepPoint] = Field(default_factory=list)
    accuracy: Accuracy | None = None
    neighbour_sample: list[NeighbourRow] = Field(default_factory=list)
    labelled_neighbours: list[LabelledNeighbour] = Field(
        default_factory=list, max_length=MAX_LABELLED_LISTED,
        description="the pool neighbours that served as labelled training data, with their label and steps served "
                    "(the most used first; empty when none did)")
    labelled_neighbours_total: int | None = Field(default=None, ge=0, description="how many neighbours served as "
                                                  "labelled data (all of them, listed or not)")
    neighbour_quality: NeighbourQualityRecord | None = Field(
        default=None, description="how good the neighbours were (None: no retrieval, or a report from before it)")
    image_cache: CacheStats | None = None
    transfer: Transfer | None = None
    acceptance: AcceptanceRecord | None = Field(
        default=None, description="the acceptance check on the job's holdout (None: a job without a holdout)")
    phases: dict[str, float] | None = Field(
        default=None, description="seconds per phase (queue_wait, then the worker's phases, which add up to "
                                  "seconds_total with 'other' the rest; t3ar_services.worker.phases); None in a "
                                  "report from before phases were recorded")

    @field_validator("version")
    @classmethod
    def _known(cls, v: int) -> int:
        if not 1 <= v <= REPORT_VERSION:
            raise ValueError(f"report version {v} is not one this side reads (1 to {REPORT_VERSION}): upgrade the "
                             "API before its workers")
        return v


def report_summary(report: JobReport) -> str:
    """A few lines a person reads: what ran, how long, what it used, and the accuracy when labels were given."""
    steps = report.metrics.get("steps")
    lines = [f"job {report.job_id}: {report.method or '?'} ({report.mode or '?'}) on {report.target_size or '?'} "
             f"target images, {steps if steps is not None else '?'} steps in "
             f"{report.seconds_total if report.seconds_total is not None else '?'} s on {report.device or '?'}",
             f"pool items used: {report.pool_ids_used if report.pool_ids_used is not None else '?'}"
             + (f" (image cache {report.image_cache.hits} hits, {report.image_cache.misses} misses)"
                if report.image_cache else ""),
             f"checkpoint sha256: {report.checkpoint_sha256 or '?'}"]
    if report.labelled_neighbours:
        lines.append(labelled_summary([u.model_dump() for u in report.labelled_neighbours],
                                      total=report.labelled_neighbours_total))
    if report.neighbour_quality is not None:
        lines += quality_lines(report.neighbour_quality)
    acc = report.accuracy
    if acc is not None and acc.before is not None and acc.after is not None \
            and acc.before.top1 is not None and acc.after.top1 is not None:
        lines.append(f"accuracy {100 * acc.before.top1:.1f}% -> {100 * acc.after.top1:.1f}% on the target labels"
                     + (" (used for training)" if acc.labels_used_for_training else ""))
    if report.acceptance is not None:
        lines += acceptance_table(report.acceptance)
    return "\n".join(lines)


def _diff(d: PairedPoints | None) -> str:
    return "-" if d is None else f"{d.points:+.1f} [{d.lo:+.1f}, {d.hi:+.1f}]"


def acceptance_table(acc: AcceptanceRecord) -> list[str]:
    """The acceptance check as text lines: a table (candidate, top-1, CI, difference to the base and to bn-adapt
    in points with their paired CIs, winner), then the rule and the reason."""
    head = ("candidate", "top-1 %", "95 % CI", "vs source (points)", "vs bn-adapt (points)", "winner")
    rows = [(c.name, f"{100 * c.top1:.1f}", f"[{100 * c.ci[0]:.1f}, {100 * c.ci[1]:.1f}]", _diff(c.vs_source),
             _diff(c.vs_bn_adapt), "<-" if c.name == acc.winner else "") for c in acc.candidates]
    widths = [max(len(str(r[i])) for r in (head, *rows)) for i in range(len(head))]
    fmt = "  ".join(f"{{:{'<' if i == 0 else '>'}{w}}}" for i, w in enumerate(widths))
    return ([f"acceptance on {acc.n} holdout images (rule {acc.rule}): {acc.winner} wins: {acc.reason}",
             fmt.format(*head)] + [fmt.format(*r) for r in rows])


def labelled_summary(uses: Sequence[Mapping[str, Any]], *, total: int | None = None,
                     per_label: Mapping[str, int] | None = None, shown: int = 10,
                     withdrawn: Collection[str] = ()) -> str:
    """One line on the neighbours that served as labelled training data (``{"pool_id", "label", "uses"}``, what
    :class:`t3ar.pipeline.LabelledUse` and :attr:`JobReport.labelled_neighbours` hold): how many (``total`` when
    the list is a part), per label (``per_label``: the counts of all of them; else counted in ``uses``, and said
    to be of those listed when they are a part), and the first ``shown`` with their label and the steps each
    served in; those in ``withdrawn`` (withdrawn from the pool since) are marked."""
    scope = ""
    if per_label is None:
        counted: dict[str, int] = {}
        for u in uses:
            counted[str(u["label"])] = counted.get(str(u["label"]), 0) + 1
        per_label = counted
        if total is not None and total > len(uses):
            scope = f" among the {len(uses)} listed"
    labels = ", ".join(f"{lab} {n}" for lab, n in sorted(per_label.items(), key=lambda kv: (-kv[1], kv[0]))) + scope
    first = ", ".join(f"{u['pool_id']} ({u['label']}, {u['uses']} step{'s' if u['uses'] != 1 else ''}"
                      f"{', WITHDRAWN since' if u['pool_id'] in withdrawn else ''})" for u in uses[:shown])
    n = total if total is not None else len(uses)
    more = f", and {n - min(shown, len(uses))} more" if n > min(shown, len(uses)) else ""
    return f"{n} pool neighbour{'s' if n != 1 else ''} served as labelled data ({labels}): {first}{more}"
