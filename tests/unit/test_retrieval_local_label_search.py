"""LocalPool's label-filtered search (class-conditional retrieval in the CLI and the benchmarks): exact, padded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from retriever_kit import unit_vectors

from t3ar.local_pool import LocalPool


class _NoEmbedder:
    identity = "none"


def test_local_label_search_is_exact_among_that_labels_items() -> None:
    vecs = unit_vectors(6, 4, seed=1)
    labels = ["x", None, "x", "y", "x", None]
    pool = LocalPool(_NoEmbedder(), [Path(f"{i}.png") for i in range(6)],  # type: ignore[arg-type]
                     [f"i{i}" for i in range(6)], vecs, labels)
    q = vecs[[3]]
    scores, ids = pool.search_label(q, 4, "x")
    order = sorted([0, 2, 4], key=lambda j: -float(vecs[j] @ q[0]))
    assert ids == [[f"i{j}" for j in order] + [""]]
    assert np.isneginf(scores[0, 3]) and scores[0, 0] == np.float32(vecs[order[0]] @ q[0])
    assert pool.search_label(q, 2, None)[1] == pool.search(q, 2)[1]
