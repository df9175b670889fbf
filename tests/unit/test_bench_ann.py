"""The retrieval benchmark's ``ann`` section on tiny sizes: data generators, structure measures, the sweep."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from t3ar.bench.retrieval import ann
from t3ar.bench.retrieval.ann_report import ann_goals, ann_section


def test_generators_are_unit_deterministic_and_one_distribution() -> None:
    a, b = ann.mixture_vectors(500, seed=1), ann.mixture_vectors(500, seed=1)
    assert a.shape == (500, ann.DIM) and np.array_equal(a, b)
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1, atol=1e-5)
    other = ann.mixture_vectors(500, seed=2)  # other samples of the same mixture: not the same rows
    assert not np.array_equal(a, other)
    assert np.mean(a @ other.T) > 0.1  # the shared direction: both samples live in one cone
    u = ann.uniform_vectors(500, seed=1)
    assert abs(float(np.mean(u @ ann.uniform_vectors(500, seed=2).T))) < 0.02


def test_structure_separates_clustered_from_uniform() -> None:
    mix, uni = ann.structure(ann.mixture_vectors(3000, 1), n_queries=100), \
        ann.structure(ann.uniform_vectors(3000, 1), n_queries=100)
    assert mix["relative_contrast_50"] > uni["relative_contrast_50"] and mix["lid_50"] < uni["lid_50"]
    assert mix["cos_nn1"] > mix["cos_nn50"] > mix["mean_cos_random"]


def test_bench_ann_small_sweep_and_report(tmp_path: Path) -> None:
    real = tmp_path / "embeddings"
    real.mkdir()
    np.save(real / "r-openclipart-1.npy", ann.mixture_vectors(200, 9)[:, :64])  # a "pool component"
    np.save(real / "r-queries-x-1.npy", np.zeros((5, 64), np.float32))  # target queries: not pool structure
    out = ann.bench_ann(3000, n_queries=20, n_single=5, nlist=16, real_dir=real)
    assert out["real_structure"]["n"] == 200 and out["real_structure"]["dim"] == 64
    for part in ("structured", "uniform"):
        sweep = out[part]["sweep"]
        assert [s["nprobe"] for s in sweep] == [4, 8, 16]  # larger nprobes than nlist are skipped
        recalls = [s["recall_at_50"] for s in sweep]
        assert all(0 <= r <= 1 for r in recalls) and recalls == sorted(recalls)
        assert recalls[-1] > 0.99  # every list probed: exact
    assert out["nprobe"] in (4, 8, 16) and out["recall_at_50"] >= 0.95
    assert out["device"]["available"] in (True, False)
    text = "\n".join(ann_section({"ann": out}))
    assert "recall@50" in text and "uniform" in text
    assert len(ann_goals({"ann": out})) == 2 and ann_goals({}) == []


def test_a_run_without_a_gpu_keeps_the_last_gpu_figure(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from t3ar.bench.retrieval.main import keep_device_figure

    gpu = {"available": True, "device": "H100", "single": {"p50_ms": 1.0}, "note": "Measured apart."}
    prev = tmp_path / "retrieval.json"
    prev.write_text(json.dumps({"ann": {"device": gpu}}))
    ann = {"device": {"available": False, "reason": "no CUDA device"}}
    keep_device_figure(prev, ann)
    assert ann["device"]["device"] == "H100" and ann["device"]["note"].startswith("Measured apart. Carried over")
    prev.write_text(json.dumps({"ann": {"device": ann["device"]}}))  # carried twice: said once
    again: dict[str, object] = {"device": {"available": False}}
    keep_device_figure(prev, again)
    assert again["device"]["note"].count("Carried over") == 1  # type: ignore[index]
    fresh = {"device": {"available": True, "device": "A100"}}
    keep_device_figure(prev, fresh)  # a run that measured keeps its own figure
    assert fresh["device"]["device"] == "A100"
    empty = {"device": {"available": False}}
    keep_device_figure(tmp_path / "missing.json", empty)
    assert empty["device"] == {"available": False}
