"""The one path by which items leave the pool, whatever asked for it: a single ``DELETE /pool/{id}``, a
contribution's withdrawal, a compaction.

:meth:`Withdrawer.withdraw` first writes an intent (``withdrawal_intents``), then deletes at the retriever with the
admin token (once it returns, no search returns
the ids and their bytes are gone there), records every deleted id in the ``withdrawals`` table with why, tells
the workers' image caches (the bounded feed of :mod:`t3ar_services.common.withdrawn`), counts the deletes and
indexes the lineage of newly finished jobs, so the answer's lineage (who used what was removed) is complete, then
owes a stale mark to the MLflow versions of the jobs that used them (:mod:`.modelreg.registrar`).
What was deleted before a failure half-way is recorded and announced all the same. A single withdrawal whose
process was killed after the retriever's delete and before its record is completed by its retry: the retriever
answers 404, and the intent (or the retriever's own withdrawal record) shows it was this withdrawal's delete.
A withdrawal keeps the images' content out of the pool (the retriever refuses it at ingest); a compaction, which
keeps a near-duplicate of what it removes, passes ``refuse_content=False``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from redis import Redis

from t3ar.clients.retriever import RetrieverClient
from t3ar.clients.retriever_errors import RetrieverNotFoundError
from t3ar_services.api.contrib_store import ContributionStore
from t3ar_services.api.metrics import ApiMetrics
from t3ar_services.common import withdrawn

log = logging.getLogger(__name__)

DELETE_CHUNK = 10_000  # ids per POST /pool/delete


class Withdrawer:
    def __init__(self, records: ContributionStore, admin: Callable[[], RetrieverClient], redis: Redis,
                 metrics: ApiMetrics, sync_lineage: Callable[[], object],
                 on_withdrawn: Callable[[list[str], str], object] | None = None) -> None:
        self.records = records
        self.admin = admin  # the API's admin retriever client, looked up at each use
        self.redis = redis
        self.metrics = metrics
        self.sync_lineage = sync_lineage
        self.on_withdrawn = on_withdrawn  # after the lineage sync: the MLflow registry's stale marks (never raises)

    def withdraw(self, ids: Sequence[str], reason: str, *, missing_ok: bool = False,
                 gone: list[str] | None = None, refuse_content: bool = True) -> list[str]:
        """Delete ``ids`` from the pool (see the module docstring); returns the ids this call deleted.

        ``missing_ok``: an id the pool does not hold counts as gone, else the retriever's not-found error is
        raised (one id: nothing deleted; several: the chunks before it stay deleted). Every id known out of the
        pool (deleted now, or found missing) is recorded with ``reason`` (``delete``, ``contribution:<job id>``,
        ``compaction:<plan id>``), announced to the caches and appended to ``gone`` (read it after an error)."""
        gone = gone if gone is not None else []
        deleted: list[str] = []
        earlier = len(ids) == 1 and self.records.intended(ids[0])  # an attempt that did not finish
        self.records.intend_withdrawals(ids, reason)  # before the delete: a kill after it leaves this behind
        try:
            if len(ids) == 1 and not missing_ok:
                try:
                    self.admin().delete(ids[0])  # a retried DELETE that finds it gone is done
                    deleted.append(ids[0])
                except RetrieverNotFoundError:
                    if not self._interrupted(ids[0], earlier):
                        self.records.drop_intents(ids)
                        raise
                    log.warning("pool id %s: completing a withdrawal interrupted after its delete", ids[0])
                gone.append(ids[0])
            else:
                for start in range(0, len(ids), DELETE_CHUNK):
                    chunk = list(ids[start:start + DELETE_CHUNK])
                    deleted += self.admin().delete_many(chunk, missing_ok=missing_ok, withdraw=refuse_content).deleted
                    gone += chunk  # all or none per call: with missing_ok what it did not delete was gone already
        finally:
            if gone:
                self._after(gone, len(deleted), reason)
        return deleted

    def _interrupted(self, pool_id: str, earlier: bool) -> bool:
        """Whether ``pool_id``, which the pool no longer holds, was deleted by a withdrawal this API did not get to
        record: not recorded here, and the retriever recorded its withdrawal or an earlier attempt's intent is
        still written (``earlier``; a vectors-only item has no withdrawal record at the retriever)."""
        if self.records.withdrawn_at(pool_id) is not None:
            return False  # withdrawn and recorded: the 404 is the answer
        try:
            return earlier or self.admin().withdrawal(pool_id) is not None
        except Exception as e:  # cannot tell: the 404 stands
            log.warning("could not ask the retriever whether %s was withdrawn: %s", pool_id, e)
            return False

    def _after(self, gone: list[str], deleted: int, reason: str) -> None:
        """Never raises: the withdrawal itself is done, and its caller answers with a success."""
        self.metrics.pool_deletes.inc(deleted)
        try:
            self.records.record_withdrawals(gone, reason)
        except Exception:
            log.exception("%d pool id(s) withdrawn (%s) but not recorded", len(gone), reason)
        try:  # an id announced twice (a resumed withdrawal) costs a worker one failed unlink
            withdrawn.publish(self.redis, gone)
        except Exception as e:  # the withdrawal itself succeeded; caches are also bounded and trimmed
            log.warning("could not tell the workers' caches about %d withdrawn id(s): %s", len(gone), e)
        try:
            self.sync_lineage()  # skips (and logs once) a record it cannot index
        except Exception as e:
            log.warning("lineage sync after a withdrawal failed: %s", e)
        if self.on_withdrawn is not None:
            try:
                self.on_withdrawn(gone, reason)
            except Exception:
                log.exception("marking the registered versions that used %d withdrawn id(s) stale failed", len(gone))
