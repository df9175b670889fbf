"""A labelled pool through the real stack (`t3ar up`: real Redis, retriever, API, worker; issue 33): a job whose
config turns labelled neighbours on reports which neighbours served as labelled data, with their labels (its
result, ``GET /jobs/{id}`` and its report say the same); a **train-time** job's contribution joins the pool with
its target's classes as labels, a test-time job's contribution unlabelled (its pseudo-labels never become labels);
withdrawing the labelled contribution removes it as it removes any; lineage and readapt work as for any job.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from stack_helpers import CLASSES, FAST_JOB, png, running_stack, target_zip, tiny_checkpoint, wait_for

from t3ar.clients.retriever_errors import RetrieverNotFoundError

pytestmark = pytest.mark.slow
# near-duplicates of each other are common among the small noisy images: keep them all (exact repeats still skip)
ENV = {"T3AR_RETRIEVER_DUPLICATE_THRESHOLD": "0.99999"}


def _contributed(api: object, rc: object, job_id: str) -> list[Any]:
    wait_for(lambda: api.job(job_id).contribution.status == "done", 180,  # type: ignore[attr-defined]
             f"the contribution of {job_id}")
    return list(rc.iter_items(source=f"target:{job_id}"))  # type: ignore[attr-defined]


def test_labelled_neighbours_are_reported_and_train_time_contributions_carry_labels(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    with running_stack(tmp_path / "stack", ENV) as stack, stack.api() as api, stack.api("admin") as admin, \
            stack.retriever() as rc:
        model_id = api.upload_model(tiny_checkpoint(tmp_path / "base.pt"), "tiny").id
        archive: dict[str, str] = {}
        for c in CLASSES:  # a labelled archive: every image carries its class
            rep = rc.add_images([(f"{c}{i}.png", png(c, rng)) for i in range(6)], source="archive", label=c)
            archive |= {it.id: c for it in rep.items if it.status == "added"}
        rc.add_images([(f"u{i}.png", png("red", rng)) for i in range(6)], source="unlabelled")
        assert rc.stats().labels == {c: 6 for c in CLASSES}

        # --- a train-time job with labelled neighbours as data, contributing its labelled target --------------
        cfg = {**FAST_JOB, "mode": "train", "fraction": 1.0, "k": 4, "r": 1, "pool_label_weight": 1.0}
        a = api.adapt(target_zip(tmp_path / "a.zip", per_class=4, seed=1), model_id, cfg, contribute=True)
        ja = api.wait(a.id, poll=0.2, timeout=300)
        assert ja.status == "finished", ja
        report = api.report(a.id)
        served = report.labelled_neighbours
        assert served and report.labelled_neighbours_total == len(served)
        for use in served:  # each names a labelled archive item and the label it carries in the pool
            assert archive[use.pool_id] == use.label and use.uses >= 1
        assert ja.result.labelled_neighbours == served[:20]
        assert ja.result.labelled_neighbours_total == len(served)
        per_label: dict[str, int] = {}
        for use in served:
            per_label[use.label] = per_label.get(use.label, 0) + 1
        assert ja.result.labelled_per_label == per_label  # all of them, not the 20 the result lists

        # lineage as today: a labelled neighbour's lineage names the job; a readapt reruns with the same labels
        assert a.id in {j.job_id for j in api.lineage(served[0].pool_id).jobs}
        again = api.readapt(a.id)
        jr = api.wait(again.id, poll=0.2, timeout=300)
        assert jr.status == "finished" and jr.parent_id == a.id, jr
        # (its neighbours may include job a's own contribution, which joined the pool labelled meanwhile)
        for use in api.report(again.id).labelled_neighbours:
            assert rc.get_item(use.pool_id).label == use.label

        mine = _contributed(api, rc, a.id)
        assert len(mine) == 4 * len(CLASSES)
        for it in mine:  # images/<class>-<i>.png, labelled by the target's labels.csv
            assert it.label == str(it.filename).split("/")[-1].split("-")[0], it
        assert rc.list_items(source=f"target:{a.id}", label="red").total == 4

        # --- a test-time job's contribution carries no label, even with a labelled target archive -----------
        b = api.adapt(target_zip(tmp_path / "b.zip", per_class=2, seed=2), model_id,
                      {**FAST_JOB, "mode": "test", "fraction": 1.0}, contribute=True)
        assert api.wait(b.id, poll=0.2, timeout=300).status == "finished"
        theirs = _contributed(api, rc, b.id)
        assert theirs and all(it.label is None for it in theirs)

        # --- withdrawing the labelled contribution removes it, labels and all -----------------------------
        gone = admin.withdraw_contribution(a.id)
        assert sorted(gone.withdrawn) == sorted(str(it.id) for it in mine)
        assert rc.list_items(source=f"target:{a.id}").total == 0
        with pytest.raises(RetrieverNotFoundError):
            rc.get_item(str(mine[0].id))
        assert rc.stats().labels == {c: 6 for c in CLASSES}
