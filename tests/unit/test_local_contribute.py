"""A target joins a local pool folder (t3ar adapt --pool DIR --contribute): exact and near-duplicates skipped
and counted, the folder appears whole, a repeat adds nothing, bad input refused. R is a stub here (the mean
colour of an image as a unit vector): the rules are what is tested, not the embedder."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import pytest
from PIL import Image

from t3ar.errors import InvalidInputError
from t3ar.local_contribute import MANIFEST, contribute_local


def _png(path: Path, rgb: tuple[int, int, int], noise: int = 0) -> Path:
    a = np.full((8, 8, 3), rgb, dtype=np.uint8)
    a[0, 0] = (a[0, 0].astype(int) + noise) % 256
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "PNG")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buf.getvalue())
    return path


class StubEmbedder:
    identity = "stub-mean-colour"

    def embed(self, images: list[Image.Image], batch_size: int = 0) -> np.ndarray:
        v = np.stack([np.asarray(im.convert("RGB"), dtype=np.float32).mean(axis=(0, 1)) + 1.0 for im in images])
        return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


class StubPool:
    def __init__(self, paths: list[Path]) -> None:
        self.embedder = StubEmbedder()
        self.identity = self.embedder.identity
        self.vectors = self.embedder.embed([Image.open(p) for p in paths])
        self.index = faiss.IndexFlatIP(3)
        self.index.add(self.vectors)

    def size(self) -> int:
        return int(self.index.ntotal)

    def search(self, q: np.ndarray, k: int) -> tuple[np.ndarray, Any]:
        return self.index.search(q, k)[0], None


def test_contribution_skips_duplicates_and_is_idempotent(tmp_path: Path) -> None:
    pool_dir = tmp_path / "pool"
    pool_files = [_png(pool_dir / "red.png", (250, 0, 0)), _png(pool_dir / "blue.png", (0, 0, 250))]
    tgt = tmp_path / "target"
    target = [_png(tgt / "green.png", (0, 250, 0)),
              _png(tgt / "copy.png", (250, 0, 0)),  # the same bytes as pool/red.png
              _png(tgt / "near.png", (0, 0, 250), noise=3),  # other bytes, the same colour to R
              _png(tgt / "green-again.png", (0, 250, 0), noise=2),  # near-duplicate of an image added before it
              _png(tgt / "grey.png", (120, 120, 120))]
    rec = contribute_local(pool_dir, target, "run1", StubPool(pool_files), threshold=0.999)
    assert (rec["added"], rec["skipped_exact"], rec["skipped_near"], rec["images"]) == (2, 1, 2, 5)
    assert rec["source"] == "target:run1" and not rec["repeated"]
    folder = pool_dir / "target-run1"
    assert sorted(p.name for p in folder.iterdir()) == sorted([MANIFEST] + [f["file"] for f in rec["files"]])
    assert [f["from"] for f in rec["files"]] == ["green.png", "grey.png"]
    again = contribute_local(pool_dir, target, "run1", StubPool(pool_files), threshold=0.999)
    assert again["repeated"] and again["added"] == 2 and len(list(folder.iterdir())) == 3
    assert not [p for p in pool_dir.iterdir() if p.name.startswith(".")]  # no temp folder left


def test_bad_input_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    pool_dir = tmp_path / "pool"
    files = [_png(pool_dir / "a.png", (1, 2, 3))]
    target = [_png(tmp_path / "t" / "b.png", (200, 2, 3))]
    archive = tmp_path / "pool.zip"
    archive.write_bytes(b"PK")
    for kwargs, match in [({"pool_dir": archive}, "folder"), ({"threshold": 0.0}, "threshold"),
                          ({"threshold": 1.5}, "threshold"), ({"run_id": "../x"}, "run id")]:
        args: dict[str, Any] = {"pool_dir": pool_dir, "run_id": "r", "threshold": 0.98, **kwargs}
        with pytest.raises(InvalidInputError, match=match):
            contribute_local(args["pool_dir"], target, args["run_id"], StubPool(files), threshold=args["threshold"])
    assert sorted(p.name for p in pool_dir.iterdir()) == ["a.png"]
