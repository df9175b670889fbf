"""Pool compaction: a dry-run lists the near-duplicates a compaction would remove (the retriever finds them
through its index, ``POST /pool/near-duplicates``) and keeps that list as a plan; a real run applies a plan,
removing exactly the ids it lists, through the one withdrawal path (:mod:`t3ar_services.api.withdrawals`), with
the lineage of every removed id.

A plan is applied at most once, and only while it still holds: every id it removes and every item it keeps
for them must still be in the pool (else 409 and nothing is removed: the pool changed, run the dry-run again),
so a compaction never removes an item whose duplicate has gone meanwhile.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from t3ar.clients.retriever import RetrieverClient
from t3ar.clients.retriever_errors import RetrieverNotFoundError
from t3ar.clients.retriever_models import NearDuplicatesResponse
from t3ar_services.api.contrib_store import ContributionStore
from t3ar_services.api.contributions import Contributor
from t3ar_services.api.errors import ConflictError, NotFoundError

log = logging.getLogger(__name__)


class Compactor:
    def __init__(self, contributor: Contributor, scan_timeout: float) -> None:
        self.contributor = contributor
        self.records: ContributionStore = contributor.records
        self.scan_timeout = scan_timeout  # T3AR_API_COMPACT_TIMEOUT: a scan of a large pool takes minutes

    @property
    def admin(self) -> RetrieverClient:
        return self.contributor.clients()[1]

    def plan(self, threshold: float, sources: list[str], nprobe: int) -> tuple[str, NearDuplicatesResponse]:
        """Dry-run: ask the retriever for the near-duplicates, store the list as a plan; nothing changes."""
        params = {"threshold": threshold, "sources": sources, "nprobe": nprobe}
        found = self.admin.near_duplicates(threshold=threshold, sources=sources, nprobe=nprobe,
                                           timeout=self.scan_timeout)
        plan_id = uuid.uuid4().hex
        self.records.add_plan(plan_id, params, found.model_dump(mode="json"))
        return plan_id, found

    def apply(self, plan_id: str) -> dict[str, Any]:
        """Remove exactly what plan ``plan_id`` lists (see the module docstring); returns the removed ids."""
        with self.contributor.lock:
            plan = self.records.get_plan(plan_id)
            if plan is None:
                raise NotFoundError(f"no compaction plan {plan_id!r}: run a dry-run (POST /pool/compact) first")
            if plan.status == "applied":
                raise ConflictError(f"compaction plan {plan_id} was already applied at {plan.applied_at}; run a "
                                    "new dry-run")
            remove = [r["id"] for r in plan.plan["remove"]]
            keep = sorted({r["duplicate_of"] for r in plan.plan["remove"]})
            gone = self._missing(keep)
            if gone:
                raise ConflictError(f"the pool changed since the dry-run: {len(gone)} item(s) the plan keeps are gone "
                                    f"(first: {gone[0]}); nothing was removed, run the dry-run again")
            deleted: list[str] = []
            try:
                self.contributor.withdrawer.withdraw(remove, f"compaction:{plan_id}", gone=deleted,
                                                     refuse_content=False)
            except RetrieverNotFoundError as e:
                raise ConflictError(f"the pool changed since the dry-run: {e}; {len(deleted)} listed item(s) "
                                    "were removed before it, nothing after; run the dry-run again") from e
            result = {"removed": deleted, "bytes_freed": int(plan.plan.get("bytes", 0))}
            self.records.finish_plan(plan_id, result)
            log.info("compaction plan %s applied: %d item(s) removed", plan_id, len(deleted))
            return result

    def _missing(self, ids: list[str]) -> list[str]:
        gone = []
        for pid in ids:
            try:
                self.admin.get_item(pid)
            except RetrieverNotFoundError:
                gone.append(pid)
        return gone
