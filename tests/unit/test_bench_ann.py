"""The retrieval benchmark's ``ann`` section on tiny sizes: data generators, structure measures, the sweep."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from t3ar_bench.retrieval import ann
from t3ar_bench.retrieval.ann_report import ann_goals, ann_section


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

    from t3ar_bench.retrieval.main import keep_device_figure

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


def test_a_run_without_cached_embeddings_keeps_the_last_real_structure(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from t3ar_bench.retrieval.ann_report import _real_label
    from t3ar_bench.retrieval.main import keep_real_structure

    real = {"n": 14594, "dim": 1280, "mean_cos_random": 0.27, "cos_nn1": 0.83, "cos_nn50": 0.65,
            "relative_contrast_50": 1.49, "lid_50": 13.9}
    prev = tmp_path / "retrieval.json"
    prev.write_text(json.dumps({"started_at": "2026-11-23 13:03:39", "ann": {"real_structure": real}}))
    ann: dict[str, object] = {"real_structure": None}
    keep_real_structure(prev, ann, "2026-11-25 12:00:00")
    carried = ann["real_structure"]
    assert carried == {**real, "measured_at": "2026-11-23 13:03:39", "carried_over": True}
    assert "measured on 2026-11-23 13:03:39, carried over" in _real_label(carried)  # type: ignore[arg-type]
    prev.write_text(json.dumps({"started_at": "2026-11-25 12:00:00", "ann": ann}))  # carried twice: first date kept
    again: dict[str, object] = {"real_structure": None}
    keep_real_structure(prev, again, "2026-11-26 12:00:00")
    assert again["real_structure"]["measured_at"] == "2026-11-23 13:03:39"  # type: ignore[index]
    fresh: dict[str, object] = {"real_structure": dict(real)}
    keep_real_structure(prev, fresh, "2026-11-26 12:00:00")  # a run that measured stamps its own
    assert fresh["real_structure"] == {**real, "measured_at": "2026-11-26 12:00:00"}
    assert _real_label(fresh["real_structure"]).endswith("(measured this run)")  # type: ignore[arg-type]
    none: dict[str, object] = {"real_structure": None}
    keep_real_structure(tmp_path / "missing.json", none, "x")
    assert none["real_structure"] is None


def test_the_committed_retrieval_report_renders_with_and_without_the_paired_figure() -> None:
    import json
    from pathlib import Path

    from t3ar_bench.retrieval.report import render_markdown

    doc = json.loads((Path(__file__).parents[2] / "docs/benchmarks/retrieval.json").read_text())
    text = render_markdown(doc)
    assert "## Goals" in text and "single-query overhead p50" in text
    assert f"+{doc['search']['single_overhead_paired_p50_ms']:.2f} ms" in text
    old = {k: v for k, v in doc["history"][-1].items() if k != "single_scan_p50_ms"}  # a row from before the column
    doc["history"] = [{**old, "started_at": "then", "load_average_start": [2.0]},
                      {**doc["history"][-1], "started_at": "now", "load_average_start": [0.5],
                       "single_scan_p50_ms": 7.25}]
    text = render_markdown(doc)
    assert "| then | 2.0 | – |" in text and "| now | 0.5 | 7.2 ms |" in text
    doc["search"].pop("single_overhead_paired_p50_ms", None)  # a run from before the figure existed
    assert "paired differences" not in render_markdown(doc)


def test_the_hop_diagnostic_times_both_halves_of_the_hop_per_pool_size() -> None:
    from t3ar_bench.retrieval.hop import measure

    rows = measure(sizes=(100, 400), n_queries=5)
    assert [r["vectors"] for r in rows] == [100, 400]
    assert all(r["scan_ms"] > 0 and r["start_us"] > 0 and r["back_us"] > 0 for r in rows)
