"""Continual adaptation through the real stack (its own `t3ar up`: real Redis, retriever, API, worker):
a finished job's target joins the pool under ``target:<job id>`` (exact and near-duplicates skipped and
counted, a retry adds nothing twice), a later job retrieves it and says so, withdrawing the contribution
removes every item for good (also after restarting the stack) and answers with that later job; compaction's
dry-run changes nothing and its real run removes exactly what the dry-run listed; bad input is a clear 4xx.
"""

from __future__ import annotations

import sqlite3
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import stack_helpers
from stack_helpers import FAST_JOB, LONG_JOB, Stack, tiny_checkpoint, wait_for

from t3ar.clients.api import ApiAuthError, ApiInputError, ApiNotFoundError
from t3ar.clients.api_models import Contribution
from t3ar.clients.retriever_errors import RetrieverNotFoundError
from t3ar_bench.retrieval.service import shapes_png

pytestmark = pytest.mark.slow


def unlabelled_zip(path: Path, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


@contextmanager
def running_stack(data: Path) -> Iterator[Stack]:
    """The shared `t3ar up` of the e2e tests with R at its default image size (the near-duplicate thresholds above
    are about it) and the workers' default heartbeats; the data directory survives restarts."""
    with stack_helpers.running_stack(data, {"T3AR_RETRIEVER_EMBEDDER_IMAGE_SIZE": None,
                                            "T3AR_WORKER_MONITOR_INTERVAL": None, "T3AR_WORKER_ABANDON_GRACE": None,
                                            "T3AR_API_SWEEP_INTERVAL": "0.5"}, start_timeout=600) as stack:
        yield stack


def _contribution(api: Any, job_id: str, want: str = "done", stack: Stack | None = None) -> Contribution:
    """Wait for a job's contribution to reach ``want``. The API makes it in its background sweep through the
    retriever (embedding the target), which on two busy cores can take a while: on a timeout, say what the API
    logged about it."""
    try:
        found: Contribution = wait_for(lambda: (c := api.job(job_id).contribution).status == want and c, 180,
                                       f"contribution of {job_id} {want}")
        return found
    except AssertionError as e:
        if stack is None:
            raise
        lines = [ln for ln in stack.log("api").splitlines() if "contribut" in ln or "Traceback" in ln]
        raise AssertionError(f"{e}; now {api.job(job_id).contribution}; the API logged:\n"
                             + "\n".join(lines[-30:])) from e


def _never_returned(rc: Any, images: list[bytes], ids: set[str]) -> None:
    """Query with the images' own embeddings for every item of the pool: none of ``ids`` comes back."""
    k = int(rc.stats().count)
    res = rc.search(rc.embed(images), k=max(k, 1))
    assert not ids & {i for row in res.ids for i in row}
    for pid in ids:
        with pytest.raises(RetrieverNotFoundError):
            rc.get_item(pid)


def test_contribute_withdraw_compact_and_restart(tmp_path: Path) -> None:
    data = tmp_path / "stack"
    data.mkdir()
    pool_imgs = {f"pool-{s}.png": shapes_png(s) for s in range(20, 44)}
    target_imgs = {f"t/{s}.png": shapes_png(s) for s in range(0, 8)}
    offered = {**target_imgs, "t/copy-of-pool.png": pool_imgs["pool-20.png"],
               "t/near-pool.png": shapes_png(21, nudge=True)}
    zip_a = unlabelled_zip(tmp_path / "a.zip", offered)
    job = {**FAST_JOB, "mode": "test", "k": 3, "r": 1, "fraction": 1.0}  # r = 1: the exact match is always used

    with running_stack(data) as stack, stack.api() as api, stack.api("admin") as admin, stack.retriever() as rc:
        model_id = api.upload_model(tiny_checkpoint(tmp_path / "base.pt"), "tiny").id
        added = rc.add_images(list(pool_imgs.items()), source="clipart")
        assert added.added == len(pool_imgs), added
        pool_before = int(rc.stats().count)

        # --- bad input: the option is validated like any other field; unknown job; not admin ---------------
        with pytest.raises(ApiNotFoundError):
            admin.withdraw_contribution("no-such-job")
        with pytest.raises(ApiAuthError):
            api.withdraw_contribution("no-such-job")

        # --- a job that contributes: after it finished, its target is in the pool -------------------------
        a = api.adapt(zip_a, model_id, job, contribute=True)
        assert a.contribute is True
        assert api.wait(a.id, poll=0.2, timeout=180).status == "finished"
        c = _contribution(api, a.id, stack=stack)
        assert c.source == f"target:{a.id}" and c.images == len(offered)
        assert (c.added, c.skipped_exact, c.skipped_near) == (len(target_imgs), 1, 1), c
        mine = list(rc.iter_items(source=f"target:{a.id}"))
        assert len(mine) == len(target_imgs) and all(it.metadata["job_id"] == a.id for it in mine)
        assert int(rc.stats().count) == pool_before + len(target_imgs)
        res = rc.search(rc.embed(list(target_imgs.values())), k=1)
        assert {row[0] for row in res.ids} == {it.id for it in mine}  # searchable, each finds itself

        # a retried contribution adds nothing twice: make the API run it again
        db = sqlite3.connect(data / "api" / "api.sqlite3")
        with db:
            db.execute("UPDATE contributions SET status = 'pending', added = NULL WHERE job_id = ?", (a.id,))
        db.close()
        again = _contribution(api, a.id, stack=stack)
        assert (again.added, again.skipped_exact, again.skipped_near) == (len(target_imgs), 1, 1)
        assert int(rc.stats().count) == pool_before + len(target_imgs)

        # --- a later job on the same pictures retrieves the contribution and says so --------------------
        b = api.adapt(unlabelled_zip(tmp_path / "b.zip", target_imgs), model_id, job)
        assert b.contribute is False
        jb = api.wait(b.id, poll=0.2, timeout=180)
        assert jb.status == "finished" and jb.contribution.status == "not_requested"
        used = {n.job_id: n.items_used for n in jb.neighbours_from_contributions}
        assert used.get(a.id, 0) >= 1, jb
        report = api.report(b.id)
        assert report.neighbours_from_contributions == jb.neighbours_from_contributions
        assert api.report(a.id).contribution.added == len(target_imgs)

        # --- a running job cannot be withdrawn from; canceled, it contributes nothing ---------------------
        long = api.adapt(zip_a, model_id, {**LONG_JOB, "mode": "test", "k": 3}, contribute=True)
        wait_for(lambda: api.job(long.id).status == "started", 120, "the long job to start")
        with pytest.raises(ApiInputError, match="contributes to the pool once it finishes") as e:
            admin.withdraw_contribution(long.id)
        assert e.value.status == 409
        api.cancel(long.id)
        assert api.wait(long.id, poll=0.2, timeout=120).status == "canceled"
        assert _contribution(api, long.id, "none", stack=stack).added is None
        assert list(rc.iter_items(source=f"target:{long.id}")) == []
        with pytest.raises(ApiInputError, match="contributed nothing"):
            admin.withdraw_contribution(long.id)
        with pytest.raises(ApiInputError, match="not submitted with contribute"):
            admin.withdraw_contribution(b.id)

        # --- withdraw the contribution as one unit --------------------------------------------------------
        ids = {it.id for it in mine}
        out = admin.withdraw_contribution(a.id)
        assert set(out.withdrawn) == ids and out.source == f"target:{a.id}"
        assert b.id in [j.job_id for j in out.jobs] and a.id not in [j.job_id for j in out.jobs]
        assert all(j.readapt_url.endswith(f"/jobs/{j.job_id}/readapt") for j in out.jobs)
        _never_returned(rc, list(target_imgs.values()), ids)
        blobs = data / "retriever"
        assert not [p for p in blobs.rglob("*") if p.is_file() and p.name in {it.sha256 for it in mine}]
        assert api.job(a.id).contribution.status == "withdrawn"
        with pytest.raises(ApiNotFoundError, match="already withdrawn"):
            admin.withdraw_contribution(a.id)
        assert any(b.id in [j.job_id for j in api.lineage(i).jobs] for i in ids)
        redo = api.readapt(b.id)
        assert api.wait(redo.id, poll=0.2, timeout=180).status == "finished"
        assert api.job(redo.id).neighbours_from_contributions == []

        # --- compaction: near-duplicates of source "copies"; dry-run changes nothing ----------------------
        copies = rc.add_images([(f"copy-{s}.png", shapes_png(s, nudge=True)) for s in (30, 31, 32)],
                               source="copies", duplicate_policy="keep")
        copy_ids = {it.id for it in copies.items}
        count = int(rc.stats().count)
        for bad in (0.0, 1.5, -1):
            with pytest.raises(ApiInputError) as e:
                admin.compact(threshold=bad, sources=["copies"])
            assert e.value.status == 422
        with pytest.raises(ApiAuthError):
            api.compact(threshold=0.99, sources=["copies"])
        with pytest.raises(ApiNotFoundError):
            admin.compact(plan_id="no-such-plan")
        dry = admin.compact(threshold=0.99, sources=["copies"])
        assert dry.dry_run is True and {r.id for r in dry.remove} == copy_ids
        assert all(r.source == "copies" and r.score >= 0.99 for r in dry.remove)
        assert dry.bytes_freed == sum(r.size for r in dry.remove) > 0
        assert int(rc.stats().count) == count and all(rc.get_item(i) for i in copy_ids)
        other = admin.compact(threshold=0.99, sources=["clipart"])  # the other way round: the originals would go
        assert {r.duplicate_of for r in other.remove} == copy_ids and len(other.remove) == len(copy_ids)
        real = admin.compact(plan_id=dry.plan_id)
        assert real.dry_run is False and [r.id for r in real.remove] == [r.id for r in dry.remove]
        assert int(rc.stats().count) == count - len(copy_ids)
        _never_returned(rc, [shapes_png(s, nudge=True) for s in (30, 31, 32)], copy_ids)
        with pytest.raises(ApiInputError, match="already applied"):
            admin.compact(plan_id=dry.plan_id)
        kept_after = int(rc.stats().count)

    # --- restart the whole stack on the same data: nothing withdrawn comes back -------------------------------
    with running_stack(data) as stack, stack.api() as api, stack.retriever() as rc:
        wait_for(rc.ready, 120, "the retriever after the restart")
        assert int(rc.stats().count) == kept_after
        _never_returned(rc, list(target_imgs.values()), ids)
        _never_returned(rc, [shapes_png(s, nudge=True) for s in (30, 31, 32)], copy_ids)
        assert api.job(a.id).contribution.status == "withdrawn"
        assert any(b.id in [j.job_id for j in api.lineage(i).jobs] for i in ids)
