"""A job with an acceptance holdout through the embedded stack: POST /adapt with a holdout part, the worker scores
its candidates on it, and the acceptance record comes back from GET /jobs/{id}, the report, the checkpoint and the
console's job page."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import httpx
import numpy as np
from stack_helpers import CLASSES, FAST_JOB, Stack, fast_job, png

from t3ar.models.checkpoint import read_info


def _holdout_zip(path: Path) -> Path:
    rng = np.random.default_rng(77)  # other images than the target's (seed 0)
    with zipfile.ZipFile(path, "w") as zf:
        for c in CLASSES:
            for i in range(2):
                zf.writestr(f"{c}/h{i}.png", png(c, rng))
    return path


def test_a_job_with_a_holdout_returns_the_winner(stack: Stack, model_id: str, pool_ids: list[str],
                                                 labelled_zip: Path, tmp_path: Path) -> None:
    holdout = _holdout_zip(tmp_path / "holdout.zip")
    with stack.api() as api:
        # the job's method does not retrieve, a candidate does: the worker still reaches the pool for it
        accepted = api.adapt(labelled_zip, model_id, fast_job("tent", mode="test"), holdout=holdout,
                             candidates=["t3ar", "tent", "bn-adapt", "source"], winner_rule="argmax")
        job = api.wait(accepted.id, poll=0.2, timeout=240)
        assert job.status == "finished", job
        acc = job.acceptance
        assert acc.n == 6 and acc.rule == "argmax" and acc.require_gain is False
        names = [c.name for c in acc.candidates]
        assert names == ["source", "bn-adapt", "t3ar", "tent"]
        assert acc.winner in names and job.result.winner == acc.winner
        for c in acc.candidates:
            assert 0 <= c.ci[0] <= c.top1 <= c.ci[1] <= 1 and c.n == 6
            assert c.seconds is not None and c.seconds >= 0
        assert acc.candidates[0].vs_source is None and acc.candidates[2].vs_source is not None
        assert acc.candidates[3].vs_bn_adapt is not None
        best = max(c.top1 for c in acc.candidates)  # argmax: the simplest of the best
        assert acc.winner == next(c.name for c in acc.candidates if c.top1 == best)
        report = api.report(accepted.id)
        assert report.acceptance == acc
        # the checkpoint is the winner's, and carries the record in its metadata
        info = read_info(api.download_checkpoint(accepted.id, tmp_path / "won.pt"))
        assert info.lineage.method == acc.winner and info.metrics["acceptance"]["winner"] == acc.winner
        assert (info.lineage.pool_ids == ()) == (acc.winner != "t3ar")
        # each candidate's pool use comes back whoever won (the job's result holds the winner's alone)
        used = {c.name: c for c in acc.candidates}
        assert used["t3ar"].pool_ids_used and used["t3ar"].neighbour_quality is not None
        assert used["t3ar"].neighbour_quality.neighbours > 0
        assert all(used[n].pool_ids_used == 0 and used[n].neighbour_quality is None
                   for n in ("source", "bn-adapt", "tent"))
        assert job.result.pool_ids_used == used[acc.winner].pool_ids_used
        # a holdout image that is also a target image is refused before anything is queued
        with zipfile.ZipFile(labelled_zip) as zf:
            member = next(n for n in zf.namelist() if n.endswith(".png"))
            overlap = zf.read(member)
        bad = tmp_path / "overlap.zip"
        with zipfile.ZipFile(bad, "w") as zf:
            zf.writestr("red/copy.png", overlap)
        try:
            api.adapt(labelled_zip, model_id, {**FAST_JOB, "mode": "test"}, holdout=bad)
            raise AssertionError("an overlapping holdout was accepted")
        except Exception as e:  # an ApiInputError (422)
            assert "also in the target" in str(e), e
    # the console's job page shows the candidates' table and the winner
    base = stack.info["api_url"]
    with httpx.Client(base_url=base, timeout=30) as web:
        page = web.get("/ui/login")
        csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert csrf, page.text[:500]
        signed = web.post("/ui/login", data={"csrf": csrf.group(1), "token": stack.info["tokens"]["api_token"],
                                             "next": "/ui/jobs"}, follow_redirects=False)
        assert signed.status_code == 303, signed.text[:500]
        html = web.get(f"/ui/jobs/{accepted.id}").text
    assert 'id="acceptance"' in html and "Acceptance on the holdout (6 images)" in html
    table = html[html.index('id="acceptance"'):]
    table = table[:table.index("</table>")]
    assert all(f"<td>{n}</td>" in table for n in names)
    assert re.search(r'<tr class="winner"><td>' + re.escape(acc.winner) + "</td>", table)
