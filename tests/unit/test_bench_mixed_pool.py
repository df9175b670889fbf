"""The mixed pool of issue 52 (a team's pool: relevant items <= 5 %): the cap, the even seeded pick, the
composition and the folder reader."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from t3ar_bench.method.data import Component
from t3ar_bench.retrieval.mixed_pool import compose, folder_components, pick_relevant, relevant_cap


@pytest.mark.parametrize(("unrelated", "available", "share", "cap"),
                         [(95, 100, 0.05, 5), (100, 100, 0.05, 5), (1000, 10, 0.05, 10), (19, 5, 0.05, 1),
                          (18, 5, 0.05, 0), (100_000, 10_000, 0.05, 5263)])
def test_relevant_cap_keeps_the_share(unrelated: int, available: int, share: float, cap: int) -> None:
    got = relevant_cap(unrelated, available, share)
    assert got == cap
    assert got / (unrelated + got) <= share if got else True
    if got < available:
        assert (got + 1) / (unrelated + got + 1) > share  # one more would break it


def _comp(name: str, n: int, labelled: bool = True) -> Component:
    return Component(name, [f"{name}/{i}" for i in range(n)], [Path(f"{name}/{i}.png") for i in range(n)],
                     [f"c{i % 3}" for i in range(n)] if labelled else None, [str(i) for i in range(n)])


def test_pick_relevant_spreads_evenly_and_is_seeded() -> None:
    comps = [_comp("a", 10), _comp("b", 2), _comp("c", 10)]
    got = pick_relevant(comps, 9, seed=1)
    assert {c.name: len(c.ids) for c in got} == {"a": 4, "b": 2, "c": 3}
    assert [c.ids for c in got] == [c.ids for c in pick_relevant(comps, 9, seed=1)]
    assert [c.ids for c in got] != [c.ids for c in pick_relevant(comps, 9, seed=2)]
    a = got[0]
    assert all(a.labels is not None and a.labels[j] == f"c{int(pid.split('/')[1]) % 3}" for j, pid in enumerate(a.ids))


def test_compose_holds_every_unrelated_item_and_at_most_five_percent_relevant() -> None:
    pool = compose([_comp("icons", 150, labelled=False), _comp("clip", 40, labelled=False)],
                   [_comp("twitter", 50), _comp("openmoji", 50)], seed=0)
    s = pool.summary()
    assert s["unrelated"] == 190 and s["relevant"] == 10 and s["labelled"] == 10 and s["relevant_share"] == 0.05
    assert s["per_component"] == {"icons": 150, "clip": 40, "twitter": 5, "openmoji": 5}
    with pytest.raises(ValueError, match="repeat"):
        compose([_comp("a", 3, labelled=False)], [_comp("a", 3)])


def test_folder_components_read_a_store_and_cap_each_folder(tmp_path: Path) -> None:
    for folder, n in (("mdi", 5), ("ph", 2)):
        (tmp_path / folder).mkdir()
        for i in range(n):
            Image.new("RGB", (4, 4)).save(tmp_path / folder / f"i{i}.png")
    (tmp_path / "manifest.json").write_text("{}")
    comps = folder_components(tmp_path, cap=3, seed=0)
    assert [(c.name, len(c.ids)) for c in comps] == [("mdi", 3), ("ph", 2)]
    assert comps[1].ids == ["ph/i0", "ph/i1"] and comps[1].labels is None


def test_the_bench_pool_answers_label_filtered_searches_from_its_components() -> None:
    import numpy as np
    from retriever_kit import unit_vectors

    from t3ar_bench.method.data import BenchPool

    class _Embedder:
        identity = "none"
        dim = 4

    comps = [_comp("icons", 3, labelled=False), _comp("twitter", 4)]  # twitter labels c0, c1, c2, c0
    vecs = unit_vectors(7, 4, seed=2)
    pool = BenchPool(_Embedder(), comps, [vecs[:3], vecs[3:]], {}, {})  # type: ignore[arg-type]
    _, ids = pool.search_label(vecs[[0]], 3, "c0")
    assert sorted(p for p in ids[0] if p) == ["twitter/0", "twitter/3"] and ids[0][2] == ""
    assert pool.labels(["twitter/0"]) == [None]  # the method still reads labels from the side table only
    assert pool.search_label(vecs[[0]], 2, None)[1] == pool.search(vecs[[0]], 2)[1]
    assert np.isneginf(pool.search_label(vecs[[0]], 3, "c0")[0][0, 2])
