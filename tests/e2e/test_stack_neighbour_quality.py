"""Neighbour quality through the real stack (`t3ar up`: real Redis, retriever, API, worker; issue 52): a job with
class-conditional retrieval over a labelled archive reports how good its neighbours were (pseudo-label
agreement, precision on its labelled target, the neighbours by pool source) in its result (``GET /jobs/{id}``)
and its report; so does a job with the ranking the mixed-pool benchmark's validation chose (the index's, the
default: docs/benchmarks/mixed-pool.md); an archive item withdrawn before a job never reaches it through either."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from stack_helpers import CLASSES, FAST_JOB, png, running_stack, target_zip, tiny_checkpoint

pytestmark = pytest.mark.slow
ENV = {"T3AR_RETRIEVER_DUPLICATE_THRESHOLD": "0.99999"}


def test_a_class_conditional_job_reports_its_neighbour_quality(tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    with running_stack(tmp_path / "stack", ENV) as stack, stack.api() as api, stack.api("admin") as admin, \
            stack.retriever() as rc:
        model_id = api.upload_model(tiny_checkpoint(tmp_path / "base.pt"), "tiny").id
        archive: list[str] = []
        for c in CLASSES:
            rep = rc.add_images([(f"{c}{i}.png", png(c, rng)) for i in range(5)], source="archive", label=c)
            archive += [str(it.id) for it in rep.items if it.status == "added"]
        rc.add_images([(f"u{i}.png", png("red", rng)) for i in range(5)], source="unlabelled")
        withdrawn = archive[0]
        admin.delete_pool_item(withdrawn)  # withdrawn through the API, before the job

        cfg = {**{k: v for k, v in FAST_JOB.items() if k not in ("k", "r")}, "mode": "test", "fraction": 1.0,
               "retrieval": {"k": 3, "r": 1, "ranking": "class-conditional", "min_confidence": 0.0},
               "pool_labels": {"weight": 1.0}}
        job = api.adapt(target_zip(tmp_path / "t.zip", per_class=3, seed=3), model_id, cfg)
        done = api.wait(job.id, poll=0.2, timeout=300)
        assert done.status == "finished", done
        assert done.result is not None and done.result.neighbour_quality is not None
        quality = done.result.neighbour_quality.model_dump()
        assert quality["ranking"] == "class-conditional" and quality["k"] == 3
        assert quality["neighbours"] == 3 * 3 * len(CLASSES)
        agree = quality["pseudo_label_agreement"]
        # min_confidence 0, r 1: each image's 3 neighbours are items of its pseudo-label (4 or 5 of each class)
        assert agree["labelled"] == quality["neighbours"] and agree["matches"] == agree["labelled"]
        assert quality["precision_on"] == "target" and quality["precision_at_k"]["labelled"] == agree["labelled"]
        assert set(quality["sources"]) == {"archive"}
        report = api.report(job.id)
        assert report.neighbour_quality is not None and report.neighbour_quality.model_dump() == quality
        assert all(withdrawn != n.id for row in report.neighbour_sample for n in row.neighbours)

        # the option validation chose on the mixed pool: the index's ranking (the default), the labels as data
        chosen = {**{k: v for k, v in FAST_JOB.items() if k not in ("k", "r")}, "mode": "test", "fraction": 1.0,
                  "retrieval": {"k": 3, "r": 1}, "pool_labels": {"weight": 1.0}}
        job2 = api.adapt(target_zip(tmp_path / "t2.zip", per_class=3, seed=4), model_id, chosen)
        done2 = api.wait(job2.id, poll=0.2, timeout=300)
        assert done2.status == "finished", done2
        assert done2.result is not None and done2.result.neighbour_quality is not None
        q2 = done2.result.neighbour_quality.model_dump()
        assert q2["ranking"] == "index" and q2["k"] == 3 and q2["neighbours"] == 3 * 3 * len(CLASSES)
        # the index ranks all 40 items: labelled and unlabelled neighbours; every labelled one is counted
        assert 0 < q2["pseudo_label_agreement"]["labelled"] <= q2["neighbours"]
        assert q2["precision_on"] == "target"
        assert set(q2["sources"]) <= {"archive", "unlabelled"} and sum(q2["sources"].values()) == q2["neighbours"]
        report2 = api.report(job2.id)
        assert all(withdrawn != n.id for row in report2.neighbour_sample for n in row.neighbours)
