"""Which pool images carry which label (``--labels folders`` / a CSV), and how the neighbours that served as
labelled data are reported (issue 33)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from t3ar.clients.job_report import MAX_LABELLED_LISTED, JobReport, LabelledNeighbour, labelled_summary
from t3ar.data.pool_labels import folder_label, read_label_csv, resolve_pool_labels
from t3ar.errors import DatasetError

RELS = ["cat/a.png", "cat/deep/b.png", "dog/c.png", "loose.png"]


def test_folders_label_an_image_by_its_top_folder_and_a_loose_image_not_at_all() -> None:
    assert resolve_pool_labels(RELS, "folders").labels == ["cat", "cat", "dog", None]
    assert folder_label("x.png") is None and folder_label("a b/x.png") == "a b"


def test_a_folder_name_that_cannot_be_a_label_is_refused() -> None:
    with pytest.raises(DatasetError, match="cannot be a label"):
        resolve_pool_labels([" cat/a.png"], "folders")


def test_a_csv_labels_the_paths_it_names_and_leaves_the_rest_unlabelled(tmp_path: Path) -> None:
    csv = tmp_path / "labels.csv"
    csv.write_text("path,label\ncat/a.png,tabby\n./dog/c.png , dog\nloose.png,\nmissing.png,fox\n\n")
    got = resolve_pool_labels(RELS, str(csv))
    assert got.labels == ["tabby", None, "dog", None] and got.unmatched == ["missing.png"] and got.labelled == 2


@pytest.mark.parametrize(("text", "match"), [("a.png,x,y\n", "two columns"), ("a.png,x\na.png,y\n", "two labels"),
                                             ("a.png,\x01\n", "printable"), (",x\n", "empty")])
def test_a_bad_csv_row_is_named(tmp_path: Path, text: str, match: str) -> None:
    csv = tmp_path / "l.csv"
    csv.write_text(text)
    with pytest.raises(DatasetError, match=match):
        read_label_csv(csv)


def test_neither_folders_nor_a_file_is_refused() -> None:
    with pytest.raises(DatasetError, match="folders"):
        resolve_pool_labels(RELS, "folder")


def test_the_report_lists_labelled_neighbours_and_the_summary_names_them() -> None:
    uses = [LabelledNeighbour(pool_id=f"p-{i}", label="dog" if i % 3 else "cat", uses=i + 1) for i in range(12)]
    report = JobReport(job_id="j", labelled_neighbours=uses, labelled_neighbours_total=30)
    again = JobReport.model_validate(report.model_dump(mode="json"))
    assert again.labelled_neighbours == uses and JobReport(job_id="j").labelled_neighbours == []
    line = labelled_summary([u.model_dump() for u in uses], total=30)
    assert line.startswith("30 pool neighbours served as labelled data (dog 8, cat 4 among the 12 listed)")
    assert "p-0 (cat, 1 step)" in line and "p-1 (dog, 2 steps)" in line and "and 20 more" in line
    with pytest.raises(ValidationError):
        LabelledNeighbour(pool_id="p", label="x", uses=0)
    with pytest.raises(ValidationError):
        JobReport(job_id="j", labelled_neighbours=[uses[0]] * (MAX_LABELLED_LISTED + 1))


JOB = {"id": "j1", "url": "http://api/jobs/j1", "status": "finished", "model_id": "m", "created_at": "2026",
                   "config": {"method": "t3ar"}, "target": {"images": 4, "labelled": False, "skipped": 0},
                   "contribution": {"requested": False, "status": "not_requested"}}


def test_job_status_lines_name_the_labelled_neighbours() -> None:
    """``t3ar submit`` / ``t3ar jobs show`` print the job's result: which neighbours served as labelled data."""
    from t3ar.cli.job_cmd import _summary
    from t3ar.clients.api_models import JobOut

    job = JobOut.model_validate({**JOB, "result": {
        "labelled_neighbours": [{"pool_id": "p-3", "label": "owl", "uses": 2}], "labelled_neighbours_total": 1}})
    assert "1 pool neighbour served as labelled data (owl 1): p-3 (owl, 2 steps)" in _summary(job)
    assert "labelled" not in _summary(JobOut.model_validate({**JOB, "result": {}}))


def test_jobs_show_counts_every_labelled_neighbour_per_label_not_only_the_listed() -> None:
    """The job's result names the first 20 labelled neighbours; its per-label counts were of those 20, printed
    beside the total of all 47. The worker now records the counts of all, and the line says so; a result
    without them (an older worker) says its counts are of the listed ones."""
    from types import SimpleNamespace

    from t3ar.cli.job_cmd import _summary
    from t3ar.clients.api_models import JobOut
    from t3ar_services.worker.jobs import labelled_per_label

    everyone = [SimpleNamespace(pool_id=f"p-{i}", label="dog" if i < 30 else "cat", uses=1) for i in range(47)]
    counts = labelled_per_label(everyone)
    assert counts == {"dog": 30, "cat": 17}
    listed = [{"pool_id": u.pool_id, "label": u.label, "uses": u.uses} for u in everyone[:20]]
    result = {"labelled_neighbours": listed, "labelled_neighbours_total": 47, "labelled_per_label": counts}
    job = JobOut.model_validate({**JOB, "result": result})
    assert "47 pool neighbours served as labelled data (dog 30, cat 17): p-0 (dog, 1 step)" in _summary(job)
    del result["labelled_per_label"]
    job = JobOut.model_validate({**JOB, "result": result})
    assert "47 pool neighbours served as labelled data (dog 20 among the 20 listed): " in _summary(job)
    whole = labelled_summary(listed[:3], total=3)
    assert whole.startswith("3 pool neighbours served as labelled data (dog 3): ")
