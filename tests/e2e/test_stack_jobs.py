"""Adaptation jobs through the embedded stack: queued -> finished -> checkpoint, failures, cancellation."""

from __future__ import annotations

from pathlib import Path

import pytest
from stack_helpers import FAST_JOB, LONG_JOB, Stack, fast_job, tiny_checkpoint, wait_for

from t3ar.clients.api import ApiInputError
from t3ar.models.checkpoint import load_checkpoint, read_info


def test_job_finishes_and_checkpoint_loads(stack: Stack, model_id: str, pool_ids: list[str], labelled_zip: Path,
                                           tmp_path: Path) -> None:
    with stack.api() as api:
        accepted = api.adapt(labelled_zip, model_id, {**FAST_JOB, "mode": "test"})
        assert accepted.status == "queued" and accepted.url.endswith(accepted.id)
        assert accepted.target.model_dump(exclude={"adapted"}) == {"images": 9, "labelled": True, "skipped": 0}
        seen: list[str] = []
        job = api.wait(accepted.id, on_update=lambda j: seen.append(j.status), poll=0.2, timeout=180)
        assert job.status == "finished", job
        assert seen[0] in ("queued", "started")
        assert job.progress.step == job.progress.total_steps > 0
        assert job.progress.loss is not None and job.started_at and job.ended_at
        path = api.download_checkpoint(accepted.id, tmp_path / "adapted.pt")
        model, info = load_checkpoint(path)
        assert info.adapt_config is not None and info.adapt_config["retrieval"]["k"] == 2
        assert info.lineage.method == "t3ar" and info.lineage.target_size == 9
        assert info.lineage.pool_ids and set(info.lineage.pool_ids) <= set(pool_ids)
        report = api.report(accepted.id)
        assert report.accuracy.before.n == 9 and not report.accuracy.labels_used_for_training
        assert report.pool_ids_used == len(info.lineage.pool_ids)
        # issue 27: what retrieval did (8 of the 9 targets, k=2 pool neighbours each, with scores) and every step
        sample = report.neighbour_sample
        assert len(sample) == 8 and all(len(s.neighbours) == 2 for s in sample)
        assert {n.id for s in sample for n in s.neighbours} <= set(pool_ids)
        assert all(-1.01 <= n.score <= 1.01 for s in sample for n in s.neighbours)
        assert all((stack.data_dir / "api" / "jobs" / accepted.id / "target" / s.target).is_file()
                   for s in sample)  # the ids name the API's copy of the target images
        assert len(report.step_history) == job.progress.total_steps
        listed = api.jobs().jobs
        assert accepted.id in [j.id for j in listed]
    # one request id follows the submission: the API's access log, the worker's lines, the retriever's calls
    from rq.job import Job

    from t3ar_services.common.job_contract import SERIALIZER

    spec = Job.fetch(accepted.id, connection=stack.redis(), serializer=SERIALIZER).args[0]
    rid = spec["request_id"]
    assert rid and f"[{rid}]: POST /adapt 202" in stack.log("api")
    assert f"[{rid}]: job {accepted.id} started" in stack.log("worker-1")
    assert f"[{rid}]: POST /search 200" in stack.log("retriever")
    # issue 12: the worker shares no directory with the API. Its environment names only URLs, tokens and its own
    # data dir; it fetched the job's inputs over HTTP (the base model is in its sha256-keyed cache), uploaded the
    # checkpoint (the API's copy is byte-identical to what GET /jobs/{id}/checkpoint served) and left no scratch
    api_dir, worker_dir = stack.data_dir / "api", stack.data_dir / "worker"
    env = dict(kv.split("=", 1) for kv in
               Path(f"/proc/{stack.pids()['worker-1']}/environ").read_text().split("\0") if "=" in kv)
    assert env["T3AR_WORKER_DATA_DIR"] == str(worker_dir) and env["T3AR_WORKER_API_URL"] == stack.info["api_url"]
    assert not any(str(api_dir) in v for v in env.values())
    assert (worker_dir / "cache" / "models" / spec["model_sha256"]).is_file()
    assert not list((worker_dir / "work").iterdir())
    assert (api_dir / "artifacts" / accepted.id / "model.pt").read_bytes() == path.read_bytes()
    assert report.transfer.target_bytes == spec["target_bytes"] > 0
    assert f"PUT /internal/jobs/{accepted.id}/checkpoint 200" in stack.log("api")


def test_train_mode_from_labels_csv(stack: Stack, model_id: str, pool_ids: list[str], labelled_zip: Path) -> None:
    with stack.api() as api:
        job_config = {k: v for k, v in FAST_JOB.items() if k not in ("k", "r")}  # noretrieval has no retrieval group
        accepted = api.adapt(labelled_zip, model_id, {**job_config, "method": "t3ar-noretrieval"})
        assert accepted.config.mode == "train"
        job = api.wait(accepted.id, poll=0.2, timeout=180)
        assert job.status == "finished", job
        assert api.report(accepted.id).accuracy.labels_used_for_training is True


def test_failed_job_shows_its_error(stack: Stack, labelled_zip: Path, tmp_path: Path, pool_ids: list[str]) -> None:
    with stack.api() as api:
        model = api.upload_model(tiny_checkpoint(tmp_path / "doomed.pt", ("blue", "green", "red", "other")))
        accepted = api.adapt(labelled_zip, model.id, {**FAST_JOB, "mode": "test"})
        # the base checkpoint is changed on the API's disk after validation (the worker is still importing
        # torch): the worker's download does not have the sha256 the job carries, and it refuses to use it
        stored = stack.data_dir / "api" / "models" / f"{model.id}.pt"
        data = stored.read_bytes()
        stored.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))  # one bit pattern flipped, same size
        job = api.wait(accepted.id, poll=0.2, timeout=120)
        assert job.status == "failed"
        assert "checksum mismatch" in job.error and "the base model" in job.error, job.error
        assert not (stack.data_dir / "worker" / "cache" / "models" / model.sha256).exists()
        with pytest.raises(ApiInputError, match="not finished"):
            api.report(accepted.id)


def test_cancel_queued_and_running(stack: Stack, model_id: str, pool_ids: list[str], labelled_zip: Path) -> None:
    with stack.api() as api:
        running = api.adapt(labelled_zip, model_id, LONG_JOB)
        queued = api.adapt(labelled_zip, model_id, LONG_JOB)
        wait_for(lambda: getattr(api.job(running.id).progress, "phase", None) == "adapting", 120,
                 "the first job to start adapting")
        assert api.job(queued.id).status == "queued"
        assert api.cancel(queued.id).status == "canceled"
        assert api.cancel(running.id).status == "canceling"
        job = api.wait(running.id, poll=0.2, timeout=60)
        assert job.status == "canceled" and job.error is None
        assert api.job(queued.id).status == "canceled"
        with pytest.raises(ApiInputError, match="already canceled"):
            api.cancel(running.id)
        assert not (stack.data_dir / "api" / "artifacts" / running.id / "model.pt").exists()


def test_upload_model_is_idempotent_and_validated(stack: Stack, tmp_path: Path) -> None:
    ckpt = tiny_checkpoint(tmp_path / "m.pt", ("a", "b"))
    with stack.api() as api:
        first, again = api.upload_model(ckpt), api.upload_model(ckpt)
        assert first.id == again.id and first.num_classes == 2
        assert first.id in [m.id for m in api.list_models()]
        assert read_info(ckpt).sha256 == first.sha256
        bad = tmp_path / "bad.pt"
        bad.write_bytes(b"not a checkpoint at all")
        with pytest.raises(ApiInputError, match="not a t3ar checkpoint"):
            api.upload_model(bad)


def test_adacontrast_on_a_labelled_target_runs_test_time(stack: Stack, model_id: str, pool_ids: list[str],
                                                          labelled_zip: Path) -> None:
    with stack.api() as api:
        accepted = api.adapt(labelled_zip, model_id, fast_job("adacontrast"))
        assert accepted.config.mode == "test"  # labels score the result, never train it
        job = api.wait(accepted.id, poll=0.2, timeout=180)
        assert job.status == "finished", job
        assert api.report(accepted.id).accuracy.labels_used_for_training is False
