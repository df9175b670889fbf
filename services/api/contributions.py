"""Targets that join the pool, and their withdrawal as one unit.

A job submitted with ``contribute=true`` adds its target images to the pool once it *finished* (a failed or
canceled job contributes nothing): under the source ``target:<job id>``, with ``{"job_id", "model_id"}`` as
metadata, through the retriever's ordinary add (``POST /pool``, near-duplicate policy ``skip``), so an exact
duplicate (same sha256) of what the pool holds is skipped as ``exists`` and R's near-duplicate (cosine >= the
pool's ``T3AR_RETRIEVER_DUPLICATE_THRESHOLD``, default 0.98) as ``duplicate``; both are counted.

Labels: a **train-time** job's target images join the pool with their class as the pool label (the
target's class folders or labels.csv, which the job trained on); a test-time job's images join unlabelled, its
pseudo-labels never become labels. An image the pool already holds keeps the label it has.

The contributor runs in a background thread of the API (woken when a worker's result arrives, and every
``T3AR_API_SWEEP_INTERVAL`` seconds), so a worker never waits for it and a retriever outage only delays it: a
failed attempt stays ``pending`` and is retried, also after a restart. A retry adds nothing twice: the pool
stores a sha256 once, and what the contribution holds is read back from the pool by its source, so the counts
are those of the first complete attempt. One lock serialises contributing and withdrawing.

Withdrawal (admin) deletes every item of the source ``target:<job id>`` through the one withdrawal path
(:mod:`t3ar_services.api.withdrawals`: the guarantee of ``DELETE /pool/{id}``, never retrieved again, bytes gone,
survives restarts; recorded; workers' caches told), and answers which later jobs used any of them.
A crash half-way leaves the status ``withdrawing``, which the contributor finishes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from t3ar.clients.retriever import RetrieverClient
from t3ar.clients.retriever_errors import RetrieverInputError
from t3ar.errors import T3arError, without_paths
from t3ar_services.api.contrib_store import ContributionRow, ContributionStore, now
from t3ar_services.api.errors import ConflictError, NotFoundError
from t3ar_services.api.store import Store
from t3ar_services.api.sweeper import Sweeper
from t3ar_services.api.withdrawals import Withdrawer
from t3ar_services.common.job_contract import LINEAGE_FILE, artifacts_dir

log = logging.getLogger(__name__)

SOURCE_PREFIX = "target:"
BATCH = 64  # images per POST /pool
NOT_A_TARGET_IMAGE = ("labels.csv",)


def source_of(job_id: str) -> str:
    return SOURCE_PREFIX + job_id


def target_files(folder: Path) -> list[Path]:
    """The images of a validated target folder (everything but labels.csv), in a stable order."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()
                  and p.relative_to(folder).as_posix() not in NOT_A_TARGET_IMAGE)


def target_labels(folder: Path, files: list[Path]) -> dict[Path, str]:
    """The class name of each labelled image of a train-time target folder (its labels.csv, read as the worker
    read it: :func:`t3ar.data.target.read_target`); an image without a class is left out (it joins unlabelled)."""
    from t3ar.data.target import read_target

    try:
        found = read_target(folder, strict=False)
    except T3arError as e:  # the job trained on it, so this is rare: the images join unlabelled
        log.warning("the target of %s has no labels to contribute (%s): its images join unlabelled", folder, e)
        return {}
    if found.labels is None or found.classes is None:
        return {}
    by_path = {p.resolve(): found.classes[y] for p, y in zip(found.paths, found.labels, strict=True)}
    return {f: by_path[f.resolve()] for f in files if f.resolve() in by_path}


def _by_label(files: list[Path], labels: dict[Path, str]) -> list[tuple[str | None, list[Path]]]:
    """The files grouped by label (one label per upload), each group in file order, the groups by first file."""
    groups: dict[str | None, list[Path]] = {}
    for f in files:
        groups.setdefault(labels.get(f), []).append(f)
    return list(groups.items())


class Contributor(Sweeper):
    """Makes and withdraws contributions (see the module docstring); its background sweep (:meth:`Sweeper.start`)
    runs :meth:`run_pending` every interval, the first after one interval."""

    thread_name = "t3ar-api-contributor"
    sweep_what = "contribution"
    sweep_first = False
    join_timeout = 30.0

    def __init__(self, store: Store, data_dir: Path, clients: Callable[[], tuple[RetrieverClient, RetrieverClient]],
                 withdrawer: Withdrawer, job_status: Callable[[str], str]) -> None:
        self.records: ContributionStore = withdrawer.records
        self.store = store
        self.data_dir = data_dir
        self.clients = clients  # the API's retriever clients (read/write, admin), looked up at each use
        self.withdrawer = withdrawer  # the one withdrawal path (records, tells the caches, syncs lineage)
        self.job_status = job_status  # job id -> queued | started | finished | failed | canceled
        self.lock = threading.Lock()
        super().__init__()

    # --- contributing ------------------------------------------------------------------------------------
    def run_pending(self) -> int:
        """Promote requests of finished jobs, end those of failed/canceled ones, make pending contributions and
        finish interrupted withdrawals. Returns how many contributions were made."""
        made = 0
        for row in self.records.with_status("requested"):
            if (artifacts_dir(self.data_dir, row.job_id) / LINEAGE_FILE).is_file():
                self.records.set_status(row.job_id, "pending", only_from=("requested",))
            else:
                status = self.job_status(row.job_id)
                if status in ("failed", "canceled"):
                    self.records.set_status(row.job_id, "none", only_from=("requested",),
                                            error=f"the job {status}: nothing was contributed")
        for row in self.records.with_status("pending", "withdrawing"):
            with self.lock:
                current = self.records.get(row.job_id)
                if current is None:
                    continue
                try:
                    if current.status == "pending":
                        self._contribute(current)
                        made += 1
                    elif current.status == "withdrawing":
                        self._finish_withdrawal(row.job_id)
                except Exception as e:
                    log.warning("contribution of job %s: %s (retried later)", row.job_id, e)
                    self.records.failed_attempt(row.job_id, without_paths(f"{type(e).__name__}: {e}"))
        return made

    def _contribute(self, row: ContributionRow) -> None:
        job = self.store.get_job(row.job_id)
        if job is None:
            self.records.set_status(row.job_id, "none", error="the job's record is gone")
            return
        folder = self.data_dir / job.target_dir
        files = target_files(folder) if folder.is_dir() else []
        if not files:
            self.records.set_status(row.job_id, "none", error="the job's target images are no longer stored")
            return
        source = source_of(row.job_id)
        meta = {"job_id": row.job_id, "model_id": job.model_id}
        labels = target_labels(folder, files) if job.config.get("mode") == "train" and job.labelled else {}
        near = rejected = 0
        for label, group in _by_label(files, labels):
            for start in range(0, len(group), BATCH):
                batch = [(p.relative_to(folder).as_posix(), p.read_bytes()) for p in group[start:start + BATCH]]
                try:
                    out = self.clients()[0].add_images(batch, source=source, metadata=meta,
                                                       duplicate_policy="skip", label=label)
                except RetrieverInputError as e:
                    if not e.items:
                        raise
                    rejected += len(e.items)  # none usable (unreadable, or withdrawn content): the rest goes on
                    continue
                near += out.duplicates
                rejected += out.rejected
        ours = [it.id for it in self.clients()[1].iter_items(source=source)]
        self.records.record_items(row.job_id, ours)
        self.records.set_status(row.job_id, "done", only_from=("pending",), images=len(files), added=len(ours),
                                skipped_near=near, rejected=rejected,
                                skipped_exact=len(files) - len(ours) - near - rejected, error=None)
        log.info("job %s contributed %d of %d target images to the pool (%d exact, %d near-duplicates skipped)",
                 row.job_id, len(ours), len(files), len(files) - len(ours) - near - rejected, near)

    # --- withdrawing -------------------------------------------------------------------------------------
    def withdraw(self, job_id: str) -> list[str]:
        """Withdraw job ``job_id``'s contribution as one unit; the pool ids it deleted, not those that were gone
        already (see the module docstring).
        404 when already withdrawn; 409 when the job has made no contribution (not asked, not finished yet,
        failed or canceled)."""
        with self.lock:
            row = self.records.get(job_id)
            if row is None:
                raise ConflictError(f"job {job_id} was not submitted with contribute=true: it has no contribution "
                                    "to withdraw (withdraw single pool items with DELETE /pool/{id})")
            if row.status == "withdrawn":
                raise NotFoundError(f"the contribution of job {job_id} was already withdrawn at {row.withdrawn_at}")
            if row.status in ("requested", "none"):
                status = self.job_status(job_id)
                if row.status == "none" or status in ("failed", "canceled"):
                    raise ConflictError(f"job {job_id} is {status}: it contributed nothing, so there is nothing "
                                        "to withdraw")
                raise ConflictError(f"job {job_id} is {status}: it contributes to the pool once it finishes; "
                                    "withdraw the contribution then, or cancel the job (POST /jobs/{id}/cancel)"
                                    .replace("{id}", job_id))
            self.records.set_status(job_id, "withdrawing")
            return self._finish_withdrawal(job_id)

    def _finish_withdrawal(self, job_id: str) -> list[str]:
        admin = self.clients()[1]
        ids = list(dict.fromkeys(self.records.items_of(job_id)
                                 + [it.id for it in admin.iter_items(source=source_of(job_id))]))
        deleted = self.withdrawer.withdraw(ids, f"contribution:{job_id}", missing_ok=True)
        self.records.set_status(job_id, "withdrawn", withdrawn_at=now(), withdrawn_ids=len(deleted))
        log.info("withdrew the contribution of job %s: %d pool item(s) deleted (%d listed)", job_id, len(deleted),
                 len(ids))
        return deleted  # not those already gone (compaction, a single delete): they were withdrawn then

    # --- what the job view says --------------------------------------------------------------------------
    def describe(self, job_id: str, job_status: str) -> dict[str, Any]:
        row = self.records.get(job_id)
        if row is None:
            return {"requested": False, "status": "not_requested"}
        status = row.status
        if status == "requested":
            status = "none" if job_status in ("failed", "canceled") else \
                "pending" if job_status == "finished" else "waiting"
        return {"requested": True, "status": status, "source": source_of(job_id), "images": row.images,
                "added": row.added, "skipped_exact": row.skipped_exact, "skipped_near": row.skipped_near,
                "rejected": row.rejected, "attempts": row.attempts, "error": row.error,
                "withdrawn_at": row.withdrawn_at, "withdrawn_items": row.withdrawn_ids}

    def neighbours(self, job_id: str) -> list[dict[str, Any]]:
        return [{"job_id": j, "source": source_of(j), "items_used": n}
                for j, n in self.records.neighbour_sources(job_id)]
