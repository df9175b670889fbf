"""The GPU grid's pack: what the method benchmark's frozen arms need on a machine that has torch,
timm, numpy and pillow but no faiss, no retriever model, no data kits and no network.

:mod:`t3ar_bench.method.gpu_pack` writes a pack here (on CPU, from the kits, the cached embeddings and faiss);
:mod:`t3ar_bench.method.gpu_grid` runs it there. A pack folder holds:

* ``manifest.json``: :data:`PACK_FORMAT`, the code version (:func:`pack_code`), the plan (BenchPlan fields), the
  frozen selection and where it came from, the kit request (part of the source models' cache key), each shift's
  pool key, and the size and sha256 of every other file;
* ``images.npy.xz``: every distinct image once, uint8 ``[N, S, S, 3]`` (HWC, at the plan's ``image_size``), an
  lzma-compressed ``.npy`` (lossless; it packs emoji about twice as tight as ``np.savez_compressed``);
* ``arrays.npz``: per style its image rows and labels; per shift its adaptation and evaluation indices, its pool (
  global pool indices, in the order the bench's pool has them) and, for every image of its adaptation part, the
  retriever's top-``m`` pool neighbours (indices into the shift's pool, -1 = none) with their scores; per global
  pool item its image row (-1 = not shipped: an unlabelled item no adaptation image retrieves);
* ``meta.json.xz``: the strings: each style's classes and emoji codes, the global pool ids, the side table (pool
  id -> subcategory, emoji code of the labelled items);
* ``wheels/`` (optional): Python wheels the device lacks, installed by ``scripts/gpu_grid.sh``.

This module reads packs (and holds the writer's format helpers); it imports no faiss and no retriever.
"""

from __future__ import annotations

import hashlib
import io
import json
import lzma
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from t3ar.digest import file_sha256
from t3ar.errors import InvalidInputError, T3arError
from t3ar_bench.method.data import StyleSet, content_key
from t3ar_bench.method.labelled_pool import style_of
from t3ar_bench.method.plans import BenchPlan
from t3ar_bench.method.runs import Target, code_hash, pool_name

PACK_FORMAT = 1
MANIFEST, IMAGES, ARRAYS, META, WHEELS = "manifest.json", "images.npy.xz", "arrays.npz", "meta.json.xz", "wheels"
#: the bench modules whose code decides what a pack holds or what its runs do (with :func:`runs.code_hash`'s)
PACK_MODULES = ("data.py", "protocol.py", "labelled_pool.py", "runs.py", "arms.py", "grid.py", "labelled.py",
                "label_use.py", "pack.py", "gpu_pack.py")


class PackError(T3arError):
    """A pack that is missing, incomplete, corrupt or from another code version (one line, says what to do)."""


def pack_code() -> str:
    """The code version a pack belongs to: the method, models and pipeline (:func:`runs.code_hash`) and the bench
    modules of :data:`PACK_MODULES`. A pack built by other code is refused: its neighbours or arms may differ."""
    h = hashlib.sha256(code_hash().encode())
    here = Path(__file__).parent
    for name in PACK_MODULES:
        h.update(name.encode())
        h.update((here / name).read_bytes())
    return h.hexdigest()


def compress_images(images_hwc: np.ndarray) -> bytes:
    """uint8 ``[N, S, S, 3]`` -> the bytes of ``images.npy.xz``."""
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(images_hwc, dtype=np.uint8))
    return lzma.compress(buf.getvalue(), preset=9)


def dump_meta(meta: Mapping[str, Any]) -> bytes:
    return lzma.compress(json.dumps(meta, sort_keys=True).encode(), preset=9)


def plan_from_dict(d: Mapping[str, Any]) -> BenchPlan:
    """A :class:`BenchPlan` from its ``as_dict()`` read back from JSON (lists become the tuples the plan uses)."""
    def tup(v: Any) -> Any:
        return tuple(tup(x) for x in v) if isinstance(v, list) else v

    names = {f.name for f in fields(BenchPlan)}
    return BenchPlan(**{k: tup(v) for k, v in d.items() if k in names})


def read_manifest(pack: Path, *, check_code: bool = True) -> dict[str, Any]:
    """The pack's manifest, after checking that the pack is complete, intact and of this code version.

    Raises :class:`PackError` (one line) when the folder or a file is missing, a file's size or sha256 differs,
    the format is another, or (``check_code``) the pack was built by other code than this checkout's."""
    path = pack / MANIFEST
    if not path.is_file():
        raise PackError(f"no GPU pack at {pack} ({MANIFEST} missing): build one with `t3ar bench gpu-pack --out "
                        f"{pack}`")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise PackError(f"{path}: not a readable manifest ({exc}); rebuild the pack") from exc
    if manifest.get("format") != PACK_FORMAT:
        raise PackError(f"{pack}: pack format {manifest.get('format')!r}, this code reads {PACK_FORMAT}; rebuild it")
    for name, info in manifest.get("files", {}).items():
        f = pack / name
        if not f.is_file() or f.stat().st_size != info["bytes"] or file_sha256(f) != info["sha256"]:
            raise PackError(f"{pack}: {name} is missing or differs from the manifest; rebuild the pack")
    if check_code and manifest.get("code") != pack_code():
        raise PackError(f"{pack}: built by another code version (pack {str(manifest.get('code'))[:12]}, this "
                        f"checkout {pack_code()[:12]}; built at commit {manifest.get('commit') or '?'}): rebuild it "
                        "here with `t3ar bench gpu-pack`")
    return manifest


def unpack_images(pack: Path, manifest: Mapping[str, Any], dest: Path) -> Path:
    """Decompress ``images.npy.xz`` once into ``dest`` as a CHW ``.npy`` the run processes memory-map; reused when
    already there for this pack (named by the file's sha256)."""
    out = dest / f"images-{manifest['files'][IMAGES]['sha256'][:16]}.npy"
    if out.is_file():
        return out
    hwc = np.load(io.BytesIO(lzma.decompress((pack / IMAGES).read_bytes())))
    dest.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp.npy")
    np.save(tmp, np.ascontiguousarray(hwc.transpose(0, 3, 1, 2)))
    tmp.replace(out)
    return out


class PackPool:
    """A shift's pool as the pack holds it: a :class:`~t3ar.method.retrieval.NeighbourProvider` whose search was
    done when the pack was built (by the bench's own pool: the same R, faiss, the same ids in the same order).

    Contract: ``embed`` accepts only the shift's adaptation images (found by content) and returns their *row keys*
    (float32 ``[N, 1]``), not embeddings; only this pool's ``search`` reads them, and it returns the first ``k`` of
    the precomputed top-``m`` (InvalidInputError for ``k > m`` or another image). ``fetch`` returns the shipped
    images (PackError for an item that was not shipped: an unlabelled item no adaptation image retrieves).
    ``labels`` returns None for every id, as :class:`~t3ar_bench.method.data.BenchPool` does: the runs take pool
    labels from the side table."""

    def __init__(self, identity: str, ids: Sequence[str], image_rows: np.ndarray, images: torch.Tensor,
                 query_rows: Mapping[bytes, int], candidates: np.ndarray, scores: np.ndarray) -> None:
        if not len(ids) == len(image_rows) or candidates.shape != scores.shape:
            raise ValueError("ids and image rows, candidates and scores must be aligned")
        self._identity, self._ids, self._rows = identity, list(ids), image_rows
        self._images, self._queries = images, dict(query_rows)
        self._cand, self._scores = candidates, scores
        self._index = {pid: i for i, pid in enumerate(self._ids)}

    @property
    def identity(self) -> str:
        return self._identity

    def size(self) -> int:
        return len(self._ids)

    def embed(self, images: torch.Tensor) -> np.ndarray:
        keys = []
        for img in images:
            row = self._queries.get(content_key(img))
            if row is None:
                raise InvalidInputError("the pack has neighbours for the shift's adaptation images only")
            keys.append(row)
        return np.asarray(keys, dtype=np.float32).reshape(-1, 1)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, list[list[str]]]:
        if k > self._cand.shape[1]:
            raise InvalidInputError(f"the pack holds the top {self._cand.shape[1]} neighbours per image, {k} asked")
        rows = np.asarray(queries[:, 0], dtype=np.int64)
        ids = [[self._ids[j] if j >= 0 else "" for j in self._cand[r, :k]] for r in rows]
        return self._scores[rows, :k].copy(), ids

    def all_ids(self) -> list[str]:
        return list(self._ids)

    def fetch(self, ids: Sequence[str]) -> list[Image.Image]:
        out = []
        for pid in ids:
            row = int(self._rows[self._index[pid]])
            if row < 0:
                raise PackError(f"pool item {pid} was not shipped in the pack (no adaptation image retrieves it)")
            out.append(Image.fromarray(self._images[row].permute(1, 2, 0).numpy()))
        return out

    def sources(self, ids: Sequence[str]) -> list[str]:
        return [style_of(pid) for pid in ids]

    def labels(self, ids: Sequence[str]) -> list[str | None]:
        return [None] * len(ids)


@dataclass
class PackData:
    """A pack loaded in a process: the plan, the frozen selection, the source style, each shift's target and pool
    (keyed as :func:`t3ar_bench.method.runs.pool_name` keys them) and the side table."""

    manifest: dict[str, Any]
    plan: BenchPlan
    selection: dict[str, Any]
    source: StyleSet
    targets: dict[str, Target]
    pools: dict[str, tuple[PackPool, str]]
    side: dict[str, tuple[str, str]]


def load_pack(pack: Path, manifest: Mapping[str, Any], images_npy: Path) -> PackData:
    """Everything of a checked pack (:func:`read_manifest`) with its images from :func:`unpack_images`."""
    table = np.load(images_npy, mmap_mode="r")
    arrays = np.load(pack / ARRAYS)
    meta = json.loads(lzma.decompress((pack / META).read_bytes()))
    plan = plan_from_dict(manifest["plan"])

    def style(name: str) -> StyleSet:
        rows = arrays[f"style:{name}:rows"]
        info = meta["styles"][name]
        return StyleSet(name, torch.from_numpy(np.array(table[rows])), torch.from_numpy(
            arrays[f"style:{name}:labels"].astype(np.int64)), list(info["classes"]), list(info["items"]))

    pool_rows = arrays["pool:image_row"]
    shipped = np.flatnonzero(pool_rows >= 0)
    # only the shipped pool images are read; a pool's rows index into this compact copy
    pool_images = torch.from_numpy(np.array(table[pool_rows[shipped]]))
    compact = np.full(len(pool_rows), -1, dtype=np.int64)
    compact[shipped] = np.arange(len(shipped))
    ids_all: list[str] = meta["pool_ids"]
    targets, pools = {}, {}
    for shift in plan.eval_shifts:
        st = style(shift)
        adapt = [int(i) for i in arrays[f"shift:{shift}:adapt"]]
        targets[shift] = Target(shift, st, adapt, [int(i) for i in arrays[f"shift:{shift}:eval"]])
        order = arrays[f"shift:{shift}:pool"]
        queries = {content_key(st.images[i]): r for r, i in enumerate(adapt)}
        pool = PackPool(manifest["pool_identity"], [ids_all[g] for g in order], compact[order], pool_images, queries,
                        arrays[f"shift:{shift}:cand"], arrays[f"shift:{shift}:scores"])
        pools[pool_name(shift, None, plan)] = (pool, manifest["pool_keys"][shift])
    side = {pid: (lab, item) for pid, (lab, item) in meta["side"].items()}
    return PackData(dict(manifest), plan, dict(manifest["selection"]), style(manifest["source_style"]), targets,
                    pools, side)
