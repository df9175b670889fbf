"""The candidates harness: each candidate adapts from the base weights, the pool is asked once for all of them, the
winner's weights end in the model, and the record is what the report's typed model reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from provider_kit import SixItemPool

from t3ar.acceptance import DEFAULT_RULE
from t3ar.acceptance_options import AcceptanceOptions
from t3ar.candidates import SharedProvider, run_candidates
from t3ar.clients.job_report import AcceptanceRecord, acceptance_table, candidate_pool_lines
from t3ar.data.holdout import HoldoutError, read_holdout
from t3ar.data.target import read_target
from t3ar.method.config import adapt_config
from t3ar.models.backbones import BackboneSpec
from t3ar.models.checkpoint import load_checkpoint, save_checkpoint
from t3ar.models.classifier import ModelSpec, build_classifier

CPU = torch.device("cpu")


def _img(path: Path, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(path)


@pytest.fixture()
def setup(tmp_path: Path) -> tuple[Path, Path, Path]:
    spec = ModelSpec(backbone=BackboneSpec(name="mobilenetv2_050", weights="none"), classes=("a", "b"), image_size=32)
    torch.manual_seed(0)
    save_checkpoint(tmp_path / "m.pt", build_classifier(spec), spec)
    for i in range(8):
        _img(tmp_path / "target" / f"t{i}.png", i)
    for i in range(4):
        _img(tmp_path / "holdout" / "ab"[i % 2] / f"h{i}.png", 100 + i)
    return tmp_path / "m.pt", tmp_path / "target", tmp_path / "holdout"


def test_candidates_share_the_pool_and_the_winner_is_loaded(setup: tuple[Path, Path, Path]) -> None:
    model_file, target_dir, holdout_dir = setup
    model, info = load_checkpoint(model_file, device=CPU)
    base = {k: v.clone() for k, v in model.state_dict().items()}
    provider = SixItemPool()
    cfg = adapt_config(method="t3ar", k=2, r=2, epochs=1, batch_size=4, bank_size=64, preset="paper")
    opts = AcceptanceOptions(candidates=("t3ar", "bn-adapt", "source", "t3ar-random"), rule="argmax")
    done = run_candidates(model, info, read_target(target_dir), cfg, opts, read_holdout(holdout_dir),
                          provider=provider, device=CPU)
    assert list(done.runs) == ["source", "bn-adapt", "t3ar", "t3ar-random"]
    assert provider.calls["embed"] == 1 and provider.calls["search"] == 1  # asked once for both retrieval methods
    assert provider.calls["fetch"] <= 6  # every pool image fetched at most once
    # the source candidate is the base model, untouched; the winner's weights are the model's now
    assert all(torch.equal(done.runs["source"].state[k], base[k]) for k in base)
    win = done.winner.state
    assert all(torch.equal(model.state_dict()[k].cpu(), win[k]) for k in win)
    assert done.runs["source"].outcome.lineage.pool_ids == () and done.runs["t3ar"].outcome.lineage.pool_ids
    rec = done.record()
    assert isinstance(rec, AcceptanceRecord) and rec.require_gain is False
    assert [c.name for c in rec.candidates] == ["source", "bn-adapt", "t3ar", "t3ar-random"]
    assert rec.n == 4 and rec.rule == "argmax" and all(c.seconds is not None for c in rec.candidates)
    assert rec.candidates[0].vs_source is None and rec.candidates[2].vs_source is not None
    table = acceptance_table(rec)
    assert table[1].split()[0] == "candidate" and any(line.rstrip().endswith("<-") for line in table[2:])
    # what each candidate drew from the pool is kept whoever wins (the job's result carries the winner's alone)
    used = {c.name: c for c in rec.candidates}
    assert used["source"].pool_ids_used == 0 and used["source"].neighbour_quality is None
    assert used["t3ar"].pool_ids_used == len(done.runs["t3ar"].outcome.lineage.pool_ids) > 0
    assert used["t3ar"].labelled_neighbours_total == 0  # SixItemPool's items carry no label
    quality = used["t3ar"].neighbour_quality
    assert quality is not None and quality.k == 2 and quality.sources == {"x": quality.neighbours}
    assert AcceptanceRecord.model_validate(rec.model_dump(mode="json")) == rec  # the contract reads it back
    lines = candidate_pool_lines(rec)
    assert any(line.startswith("candidate t3ar (") and "pool images retrieved" in line for line in lines)
    assert not any("candidate source" in line for line in lines)
    phases = done.phase_seconds()
    assert phases["steps"] >= done.runs["t3ar"].outcome.phase_seconds["steps"]


def test_a_holdout_image_of_the_target_stops_the_run(setup: tuple[Path, Path, Path]) -> None:
    model_file, target_dir, holdout_dir = setup
    (holdout_dir / "a" / "copy.png").write_bytes((target_dir / "t3.png").read_bytes())
    model, info = load_checkpoint(model_file, device=CPU)
    with pytest.raises(HoldoutError, match="also in the target"):
        run_candidates(model, info, read_target(target_dir), adapt_config(method="tent", epochs=1), AcceptanceOptions(),
                       read_holdout(holdout_dir), provider=None, device=CPU)


def test_shared_provider_remembers() -> None:
    inner = SixItemPool()
    shared = SharedProvider(inner)
    x = torch.zeros(3, 3, 8, 8, dtype=torch.uint8)
    q = shared.embed(x)
    shared.embed(x.clone())
    shared.search(q, 2)
    shared.search(q.copy(), 2)
    shared.search(q, 3)  # another k: another question
    shared.fetch(["a", "b"])
    shared.fetch(["b", "c"])
    assert inner.calls == {"embed": 1, "search": 2, "fetch": 3}


def test_cli_adapt_with_a_holdout(setup: tuple[Path, Path, Path], tmp_path: Path) -> None:
    import json

    from click.testing import CliRunner

    from t3ar.cli.main import cli
    from t3ar.models.checkpoint import read_info

    model_file, target_dir, holdout_dir = setup
    out = tmp_path / "won.pt"
    args = ["adapt", "--model", str(model_file), "--target", str(target_dir), "--holdout", str(holdout_dir),
            "--method", "tent", "--epochs", "1", "--batch-size", "4", "--device", "cpu"]
    res = CliRunner().invoke(cli, [*args, "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    acc = payload["acceptance"]
    assert [c["name"] for c in acc["candidates"]] == ["source", "bn-adapt", "tent"] and acc["rule"] == DEFAULT_RULE
    info = read_info(out)
    assert info.metrics["acceptance"] == acc and info.lineage.method == acc["winner"] == payload["method"]
    # nothing beats the base model when it is the only candidate: --require-gain writes nothing
    refused = tmp_path / "refused.pt"
    res = CliRunner().invoke(cli, [*args, "--candidates", "source", "--require-gain", "--out", str(refused)])
    assert res.exit_code != 0 and "no candidate beats the base model" in res.output
    assert not refused.exists()
    res = CliRunner().invoke(cli, ["adapt", "--model", str(model_file), "--target", str(target_dir), "--method", "tent",
                                   "--require-gain", "--out", str(refused)])
    assert res.exit_code != 0 and "pass --holdout" in res.output


def test_worker_require_gain_fails_the_job_with_the_record(setup: tuple[Path, Path, Path], monkeypatch: Any) -> None:
    import t3ar.data.sampling as sampling
    from t3ar_services.common.job_contract import JobSpec
    from t3ar_services.worker import jobs

    model_file, target_dir, holdout_dir = setup
    model, info = load_checkpoint(model_file, device=CPU)

    from t3ar_services.worker.progress import Progress

    progress = Progress(None, None, "j1")
    spec = JobSpec(job_id="j1", model_id="m", model_sha256="0" * 64, target_sha256="0" * 64, target_bytes=1,
                   config={"method": "tent"}, holdout_sha256="0" * 64, holdout_bytes=1, job_secret="s" * 32,
                   subsample_rows=list(range(len(read_target(target_dir)))), subsample_sha256="0" * 64,
                   acceptance={"candidates": ["source"], "require_gain": True, "rule": "paired"})
    def drawn(*args: object, **kwargs: object) -> list[int]:
        raise AssertionError("the worker drew the subsample again instead of using the job's")

    monkeypatch.setattr(sampling, "stratified_subsample", drawn)
    with pytest.raises(jobs.AcceptanceRefusedError, match="no candidate beats the base model"):
        jobs._candidates(spec, adapt_config(method="tent", epochs=1), model, info, read_target(target_dir), None, CPU,
                         progress, holdout_dir)
    record = progress.meta.acceptance
    assert isinstance(record, AcceptanceRecord) and record.winner == "source" and record.require_gain is True
    assert progress.meta.dump()["acceptance"]["winner"] == "source"


def test_onnx_metadata_carries_the_acceptance_record(setup: tuple[Path, Path, Path]) -> None:
    import json

    from t3ar.export.onnx_graph import metadata
    from t3ar.models.checkpoint import read_info

    info = read_info(setup[0])
    assert "t3ar.acceptance" not in metadata(info)  # a checkpoint without a holdout
    record = {"winner": "bn-adapt", "rule": "paired", "candidates": []}
    from dataclasses import replace

    meta = metadata(replace(info, metrics={**info.metrics, "acceptance": record}))
    assert json.loads(meta["t3ar.acceptance"]) == record and meta["t3ar.format"] == "t3ar.onnx/1"


def test_jobs_show_prints_the_acceptance_table() -> None:
    from t3ar.acceptance import as_record, decide
    from t3ar.cli.job_cmd import _summary
    from t3ar.clients.api_models import JobOut

    correct = {"source": [False] * 10, "bn-adapt": [True] * 10, "t3ar": [True] * 9 + [False]}
    record = as_record(decide(correct, "paired"), require_gain=True).model_dump(mode="json")
    job = JobOut.model_validate({"id": "j1", "url": "http://api/jobs/j1", "status": "finished", "model_id": "m",
                                 "created_at": "2026", "config": {"method": "t3ar"},
                                 "target": {"images": 9, "labelled": False, "skipped": 0},
                                 "contribution": {"requested": False, "status": "not_requested"},
                                 "acceptance": record})
    text = _summary(job)
    assert "acceptance on 10 holdout images (rule paired): bn-adapt wins" in text
    rows = {line.split()[0]: line for line in text.splitlines()[2:] if line.strip()}
    assert rows["bn-adapt"].rstrip().endswith("<-") and "100.0" in rows["bn-adapt"]
    assert "+100.0 [+100.0, +100.0]" in rows["bn-adapt"] and "-10.0" in rows["t3ar"]
    # a losing retrieval candidate's pool use and neighbour quality are printed too
    quality = {"ranking": "index", "k": 5, "neighbours": 45, "sources": {"clipart": 5, "openmoji": 40}}
    losing = as_record(decide(correct, "paired"), pool_use={"t3ar": {"pool_ids_used": 30, "labelled_neighbours_total":
                                                                     12, "neighbour_quality": quality}})
    job = JobOut.model_validate({**job.model_dump(mode="json"), "acceptance": losing.model_dump(mode="json")})
    text = _summary(job)
    assert "candidate t3ar (not returned): 30 pool images retrieved, 12 served as labelled data" in text
    assert "neighbours by pool source: openmoji 40, clipart 5" in text and "candidate bn-adapt" not in text
