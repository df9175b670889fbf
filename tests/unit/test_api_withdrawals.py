"""The one withdrawal path (issue 34): whatever asks (a single delete, a contribution's withdrawal, a compaction),
:class:`~t3ar_services.api.withdrawals.Withdrawer` deletes, records, tells the workers' caches and syncs lineage;
the feed the caches read stays bounded (fakeredis, a fake admin client; the routes' own tests cover the callers
end to end)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import fakeredis
import pytest
from retriever_answers import item_json

from t3ar.clients.retriever_errors import RetrieverNotFoundError
from t3ar.clients.retriever_models import DeleteResponse, ItemOut, WithdrawnOut
from t3ar_services.api import withdrawals
from t3ar_services.api.compaction import Compactor
from t3ar_services.api.contrib_store import ContributionStore
from t3ar_services.api.contributions import Contributor
from t3ar_services.api.errors import ConflictError
from t3ar_services.api.metrics import ApiMetrics
from t3ar_services.api.store import Store
from t3ar_services.api.withdrawals import Withdrawer
from t3ar_services.common import withdrawn
from t3ar_services.worker.cache import WATERMARK_FILE, ImageCache


class Killed(BaseException):
    """kill -9 of the API, as far as the code after the call is concerned."""


class FakeAdmin:
    """The admin retriever client's delete calls over a set of pool ids."""

    def __init__(self, ids: set[str]) -> None:
        self.ids = ids
        self.calls: list[tuple[str, list[str]]] = []
        self.withdrawn: set[str] = set()  # the retriever's own withdrawal records
        self.die_after_delete = False

    def delete(self, item_id: str) -> None:
        self.calls.append(("delete", [item_id]))
        if item_id not in self.ids:
            raise RetrieverNotFoundError(f"no item {item_id}")
        self.ids.discard(item_id)
        self.withdrawn.add(item_id)
        if self.die_after_delete:
            raise Killed  # the API process dies here: the retriever deleted, the API recorded nothing after

    def withdrawal(self, item_id: str) -> WithdrawnOut | None:
        return WithdrawnOut(id=item_id, sha256="0" * 64, withdrawn_at="") if item_id in self.withdrawn else None

    def delete_many(self, ids: list[str], *, missing_ok: bool = False, withdraw: bool = True) -> DeleteResponse:
        self.calls.append(("delete_many", list(ids)))
        missing = [i for i in ids if i not in self.ids]
        if missing and not missing_ok:
            raise RetrieverNotFoundError(f"no item {missing[0]}")
        deleted = [i for i in ids if i in self.ids]
        self.ids -= set(deleted)
        return DeleteResponse(deleted=deleted, not_found=[i for i in ids if i not in deleted])

    def get_item(self, item_id: str) -> ItemOut:
        if item_id not in self.ids:
            raise RetrieverNotFoundError(f"no item {item_id}")
        return ItemOut.model_validate(item_json(item_id))


@pytest.fixture()
def parts(tmp_path: Path) -> Any:
    redis = fakeredis.FakeRedis()
    admin = FakeAdmin({f"p-{i}" for i in range(10)})
    synced: list[int] = []
    w = Withdrawer(ContributionStore(Store(tmp_path / "api.sqlite3")), lambda: admin, redis, ApiMetrics(),
                   sync_lineage=lambda: synced.append(1))
    return w, admin, redis, synced


def test_one_item_is_deleted_recorded_announced_and_lineage_synced(parts: Any) -> None:
    w, admin, redis, synced = parts
    assert w.withdraw(["p-1"], "delete") == ["p-1"]
    assert admin.calls == [("delete", ["p-1"])]  # the idempotent single delete (a retried DELETE is done)
    assert w.records.withdrawal_reasons(["p-1", "p-2"]) == {"p-1": "delete"}
    assert withdrawn.read(redis, 0).ids == ["p-1"] and synced == [1]
    assert w.metrics.pool_deletes._value.get() == 1
    with pytest.raises(RetrieverNotFoundError):
        w.withdraw(["p-1"], "delete")  # gone already: nothing recorded or announced again
    assert withdrawn.read(redis, 0).ids == ["p-1"] and synced == [1]


def test_a_failure_half_way_records_what_went_before(parts: Any, monkeypatch: Any) -> None:
    w, admin, redis, _ = parts
    monkeypatch.setattr(withdrawals, "DELETE_CHUNK", 2)
    gone: list[str] = []
    with pytest.raises(RetrieverNotFoundError):
        w.withdraw(["p-1", "p-2", "p-3", "nope", "p-4"], "compaction:x", gone=gone)
    assert gone == ["p-1", "p-2"] and admin.ids >= {"p-3", "p-4"}  # all or none per call
    assert w.records.withdrawal_reasons(["p-1", "p-2", "p-3"]) == {"p-1": "compaction:x", "p-2": "compaction:x"}
    assert withdrawn.read(redis, 0).ids == ["p-1", "p-2"]
    # missing_ok (a contribution, also when resumed after a crash): what was gone already counts as withdrawn
    assert w.withdraw(["p-1", "p-3"], "contribution:j", missing_ok=True) == ["p-3"]
    assert w.records.withdrawal_reasons(["p-3"]) == {"p-3": "contribution:j"}
    assert set(withdrawn.read(redis, 0).ids) == {"p-1", "p-2", "p-3"}


def test_compaction_withdraws_through_the_one_path(parts: Any, tmp_path: Path, monkeypatch: Any) -> None:
    w, admin, redis, synced = parts
    contributor = Contributor(Store(tmp_path / "api.sqlite3"), tmp_path, lambda: (admin, admin), w,  # type: ignore
                              job_status=lambda _: "finished")
    compactor = Compactor(contributor, 60)
    plan = {"remove": [{"id": "p-2", "duplicate_of": "p-1"}, {"id": "p-3", "duplicate_of": "p-1"}], "bytes": 7}
    w.records.add_plan("plan-1", {"threshold": 0.9, "sources": ["*"]}, plan)
    assert compactor.apply("plan-1")["removed"] == ["p-2", "p-3"]
    assert w.records.withdrawal_reasons(["p-2", "p-3"]) == {"p-2": "compaction:plan-1", "p-3": "compaction:plan-1"}
    assert withdrawn.read(redis, 0).ids == ["p-2", "p-3"] and synced == [1]
    w.records.add_plan("plan-2", {}, {"remove": [{"id": "p-4", "duplicate_of": "p-5"},
                                                   {"id": "p-3", "duplicate_of": "p-5"}]})
    monkeypatch.setattr(withdrawals, "DELETE_CHUNK", 1)
    with pytest.raises(ConflictError, match="1 listed item"):
        compactor.apply("plan-2")  # p-3 went meanwhile: p-4 (before it) was removed and is recorded
    assert w.records.withdrawal_reasons(["p-4"]) == {"p-4": "compaction:plan-2"}


def test_the_feed_is_bounded_and_a_cache_behind_its_floor_drops_everything() -> None:
    redis = fakeredis.FakeRedis()
    withdrawn.publish(redis, ["a", "b", "c"], keep=4)
    first = withdrawn.read(redis, 0)
    assert (first.ids, first.upto, first.reset) == (["a", "b", "c"], 3, False)
    withdrawn.publish(redis, ["d", "e"], keep=4)
    assert withdrawn.read(redis, first.upto).ids == ["d", "e"]  # only what is new since the watermark
    assert redis.zcard(withdrawn.LOG_KEY) == 4  # trimmed to the newest `keep`
    behind = withdrawn.read(redis, 0)  # "a" was trimmed: a cache that never saw it cannot know it
    assert behind.reset and behind.upto == 5
    assert not withdrawn.read(redis, 1).reset and withdrawn.read(redis, 1).ids == ["b", "c", "d", "e"]


def test_a_worker_cache_forgets_only_what_is_new_and_everything_after_a_gap(tmp_path: Path) -> None:
    redis = fakeredis.FakeRedis()
    cache = ImageCache(tmp_path / "cache", 1 << 20)
    for pid in ("a", "b", "c"):
        cache.put(pid, b"img")
    withdrawn.publish(redis, ["a"], keep=2)
    assert cache.forget_withdrawn(redis) == 1 and cache.get("a") is None and cache.get("b") == b"img"
    assert (cache.root / WATERMARK_FILE).read_text() == "1"
    assert cache.forget_withdrawn(redis) == 0  # nothing new: nothing read again
    withdrawn.publish(redis, ["b"], keep=2)
    withdrawn.publish(redis, ["x", "y"], keep=2)  # "b" trimmed before this cache read it
    assert cache.forget_withdrawn(redis) == 2 and cache.get("b") is None and cache.get("c") is None
    assert (cache.root / WATERMARK_FILE).read_text() == "4"


def test_a_withdrawal_killed_after_the_delete_is_completed_by_its_retry(parts: Any) -> None:
    """N5 (issue 50): the record is written before the delete at the retriever; the retry finds the item gone
    (404 there) and completes the withdrawal (recorded, announced) rather than answering 404."""
    w, admin, redis, _ = parts
    admin.die_after_delete = True
    with pytest.raises(Killed):
        w.withdraw(["p-1"], "delete")
    assert "p-1" not in admin.ids and not w.records.withdrawal_reasons(["p-1"])  # deleted there, not recorded
    admin.die_after_delete = False
    admin.withdrawn.clear()  # the retriever's own record aside: the API's intent, written first, is enough
    assert w.withdraw(["p-1"], "delete") == []  # the retry: nothing left to delete, and no 404
    assert w.records.withdrawal_reasons(["p-1"]) == {"p-1": "delete"} and not w.records.intended("p-1")
    assert withdrawn.read(redis, 0).ids == ["p-1"]
    with pytest.raises(RetrieverNotFoundError):
        w.withdraw(["p-1"], "delete")  # recorded now: a third call is the ordinary 404
    with pytest.raises(RetrieverNotFoundError):
        w.withdraw(["nope"], "delete")  # never in the pool: 404, and no intent left behind
    assert not w.records.intended("nope")


def test_a_withdrawal_the_retriever_recorded_but_the_api_did_not_is_completed(parts: Any) -> None:
    """N5: even without this API's intent (an older API, a delete straight at the retriever), the retriever's own
    withdrawal record completes it."""
    w, admin, redis, _ = parts
    admin.delete("p-2")
    assert w.withdraw(["p-2"], "delete") == []
    assert w.records.withdrawal_reasons(["p-2"]) == {"p-2": "delete"}
