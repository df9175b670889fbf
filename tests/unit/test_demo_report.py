"""scripts/demo_report.py, the demo's helpers: the labelled pool's styles (outside the target's and the source's
artwork families), the job's retrieval ranking (T3AR_DEMO_RANKING, else the mixed-pool benchmark's choice, else
index), and the printed report, with the benchmark's aggregate beside the job's figures or a line saying the
benchmark has not been run. The benchmark documents here are small made-up fixtures, not measurements."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "demo_report.py"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("demo_report", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


dr = _module()


def _goal(mean: float, lo: float, hi: float, n: int, per_shift: dict[str, float]) -> dict[str, Any]:
    return {"mean": mean, "lo": lo, "hi": hi, "n": n, "per_shift": per_shift, "verdict": "not met"}


#: a made-up mixed-pool report in the shape of t3ar_bench.retrieval.mixed_report.report
BENCH: dict[str, Any] = {
    "seeds": [0, 1], "validation_shift": "openmoji", "evaluation_shifts": ["twitter", "fluent3d", "openmoji-black"],
    "choice": {"labelled": "t3ar-labels-class-conditional", "ranking": "class-conditional"},
    "pools": {"twitter": {"total": 104000, "relevant_share": 0.049}, "fluent3d": {"total": 103000,
                                                                                  "relevant_share": 0.048}},
    "goals": {
        "labelled_vs_bn_adapt": {"test": {"0.1": _goal(1.25, -0.5, 3.0, 6, {"twitter": 2.0}),
                                          "0.3": _goal(-0.75, -2.0, 0.5, 6, {"twitter": -1.0})}},
        "accepted_vs_bn_adapt_labelled": {"test": {"0.1": _goal(0.5, 0.1, 0.9, 6, {"fluent3d": 0.5})}},
    },
}


def test_the_pool_takes_the_kit_styles_outside_the_target_and_source_families() -> None:
    assert dr.pool_styles("twitter", "google") == ["openmoji", "openmoji-black", "fluent3d"]
    # openmoji-black is openmoji's artwork in line art: an openmoji target's pool loses both
    assert dr.pool_styles("openmoji", "google") == ["twitter", "fluent3d"]


def test_the_ranking_is_the_env_then_the_benchmark_choice_then_index() -> None:
    assert dr.choose_ranking("base-rerank", BENCH)[0] == "base-rerank"
    assert dr.choose_ranking(None, BENCH) == ("class-conditional", "the mixed-pool benchmark's validation choice")
    assert dr.choose_ranking(None, None)[0] == "index"
    assert dr.choose_ranking(None, {"goals": {}})[0] == "index"  # a report without a choice
    with pytest.raises(ValueError, match="'nearest'.*index"):
        dr.choose_ranking("nearest", None)
    with pytest.raises(ValueError, match="benchmark"):
        dr.choose_ranking(None, {"choice": {"ranking": "nearest"}})


def test_the_ranking_command_reads_the_env_and_refuses_a_bad_value(tmp_path: Path) -> None:
    bench = tmp_path / "mixed-pool.json"
    bench.write_text(json.dumps(BENCH))
    env = {**os.environ, "PYTHONPATH": str(REPO / "shared")}
    env.pop("T3AR_DEMO_RANKING", None)

    def run(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(SCRIPT), "ranking", *args], env={**env, **extra},
                              capture_output=True, text=True, timeout=120)

    assert run("--benchmark", str(bench)).stdout.strip() == "class-conditional"
    assert run("--benchmark", str(tmp_path / "absent.json")).stdout.strip() == "index"
    assert run("--benchmark", str(bench), T3AR_DEMO_RANKING="index").stdout.strip() == "index"
    bad = run("--benchmark", str(bench), T3AR_DEMO_RANKING="nearest")
    assert bad.returncode == 2 and bad.stdout == "" and "nearest" in bad.stderr


def test_the_benchmark_aggregate_is_printed_per_goal_and_fraction_with_its_cells() -> None:
    lines = dr.benchmark_lines(BENCH, shift="twitter", ranking="index", fraction=0.3)
    text = "\n".join(lines)
    assert "twitter, fluent3d, openmoji-black x seeds 0, 1" in lines[0]
    assert "this job ranked by index; the benchmark's labelled arm by class-conditional" in text
    assert "103,000-104,000 images, 4.8-4.9 % of them relevant" in text
    bn = next(line for line in lines if "T3AR with the pool's labels - bn-adapt" in line)
    assert "10 %: +1.2 [-0.5, +3.0] n=6 (twitter alone +2.0)" in bn and "30 %: -0.8 [-2.0, +0.5] n=6" in bn
    accepted = next(line for line in lines if "holdout's winner" in line)
    assert "10 %: +0.5 [+0.1, +0.9] n=6" in accepted and "twitter alone" not in accepted
    assert any("uniform random draws" in line and "not in the file" in line for line in lines)
    assert lines[-1].startswith("one shift is not the whole: this demo is one shift (twitter)")
    assert "6 cells per fraction" in lines[-1]


def test_without_the_benchmark_a_line_says_it_has_not_been_run() -> None:
    lines = dr.benchmark_lines(None, shift="twitter", ranking="index", fraction=0.3)
    assert "has not been run" in lines[0] and "one shift is not the whole" in lines[1]


def _demo_dir(d: Path, *, quality: dict[str, Any] | None) -> Path:
    (d / "pool").mkdir(parents=True)
    (d / "pool" / "manifest.json").write_text(json.dumps({"report": {"sources": {"openclipart": {
        "package": "openclipart-png", "version": "1:0.18"}}}}))
    (d / "emoji-pool").mkdir()
    (d / "emoji-pool" / "manifest.json").write_text(json.dumps({"report": {"packages": {"openmoji": "17.0.0"}}}))
    (d / "source.json").write_text(json.dumps({"digest": "abcdef0123456789", "libraries": {
        "torch": "2", "timm": "1", "pillow": "11", "numpy": "2"}, "runtime": {
        "threads": 1, "machine": "x86_64", "cpu_capability": "AVX2", "cpu": "GenuineIntel Xeon"}}))
    for i, (source, added, labelled) in enumerate([("openclipart", 536, 0), ("openmoji", 1800, 1800)]):
        (d / f"ingest-{i}-{source}.json").write_text(json.dumps({"added": added, "labelled": labelled}))
    cand = [("source", 0.5, None), ("bn-adapt", 0.57, None), ("t3ar", 0.6, (3.0, -1.0, 7.0))]
    acceptance = {"rule": "argmax", "winner": "t3ar", "reason": "highest top-1 on the holdout (60.0 %)", "n": 100,
                  "ci": "wilson 95 %", "paired_ci": "paired bootstrap", "classes": 50,
                  "runner_up": {"name": "bn-adapt", "points": 3.0, "lo": -1.0, "hi": 7.0},
                  "candidates": [{"name": n, "top1": t, "ci": [t - 0.1, t + 0.1], "n": 100,
                                  "vs_bn_adapt": None if v is None else dict(zip(("points", "lo", "hi"), v,
                                                                                 strict=True))}
                                 for n, t, v in cand]}
    job = {"id": "j1", "status": "finished", "target": {"images": 579}, "acceptance": acceptance,
           "result": {"steps": 18, "pool_ids_used": 900, "labelled_neighbours_total": 700,
                      "accuracy_before": 0.478, "accuracy_after": 0.55, "neighbour_quality": quality}}
    (d / "job.json").write_text(json.dumps(job))
    (d / "before.json").write_text(json.dumps({"n": 1910, "top1": 0.493}))
    (d / "after.json").write_text(json.dumps({"n": 1910, "top1": 0.58}))
    return d


QUALITY = {"ranking": "index", "k": 5, "neighbours": 2895,
           "pseudo_label_agreement": {"share": 0.4, "matches": 400, "labelled": 1000, "queries": 579},
           "precision_at_k": {"share": 0.45, "matches": 450, "labelled": 1000, "queries": 579},
           "precision_on": "target", "hit_rate": 0.8, "sources": {"openmoji": 2000, "openclipart": 895}}


def test_the_report_prints_the_jobs_figures_and_the_benchmark_beside_them(tmp_path: Path) -> None:
    d = _demo_dir(tmp_path / "demo", quality=QUALITY)
    lines = dr.report(d, 0.0, "cpu", BENCH, ranking="index", shift="twitter", fraction=0.3, bench_path="b.json")
    text = "\n".join(lines)
    assert lines[0] == ("job j1 (T3AR with the pool's labels, ranking index): finished on 579 target images; the "
                        "returned model (t3ar): 18 steps, 900 pool images used, 700 labelled pool items used as "
                        "labelled data")
    assert "pool: 2336 items, 1800 of them labelled (openclipart 536, openmoji 1800 labelled;" in text
    assert "accuracy on the adapted target subset: 47.8% -> 55.0%" in text
    assert "t3ar wins" in text and "Within noise: t3ar - bn-adapt = +3.0 points [-1.0, +7.0]" in text
    assert "accuracy on all 1910 Twitter emoji (the winner; the holdout's images included):  49.3% -> 58.0%" in text
    assert "labelled neighbours with the image's pseudo-label 40.0 % (400 of 1000" in text
    assert "precision@5 on the target's true labels 45.0 %" in text and "openmoji 2000, openclipart 895" in text
    assert text.index("neighbour quality") < text.index("the mixed-pool benchmark (b.json)")
    assert "one shift is not the whole" in text and "openmoji 17.0.0" in text


def test_the_report_shows_each_candidates_pool_use_when_the_record_has_it(tmp_path: Path) -> None:
    d = _demo_dir(tmp_path / "demo", quality=None)
    job = json.loads((d / "job.json").read_text())
    job["acceptance"]["winner"] = "bn-adapt"  # the retrieval candidate lost: the job's result has no quality
    job["acceptance"]["candidates"][1]["pool_ids_used"] = 0
    job["acceptance"]["candidates"][2].update(pool_ids_used=900, labelled_neighbours_total=700,
                                              neighbour_quality=QUALITY)
    job["result"].update(pool_ids_used=0, labelled_neighbours_total=None)
    (d / "job.json").write_text(json.dumps(job))
    text = "\n".join(dr.report(d, 0.0, "cpu", None, ranking="index", shift="twitter", fraction=0.3,
                               bench_path="b.json"))
    assert "the returned model (bn-adapt): 18 steps, 0 pool images used, 0 labelled pool items used" in text
    assert ("candidate t3ar (not returned): 900 pool images retrieved, 700 served as labelled data\n"
            "  neighbour quality (index, k=5, 2895 drawn)") in text
    assert "candidate bn-adapt" not in text and "none reported" not in text


def test_the_report_says_when_the_returned_model_drew_no_neighbours(tmp_path: Path) -> None:
    d = _demo_dir(tmp_path / "demo", quality=None)
    text = "\n".join(dr.report(d, 0.0, "cpu", None, ranking="index", shift="twitter", fraction=0.3,
                               bench_path="b.json"))
    assert "neighbour quality: none reported" in text and "has not been run (b.json does not exist)" in text


def test_the_demo_submits_t3ar_with_the_pool_labels_and_ingests_the_styles_with_their_labels() -> None:
    demo = (REPO / "scripts" / "demo.sh").read_text()
    assert '\\"pool_labels\\": {\\"weight\\": 1}' in demo and '\\"ranking\\": \\"$RANKING\\"' in demo
    assert '--method t3ar --preset paper --mode test --config "$JOB_CONFIG"' in demo
    ingest = [line for line in demo.splitlines() if "pool ingest" in line and "emoji-pool" in line]
    assert len(ingest) == 1 and "--labels folders" in ingest[0] and '--source "$style"' in ingest[0]
    # the pool kit is built (and its npm packages downloaded) before the stack starts, never at job time
    assert demo.index('--out "$D/emoji-pool"') < demo.index('"$T" up ')
