"""What a labelled arm's runs trained on (reporting only, never part of a choice): the labelled pool items each
run used, from which style, and whether their label was a retrieving query's class."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch


def label_use(served: Mapping[int, int], pool_ids: Sequence[str], pool_class: torch.Tensor, steps: int,
              retrieving: torch.Tensor | None, query_class: torch.Tensor) -> dict[str, Any]:
    """``served``: local pool index -> steps it served as labelled data (``AdaptResult.pool_labelled``);
    ``pool_ids`` / ``pool_class`` [P] the run's pool (ids ``<style>/<item>``) and each item's label as a class;
    ``retrieving`` [N, m] the local pool indices each target image retrieved (neighbours or candidates; None for
    draws that do not come from retrieval); ``query_class`` [N] the target images' true classes (diagnostics).

    Returns ``per_step`` (labelled items per step), ``distinct``, ``style_share`` (share of the uses per style) and
    ``query_class_share`` (share of the uses whose label is the class of a query that retrieved the item; for
    draws without retrieval, of any image of the adapted subset)."""
    total = sum(served.values())
    if not total:
        return {"per_step": 0.0, "distinct": 0, "style_share": {}, "query_class_share": float("nan")}
    styles: dict[str, float] = {}
    for i, uses in served.items():
        style = pool_ids[i].split("/", 1)[0]
        styles[style] = styles.get(style, 0.0) + uses / total
    if retrieving is not None:
        hits = 0
        for i, uses in served.items():
            rows = (retrieving == i).any(1)
            if bool((query_class[rows] == pool_class[i]).any()):
                hits += uses
    else:
        present = set(query_class.tolist())
        hits = sum(uses for i, uses in served.items() if int(pool_class[i]) in present)
    return {"per_step": total / max(1, steps), "distinct": len(served), "style_share": dict(sorted(styles.items())),
            "query_class_share": hits / total}
