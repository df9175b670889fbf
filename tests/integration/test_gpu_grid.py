"""The GPU grid end to end on CPU (issue 33, item 5): a pack built from a small synthetic kit with the real bench
code (lite0 embeddings, faiss), then the runner in a subprocess as the device runs it
(``PYTHONPATH=shared:bench``), with faiss, open_clip, fastapi, redis and the services made unimportable in it and
in its run processes."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from t3ar_bench.method.data import Kits
from t3ar_bench.method.gpu_grid import main as grid_main
from t3ar_bench.method.gpu_pack import GPU_PLAN, build_pack, load_selection
from t3ar_bench.method.pack import MANIFEST, read_manifest

ROOT = Path(__file__).resolve().parents[2]
SELECTION = ROOT / "docs" / "benchmarks" / "adaptation-cpu.json"
CLASSES = ("animal", "face", "food", "plant")
ITEMS = 8  # per class and style: 3 adaptation and 5 evaluation images per class (eval share 0.65)
#: a site-customisation every Python process of the runner (and its spawned run processes) loads first
BLOCKER = '''import importlib.abc, sys
BLOCKED = ("faiss", "open_clip", "fastapi", "redis", "t3ar_services")
class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is not on the GPU machine")
sys.meta_path.insert(0, _Block())
'''
PLAN = dataclasses.replace(
    GPU_PLAN, name="gpu-test", eval_shifts=("twitter",), seeds=(0, 1), fractions=(0.5, 1.0),
    low_fractions=(0.5, 1.0), epochs=1, max_steps=2, min_steps=2, batch_size=4, image_size=32, retriever_size=32,
    source_epochs=1, archive_styles=("emojione",), workers=2, notes=("test pack: not results",))


def _image(style: int, cls: int, item: int, rng: np.random.Generator) -> Image.Image:
    """A class-dependent shape (the class decides where a bright block sits), a style-dependent palette, noise."""
    a = np.full((32, 32, 3), 230 - 40 * style, dtype=np.int16)
    y, x = divmod(cls, 2)
    a[4 + 14 * y:16 + 14 * y, 4 + 14 * x:16 + 14 * x] = (40 * style, 200 - 30 * style, 60 + 25 * cls)
    a += rng.integers(-20, 20, size=a.shape, dtype=np.int16) + item
    return Image.fromarray(np.clip(a, 0, 255).astype(np.uint8))


def _kit(root: Path) -> Kits:
    rng = np.random.default_rng(0)
    for s, style in enumerate(("google", "twitter", "openmoji", "openmoji-black", "fluent3d")):
        for c, cls in enumerate(CLASSES):
            (root / "emoji" / style / cls).mkdir(parents=True)
            for i in range(ITEMS):
                _image(s, c, i, rng).save(root / "emoji" / style / cls / f"{c:02d}{i:02d}.png")
    for c, cls in enumerate(CLASSES):
        (root / "archive" / "emojione" / cls).mkdir(parents=True)
        for i in range(ITEMS):
            _image(5, c, i, rng).save(root / "archive" / "emojione" / cls / f"{c:02d}{i:02d}.png")
    for src in ("openclipart", "tuxpaint"):
        (root / "pool" / src).mkdir(parents=True)
        for i in range(12):
            Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(root / "pool" / src / f"{i}.png")
    return Kits(root / "emoji", root / "pool", {"synthetic": "test_gpu_grid"}, 0.0, root / "archive")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Kits, Path]:
    """(the pack, its kits, the work folder with the embedding cache)."""
    root = tmp_path_factory.mktemp("gpu")
    selection, origin = load_selection(SELECTION)
    kits = _kit(root / "kit")
    build_pack(root / "pack", PLAN, selection, origin, kits, root / "work", torch.device("cpu"), strict=False)
    return root / "pack", kits, root / "work"


@pytest.fixture(scope="module")
def pack(built: tuple[Path, Kits, Path]) -> Path:
    return built[0]


def _run(pack: Path, out: Path, work: Path, *extra: str) -> dict[str, Any]:
    site = out.parent / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT / "shared"), str(ROOT / "bench")])}
    proc = subprocess.run([sys.executable, "-m", "t3ar_bench.method.gpu_grid", "--pack", str(pack), "--out",
                           str(out), "--work", str(work), "--device", "cpu", "--threads", "1", *extra],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "is not on the GPU machine" not in proc.stderr
    return json.loads((out / "adaptation-gpu.json").read_text())


def test_the_pack_runs_without_faiss_and_reports_the_frozen_arms(pack: Path, tmp_path: Path) -> None:
    manifest = read_manifest(pack)
    assert manifest["neighbours_per_image"] == 25 and manifest["selection_plan_differences"]
    res = _run(pack, tmp_path / "a", tmp_path / "work-a", "--workers", "2")
    labels = {r["label"] for r in res["records"]}
    assert labels == {"source", "bn-adapt", "sar", "eata", "t3ar", "t3ar-labels", "t3ar-labels-random"}  # cpu plan's
    assert res["runs"] == {"planned": 28, "done": 28, "executed": 24, "cached": 0}  # 2 seeds x 2 fractions x 7
    assert res["seeds_reported"] == [0, 1] and not res["partial"]
    assert res["selection"]["labelled"]["options"] == json.loads(SELECTION.read_text())["selection"]["labelled"][
        "options"]
    for f in ("0.5", "1.0"):
        assert set(res["cells"]["test"][f]) == labels
        for goal in ("no_harm", "labelled_vs_random", "labelled_vs_bn_adapt"):
            d = res["goals"][goal]["test"][f]
            assert d["n"] == 2 and d["lo"] <= d["mean"] <= d["hi"]
    labelled = [r for r in res["records"] if r["label"] == "t3ar-labels-random"]
    assert all(r["pool_labelled_items"] == 4 * ITEMS * 4 for r in labelled)  # openmoji(-black), fluent3d, emojione
    md = (tmp_path / "a" / "adaptation-gpu.md").read_text()
    assert "Frozen from the CPU validation" in md and "random-labelled control" in md
    # deterministic for a seed: seed 0 again, from scratch (new work folder: its own source model, no run cache)
    again = _run(pack, tmp_path / "b", tmp_path / "work-b", "--seeds", "0", "--workers", "1")
    assert again["runs"]["executed"] == 12 and again["seeds_reported"] == [0]  # 2 fractions x 6 (source: none)
    assert [m.name.rsplit("-", 1)[1] for m in (tmp_path / "work-b" / "models").glob("*.pt")] == ["seed0.pt"]

    def top1(records: list[dict[str, Any]]) -> dict[tuple[str, float], float]:
        return {(r["label"], r["fraction"]): r["top1"] for r in records if r["seed"] == 0}

    assert top1(again["records"]) == top1(res["records"])


def test_a_missing_or_foreign_pack_is_refused_in_one_line(pack: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert grid_main(["--pack", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "no GPU pack" in err and "\n" not in err
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    for f in pack.iterdir():
        if f.is_file():
            (foreign / f.name).write_bytes(f.read_bytes())
    manifest = json.loads((foreign / MANIFEST).read_text())
    (foreign / MANIFEST).write_text(json.dumps({**manifest, "code": "0" * 64}))
    assert grid_main(["--pack", str(foreign), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "another code version" in err and "\n" not in err
    edited = tmp_path / "adaptation-cpu.json"  # the committed selection changed after the pack was built
    edited.write_text(SELECTION.read_text().replace('"bn_groups": 2', '"bn_groups": null', 1))
    (foreign / MANIFEST).write_text(json.dumps({**manifest, "selection_origin": {
        **manifest["selection_origin"], "file": str(edited)}}))
    assert grid_main(["--pack", str(foreign), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "changed since the pack was built" in err and "\n" not in err
    (foreign / MANIFEST).write_text(json.dumps(manifest))
    (foreign / "arrays.npz").write_bytes(b"not the pack's")
    assert grid_main(["--pack", str(foreign), "--out", str(tmp_path / "o")]) == 2
    assert "differs from the manifest" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_the_packs_pool_retrieves_and_draws_what_the_benchs_pool_does(built: tuple[Path, Kits, Path],
                                                                       tmp_path: Path) -> None:
    from t3ar.method.adapt import stream
    from t3ar.method.config import adapt_config
    from t3ar.method.probe import NO_PROBE, Probe
    from t3ar.pipeline import retrieve
    from t3ar_bench.method.data import side_table
    from t3ar_bench.method.pack import load_pack, unpack_images
    from t3ar_bench.method.protocol import fraction_subset
    from t3ar_bench.method.runs import build_pools, labelled_tensors, load_targets, pool_name

    pack_dir, kits, work = built
    manifest = read_manifest(pack_dir)
    data = load_pack(pack_dir, manifest, unpack_images(pack_dir, manifest, tmp_path))
    _, targets = load_targets(PLAN, kits, PLAN.eval_shifts)
    pools, comps = build_pools(PLAN, kits, targets, work, torch.device("cpu"))
    key = pool_name("twitter", None, PLAN)
    bench, bench_key = pools[key]
    packed, packed_key = data.pools[key]
    assert packed_key == bench_key and packed.all_ids() == bench.all_ids()
    assert data.side == side_table(list(comps.values()))
    tgt, mine = targets["twitter"], data.targets["twitter"]
    assert (mine.adapt_idx, mine.eval_idx) == (tgt.adapt_idx, tgt.eval_idx)
    assert torch.equal(mine.style.images, tgt.style.images) and torch.equal(mine.style.labels, tgt.style.labels)
    options = manifest["selection"]["labelled"]["options"]
    # the frozen configuration, and with every candidate of the top k·r fetched (the probe's redraw)
    cfg = adapt_config(method="t3ar", k=PLAN.k, **options)
    for probe in (NO_PROBE, Probe(redraw_neighbours=True)):
        for seed in (0, 1):
            subset = [tgt.adapt_idx[i] for i in fraction_subset(len(tgt.adapt_idx), 0.5, seed)]
            x = tgt.style.images[subset]
            a = retrieve(bench, x, cfg, PLAN.image_size, stream(seed, 4), probe=probe)
            b = retrieve(packed, x, cfg, PLAN.image_size, stream(seed, 4), probe=probe)
            assert a.pool_ids == b.pool_ids and torch.equal(a.neighbours, b.neighbours)
            assert torch.equal(a.pool_images, b.pool_images)
            if probe.redraw_neighbours:
                assert a.candidates is not None and b.candidates is not None
                assert torch.equal(a.candidates, b.candidates)
    ids_a, x_a = labelled_tensors(bench, bench_key + "|bench", data.side, PLAN.image_size)
    ids_b, x_b = labelled_tensors(packed, packed_key + "|pack", data.side, PLAN.image_size)
    assert ids_a == ids_b and torch.equal(x_a, x_b)
