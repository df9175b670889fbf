"""Neighbour quality in a job's report (issue 52): the console's job page shows it, the report's summary and
`t3ar jobs show`'s line say it, an old report without it still reads, and a bad one is refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from console_kit import client as client  # the fixtures
from console_kit import finished_job, signed_in
from console_kit import pool as pool
from fastapi.testclient import TestClient
from pydantic import ValidationError

from t3ar.clients.job_report import JobReport, report_summary
from t3ar_services.common.job_contract import REPORT_FILE, artifacts_dir, write_json_atomic

QUALITY: dict[str, Any] = {
    "ranking": "class-conditional", "k": 5, "neighbours": 40,
    "pseudo_label_agreement": {"share": 0.75, "matches": 30, "labelled": 40, "queries": 8},
    "precision_at_k": {"share": 0.5, "matches": 10, "labelled": 20, "queries": 4}, "precision_on": "holdout",
    "hit_rate": 0.75, "sources": {"emoji-google": 30, "tux-paint": 10}}


def test_the_summary_names_the_neighbour_quality_and_an_old_report_reads() -> None:
    text = report_summary(JobReport(job_id="j", neighbour_quality=QUALITY))  # type: ignore[arg-type]
    assert ("neighbour quality (class-conditional, k=5, 40 drawn): labelled neighbours with the image's pseudo-label "
            "75.0 % (30 of 40 labelled neighbours of 8 images)") in text
    assert ("precision@5 on the holdout's true labels 50.0 % (10 of 20 labelled neighbours of 4 images); "
            "hit rate 75.0 %") in text
    assert "neighbours by pool source: emoji-google 30, tux-paint 10" in text
    assert JobReport(job_id="old").neighbour_quality is None
    # sources in name order (as a record read back from JSON may hold them) print the most first
    by_name = {**QUALITY, "sources": {"a-clipart": 2, "b-openmoji": 9, "c-fluent": 9}}
    text = report_summary(JobReport(job_id="j", neighbour_quality=by_name))  # type: ignore[arg-type]
    assert "neighbours by pool source: b-openmoji 9, c-fluent 9, a-clipart 2" in text


def test_a_share_out_of_range_is_refused() -> None:
    bad = {**QUALITY, "hit_rate": 1.5}
    with pytest.raises(ValidationError):
        JobReport(job_id="j", neighbour_quality=bad)  # type: ignore[arg-type]


def test_the_job_page_shows_the_neighbour_quality(client: TestClient, tmp_path: Path) -> None:
    csrf = signed_in(client)
    job_id = finished_job(client, tmp_path, csrf)
    path = artifacts_dir(tmp_path / "data", job_id) / REPORT_FILE
    write_json_atomic(path, {**json.loads(path.read_text()), "neighbour_quality": QUALITY})
    page = client.get(f"/ui/jobs/{job_id}")
    assert page.status_code == 200
    section = page.text[page.text.index('id="neighbour-quality"'):]
    assert "<th>with the pseudo-label</th><td>75.0 % (30 of 40 labelled, 8 images)</td>" in section
    assert "<th>precision@5 (holdout)</th><td>50.0 % (10 of 20 labelled, 4 images)</td>" in section
    assert "emoji-google 30, tux-paint 10" in section
    report = client.get(f"/jobs/{job_id}/report", headers={"Authorization": "Bearer user-t"}).json()
    assert report["neighbour_quality"]["precision_at_k"]["share"] == 0.5


def test_jobs_show_prints_the_neighbour_quality_from_the_jobs_result() -> None:
    from t3ar.cli.job_cmd import _summary
    from t3ar.clients.api_models import JobOut

    job = JobOut.model_validate({"id": "j1", "url": "http://api/jobs/j1", "status": "finished", "model_id": "m",
                                 "created_at": "2026", "config": {"method": "t3ar"},
                                 "target": {"images": 9, "labelled": False, "skipped": 0},
                                 "contribution": {"requested": False, "status": "not_requested"},
                                 "result": {"neighbour_quality": QUALITY}})
    text = _summary(job)
    assert "\n    neighbour quality (class-conditional, k=5, 40 drawn)" in text
    assert "\n    precision@5 on the holdout's true labels 50.0 %" in text
