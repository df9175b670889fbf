"""Whole answers of the retriever service, for tests that mock it: its client reads them as the service's answer
models (:mod:`t3ar.clients.retriever_models`), which hold every field the service sends."""

from __future__ import annotations

from typing import Any


def stats_json(count: int, identity: str = "fake", **over: Any) -> dict[str, Any]:
    """``GET /stats`` of a flat pool of ``count`` images; ``over`` replaces fields."""
    return {"count": count, "dim": 4, "identity": identity, "kind": "images", "pool_tag": "fake", "sources": {},
            "labels": {}, "backend": "faiss",
            "index": {"type": "flat", "configured_type": "flat", "vectors": count, "tombstones": 0, "nlist": None,
                      "nprobe": None},
            "duplicate_threshold": 0.98, "duplicate_policy": "skip", "ready": True, "repairs": [], **over}


def item_json(pid: str, source: str = "", label: str | None = None, **over: Any) -> dict[str, Any]:
    """``GET /pool/{id}`` (and a row of ``GET /pool``) of an image item; ``over`` replaces fields."""
    return {"id": pid, "sha256": "0" * 64, "source": source, "metadata": {}, "filename": f"{pid}.png",
            "media_type": "image/png", "size": 100, "width": 16, "height": 16, "added_at": 0.0, "label": label,
            **over}
