"""Reversible adaptation: DELETE /pool/{id} answers with the lineage, the id is never retrieved again, and a
readapt produces a checkpoint whose lineage lacks it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from stack_helpers import FAST_JOB, Stack

from t3ar.clients.api import ApiNotFoundError
from t3ar.models.checkpoint import load_checkpoint


def test_withdraw_returns_lineage_and_readapt_excludes_it(stack: Stack, model_id: str, pool_ids: list[str],
                                                           labelled_zip: Path, tmp_path: Path) -> None:
    with stack.api() as api, stack.api("admin") as admin:
        first = api.adapt(labelled_zip, model_id, {**FAST_JOB, "mode": "test"})
        assert api.wait(first.id, poll=0.2, timeout=180).status == "finished"
        _, info = load_checkpoint(api.download_checkpoint(first.id, tmp_path / "first.pt"))
        victim = info.lineage.pool_ids[0]

        before = api.lineage(victim)
        assert first.id in [j.job_id for j in before.jobs]

        out = admin.delete_pool_item(victim)
        assert out.deleted is True and out.pool_id == victim
        entry = next(j for j in out.jobs if j.job_id == first.id)
        assert entry.checkpoint_url.endswith(f"/jobs/{first.id}/checkpoint")
        assert entry.model_id == model_id

        with pytest.raises(ApiNotFoundError, match="already withdrawn"):
            admin.delete_pool_item(victim)

        # the retriever never returns it again, whatever the query
        with stack.retriever() as rc:
            dim = int(rc.stats().dim)
            queries = np.random.default_rng(0).standard_normal((16, dim)).astype(np.float32)
            res = rc.search(queries / np.linalg.norm(queries, axis=1, keepdims=True), k=len(pool_ids))
            assert all(victim not in row for row in res.ids)

        again = api.readapt(first.id)
        assert again.parent_id == first.id and again.config == first.config
        job = api.wait(again.id, poll=0.2, timeout=180)
        assert job.status == "finished" and job.parent_id == first.id
        _, info2 = load_checkpoint(api.download_checkpoint(again.id, tmp_path / "again.pt"))
        assert victim not in info2.lineage.pool_ids
        assert info2.lineage.target_sha256 == info.lineage.target_sha256
        assert again.id not in [j.job_id for j in api.lineage(victim).jobs]
