"""Retrieval quality of each retriever R on each shift, from the emoji side labels (reporting, and the choice of
R on the validation shift only).

For every image of a shift's adaptation part, its top-k pool neighbours by R are compared with its true
subcategory (:func:`t3ar_bench.method.protocol.retrieval_diagnostics`): the same-class share of *all*
neighbours (clipart counts as another class: it is what the method sees), the share of the very same emoji in
another style, the clipart share, and the same for the top r·k the paper's dedup draws from.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from t3ar.datakit.emoji import ALL_STYLES
from t3ar_bench.method.protocol import retrieval_diagnostics
from t3ar_bench.method.runs import Context, pool_name

#: the neighbour counts quality is measured at: what k = 5 uses plainly (r = 1), and the top r·k = 25 the paper's
#: dedup samples its 5 from
DEPTHS = (5, 25)


def quality(ctx: Context, shift: str, retriever: str, depth: int) -> dict[str, Any]:
    """Retrieval quality of ``retriever`` on ``shift`` at ``depth`` neighbours per query."""
    pool, _ = ctx.pools[pool_name(shift, retriever, ctx.plan)]
    tgt = ctx.targets[shift]
    queries = pool.embed(tgt.style.images[tgt.adapt_idx])
    _, ids = pool.search(queries, depth)
    labels = tgt.style.label_names(tgt.adapt_idx)
    items = [tgt.style.items[i] for i in tgt.adapt_idx]
    pool_labels = [ctx.side[pid][0] for pid in pool.all_ids() if pid in ctx.side]
    d = retrieval_diagnostics(ids, labels, items, ctx.side, pool_labels)
    emoji = sum(v for s, v in d.sources.items() if s in ALL_STYLES)
    known = 0.0 if math.isnan(d.known_fraction) else d.known_fraction
    return {"depth": depth, "queries": d.n_queries,
            "same_class_share": (d.same_label_fraction * known) if known else 0.0,
            "same_class_of_emoji": d.same_label_fraction, "same_emoji_of_emoji": d.same_item_fraction,
            "emoji_share": emoji, "clipart_share": 1.0 - emoji,
            "queries_with_same_class": d.queries_with_same_label, "chance_same_class": d.chance_same_label}


def quality_table(ctx: Context) -> dict[str, dict[str, dict[str, dict[str, Any]]]]:
    """shift -> retriever -> str(depth) -> :func:`quality`, for every shift and retriever of the plan."""
    return {shift: {r: {str(k): quality(ctx, shift, r, k) for k in DEPTHS} for r in ctx.plan.retrievers}
            for shift in ctx.targets}


def choose_retriever(table: Mapping[str, Mapping[str, Mapping[str, Mapping[str, Any]]]], shift: str,
                     retrievers: tuple[str, ...]) -> str:
    """The retriever whose top-5 neighbours on the validation ``shift`` are most often of the query's class (a
    tie keeps the earlier, i.e. the default)."""
    return max(retrievers, key=lambda r: table[shift][r][str(DEPTHS[0])]["same_class_share"])
