"""Method options and diagnostics: per-visit neighbour redraw, 'all' pool negatives, near-duplicate dropping,
pool share of the InfoNCE denominator, pseudo-label accuracy and gradient-norm proxies."""

import dataclasses
import math
from typing import Any

import pytest
import torch
from provider_kit import SixItemPool
from tiny_models import TinyBackbone, tiny_config

from t3ar.device import seed_everything
from t3ar.method import losses
from t3ar.method.adapt import AdaptResult, adapt
from t3ar.method.augment import Normalizer
from t3ar.method.bank import MemoryBank
from t3ar.method.config import adapt_config
from t3ar.method.contrastive import ContrastiveState, StepOut, StepViews, step_views
from t3ar.method.probe import PROBE_SWITCHES, Probe
from t3ar.method.views import Views
from t3ar.models.classifier import Classifier
from t3ar.pipeline import retrieve

N, P = 12, 9


def _data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(123)
    target = torch.randint(0, 256, (N, 3, 16, 16), dtype=torch.uint8, generator=g)
    pool = torch.randint(0, 256, (P, 3, 16, 16), dtype=torch.uint8, generator=g)
    nbr = torch.randint(0, P, (N, 2), generator=g)
    # 4 candidates per image from pool items 0..5 only (6..8 are never candidates), one missing (-1)
    cand = torch.stack([torch.randperm(6, generator=g)[:4] for _ in range(N)])
    cand[:, 3] = -1
    return target, pool, nbr, cand


def _run(method: str = "t3ar", seed: int = 0, *, adapt_kw: dict[str, Any] | None = None,
         **cfg_kw: Any) -> tuple[Classifier, AdaptResult]:
    seed_everything(seed)
    model = Classifier(TinyBackbone(), 8, 3, 16)
    target, pool, nbr, _ = _data()
    switches = {k: cfg_kw.pop(k) for k in PROBE_SWITCHES if k in cfg_kw}  # the benchmarks' (t3ar.method.probe)
    cfg = tiny_config(method, k=2, epochs=2, batch_size=4, bank_size=32, train_groups=None, seed=seed, **cfg_kw)
    kw = dict(adapt_kw or {})
    if switches:
        kw["probe"] = dataclasses.replace(kw.get("probe") or Probe(), **switches)
    res = adapt(model, target, cfg, mean=(0.5,) * 3, std=(0.5,) * 3, neighbours=nbr, pool_images=pool,
                labels=torch.arange(N) % 3, device=torch.device("cpu"),
                generator=torch.Generator().manual_seed(seed), **kw)
    return model, res


def _record_draws(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[int], list[list[int]]]]:
    """Patch ContrastiveState.step to record (target ids, neighbour rows) of every step."""
    seen: list[tuple[list[int], list[list[int]]]] = []
    original = ContrastiveState.step

    def step(self: ContrastiveState, model: Classifier, ids: torch.Tensor, sv: StepViews, **kw: Any) -> StepOut:
        assert sv.nbr is not None
        seen.append((ids.tolist(), sv.nbr.tolist()))
        return original(self, model, ids, sv, **kw)

    monkeypatch.setattr(ContrastiveState, "step", step)
    return seen


def _draws_per_image(seen: list[tuple[list[int], list[list[int]]]]) -> dict[int, list[list[int]]]:
    per: dict[int, list[list[int]]] = {}
    for ids, rows in seen:
        for i, row in zip(ids, rows, strict=True):
            per.setdefault(i, []).append(row)
    return per


# --- per-visit redraw ---------------------------------------------------------------------------------------

def test_redraw_draws_anew_at_every_visit_only_from_the_candidates(monkeypatch: pytest.MonkeyPatch) -> None:
    _, _, _, cand = _data()
    seen = _record_draws(monkeypatch)
    _, res = _run(redraw_neighbours=True, adapt_kw={"candidates": cand})
    per = _draws_per_image(seen)
    assert sorted(per) == list(range(N)) and all(len(v) == 2 for v in per.values())  # 2 epochs = 2 visits
    for i, draws in per.items():
        valid = {c for c in cand[i].tolist() if c >= 0}
        for row in draws:
            assert len(set(row)) == 2 and set(row) <= valid  # k distinct valid candidates, never -1
    assert any(sorted(a) != sorted(b) for a, b in per.values())  # not drawn once per job
    assert res.pool_used == sorted({j for draws in per.values() for row in draws for j in row})
    assert max(res.pool_used) <= 5  # the fixed neighbours (any of 0..8) were not used


def test_redraw_is_reproducible_for_a_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    _, _, _, cand = _data()
    seen = _record_draws(monkeypatch)
    a, _ = _run(seed=3, redraw_neighbours=True, adapt_kw={"candidates": cand})
    first, seen[:] = list(seen), []
    b, _ = _run(seed=3, redraw_neighbours=True, adapt_kw={"candidates": cand})
    second, seen[:] = list(seen), []
    _run(seed=4, redraw_neighbours=True, adapt_kw={"candidates": cand})
    assert first == second and _draws_per_image(first) != _draws_per_image(seen)
    sa, sb = a.state_dict(), b.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


def test_without_redraw_the_fixed_neighbours_are_used_and_candidates_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    _, _, nbr, cand = _data()
    seen = _record_draws(monkeypatch)
    _run(adapt_kw={"candidates": cand})
    for i, draws in _draws_per_image(seen).items():
        assert draws == [nbr[i].tolist()] * 2


def test_redraw_without_candidates_is_an_error() -> None:
    with pytest.raises(ValueError, match="redraw_neighbours=True needs candidates"):
        _run(redraw_neighbours=True)


@pytest.mark.parametrize("method", ["t3ar", "t3ar-random"])
def test_redraw_is_no_job_option_only_the_probes(method: str) -> None:
    with pytest.raises(ValueError, match=f"redraw_neighbours is not an option of {method}: no benchmark round kept it"):
        adapt_config(method=method, redraw_neighbours=True)
    with pytest.raises(ValueError, match="redraw_neighbours"):  # nor in the retrieval group
        adapt_config(method=method, retrieval={"redraw_neighbours": True})


# --- pool negatives -----------------------------------------------------------------------------------------

def _small_bank() -> tuple[MemoryBank, torch.Tensor]:
    """Slots 0-2: target ids 0,1,2 (labels 0,1,0); slots 3-4: pool ids 7,8; slots 5-7: empty."""
    bank = MemoryBank(size=8, feat_dim=2, num_classes=2)
    bank.enqueue(torch.zeros(3, 2), torch.tensor([0, 1, 2]), logits=torch.zeros(3, 2))
    bank.enqueue(torch.zeros(2, 2), torch.tensor([7, 8]), from_pool=True)
    return bank, torch.tensor([0, 1, 0, -1, -1, -1, -1, -1])


def test_pool_negatives_own_vs_all() -> None:
    bank, bank_labels = _small_bank()
    ids, labels, nbrs = torch.tensor([0, 1]), torch.tensor([0, 1]), torch.tensor([[8, -1], [-1, -1]])
    own = losses.negative_mask(bank, ids, labels, bank_labels, nbrs, "own")
    assert own.tolist() == [[False, True, False, False, True, False, False, False],  # only its neighbour 8
                            [True, False, True, False, False, False, False, False]]  # no neighbours in the bank
    assert torch.equal(own, losses.negative_mask(bank, ids, labels, bank_labels, nbrs))  # the default
    every = losses.negative_mask(bank, ids, labels, bank_labels, nbrs, "all")
    assert every.tolist() == [[False, True, False, True, True, False, False, False],  # both pool entries, no
                              [True, False, True, True, True, False, False, False]]   # empty slot
    assert torch.equal(every, losses.negative_mask(bank, ids, labels, bank_labels, None, "all"))


def test_pool_negatives_all_runs_and_uses_more_of_the_pool() -> None:
    _, own = _run(pool_negatives="own")
    _, every = _run(pool_negatives="all")
    share_own = [h.pool_neg_share for h in own.history]
    share_all = [h.pool_neg_share for h in every.history]
    assert all(math.isfinite(h.loss) for h in every.history)
    assert sum(share_all) > sum(share_own)


# --- pool share of the InfoNCE denominator ------------------------------------------------------------------

def test_denominator_share_by_hand() -> None:
    logits = torch.tensor([[0.0, math.log(2.0), math.log(3.0), float("-inf")],
                           [0.0, float("-inf"), float("-inf"), float("-inf")]])
    cols = torch.tensor([[False, True, True], [False, True, True]])
    # row 0: exp = 1, 2, 3, 0 -> pool share 3/6; row 1: no finite pool logit -> 0
    assert losses.denominator_share(logits, cols).item() == pytest.approx(0.25)


def test_pool_neg_share_zero_without_retrieval_and_inside_01_with_it() -> None:
    _, none = _run("t3ar-noretrieval")
    assert [h.pool_neg_share for h in none.history] == [0.0] * none.steps
    _, some = _run("t3ar")
    assert all(0.0 < h.pool_neg_share < 1.0 for h in some.history)
    _, tent = _run("tent")
    assert not any(hasattr(h, "pool_neg_share") for h in tent.history)  # the family's metric, not tent's


# --- diagnostics --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["t3ar", "adacontrast", "shot-im"])
def test_diagnostic_labels_change_nothing_but_fill_pl_accuracy(method: str) -> None:
    truth = (torch.arange(N) * 7) % 3
    a, ra = _run(method, seed=1)
    b, rb = _run(method, seed=1, adapt_kw={"probe": Probe(diagnostic_labels=truth)})
    sa, sb = a.state_dict(), b.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert [h.loss for h in ra.history] == [h.loss for h in rb.history]
    assert all(math.isnan(h.pl_accuracy) for h in ra.history)
    assert all(0.0 <= h.pl_accuracy <= 1.0 for h in rb.history)


def test_pl_accuracy_scores_the_labels_the_step_used() -> None:
    labels = torch.arange(N) % 3  # train mode: the CE term uses these, so against themselves accuracy is 1
    _, res = _run("t3ar", mode="train", adapt_kw={"probe": Probe(diagnostic_labels=labels)})
    assert [h.pl_accuracy for h in res.history] == [1.0] * res.steps
    _, res = _run("t3ar", mode="train", adapt_kw={"probe": Probe(diagnostic_labels=(labels + 1) % 3)})
    assert [h.pl_accuracy for h in res.history] == [0.0] * res.steps


def test_diagnostics_fill_finite_grad_norms_and_change_no_parameter() -> None:
    a, plain = _run("t3ar", seed=2)
    b, diag = _run("t3ar", seed=2, adapt_kw={"probe": Probe(diagnostics=True)})
    assert all(math.isnan(h.grad_norm_ce) and math.isnan(h.grad_norm_contrastive) for h in plain.history)
    for h in diag.history:
        assert math.isfinite(h.grad_norm_ce) and h.grad_norm_ce >= 0
        assert math.isfinite(h.grad_norm_contrastive) and h.grad_norm_contrastive >= 0
    assert any(h.grad_norm_ce > 0 for h in diag.history) and any(h.grad_norm_contrastive > 0 for h in diag.history)
    sa, sb = a.state_dict(), b.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


# --- retrieve(): near-duplicate dropping and candidates -----------------------------------------------------

def _retrieve(method: str = "t3ar", **cfg_kw: Any) -> tuple[Any, SixItemPool]:
    provider = SixItemPool()
    target = torch.zeros(20, 3, 8, 8, dtype=torch.uint8)
    switches = {k: cfg_kw.pop(k) for k in PROBE_SWITCHES if k in cfg_kw}  # the benchmarks' (t3ar.method.probe)
    got = retrieve(provider, target, adapt_config(method=method, k=2, r=2, **cfg_kw), 8,
                   torch.Generator().manual_seed(0), probe=Probe(**switches))
    return got, provider


def test_dedup_threshold_drops_near_duplicates() -> None:
    kept, _ = _retrieve()
    assert "a" in kept.pool_ids  # 20 queries drawing 2 of 4: 'a' is drawn somewhere without the threshold
    got, provider = _retrieve(dedup_threshold=0.95)
    assert "a" not in got.pool_ids and "a" not in provider.fetched
    assert set(got.pool_ids) == {"b", "c", "d"} and got.candidates is None
    assert int((got.neighbours < 0).sum()) == 0  # 3 valid candidates remain for k=2
    low, _ = _retrieve(dedup_threshold=0.55)  # drops a and b: only c and d remain, both always drawn
    assert sorted(low.pool_ids) == ["c", "d"]


def test_retrieve_records_a_sample_of_the_drawn_neighbours_with_their_scores() -> None:
    from t3ar.pipeline import SAMPLE_TARGETS, sample_rows

    got, _ = _retrieve(dedup_threshold=0.95)
    assert [i for i, _ in got.sample] == sample_rows(20) == [0, 3, 5, 8, 11, 14, 16, 19]  # spread over the 20
    assert len(sample_rows(20)) == SAMPLE_TARGETS and sample_rows(3) == [0, 1, 2]
    score = {"b": 0.6, "c": 0.5, "d": 0.4}
    for i, row in got.sample:
        assert [pid for pid, _ in row] == [got.pool_ids[j] for j in got.neighbours[i].tolist()]
        assert all(sc == pytest.approx(score[pid]) for pid, sc in row)
    rand, _ = _retrieve("t3ar-random")
    assert rand.sample and all(sc is None for _, row in rand.sample for _, sc in row)


def test_redraw_fetches_every_candidate_and_returns_them() -> None:
    fixed, _ = _retrieve()
    got, provider = _retrieve(redraw_neighbours=True, dedup_threshold=0.95)
    assert got.candidates is not None and got.candidates.shape == (20, 4)
    assert sorted(provider.fetched) == ["b", "c", "d"] and len(got.pool_images) == 3
    assert (got.candidates[:, 0] == -1).all()  # 'a' dropped
    for row, cands in zip(got.neighbours.tolist(), got.candidates.tolist(), strict=True):
        assert set(row) <= set(cands) - {-1}
    drawn, _ = _retrieve(redraw_neighbours=True)
    as_ids = [[drawn.pool_ids[j] for j in row] for row in drawn.neighbours.tolist()]
    assert as_ids == [[fixed.pool_ids[j] for j in row] for row in fixed.neighbours.tolist()]  # same first draw


def test_random_retrieval_with_redraw_has_r_k_random_candidates_and_the_same_first_draw() -> None:
    fixed, _ = _retrieve("t3ar-random")
    assert fixed.candidates is None
    got, provider = _retrieve("t3ar-random", redraw_neighbours=True)
    assert got.candidates is not None and got.candidates.shape == (20, 4)
    assert torch.equal(got.candidates[:, :2], got.neighbours)
    as_ids = [[got.pool_ids[j] for j in row] for row in got.neighbours.tolist()]
    assert as_ids == [[fixed.pool_ids[j] for j in row] for row in fixed.neighbours.tolist()]
    assert len(set(provider.fetched)) == len(provider.fetched) == len(got.pool_images)


# --- bf16 no-gradient passes (an approximation, CPU) --------------------------------------------------------

def _conv_dtypes(model: Classifier) -> list[torch.dtype]:
    seen: list[torch.dtype] = []
    for m in model.modules():
        if isinstance(m, torch.nn.Conv2d):
            m.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
    return seen


def test_bf16_nograd_runs_only_the_no_gradient_passes_in_bf16_and_stays_close() -> None:
    target, pool, nbr, _ = _data()
    x, ids = target[:4], torch.arange(4)
    outs, dtypes = {}, {}
    for on in (False, True):
        seed_everything(0)
        model = Classifier(TinyBackbone(), 8, 3, 16)
        cfg = adapt_config(k=2, bank_size=32, cpu_bf16_nograd=on)
        views = Views(Normalizer((0.5,) * 3, (0.5,) * 3, torch.device("cpu")), torch.Generator().manual_seed(1))
        state = ContrastiveState.create(model, target, cfg, None, views, torch.Generator().manual_seed(2),
                                        torch.device("cpu"))
        model.train()
        seen = _conv_dtypes(model)
        views = Views(Normalizer((0.5,) * 3, (0.5,) * 3, torch.device("cpu")), torch.Generator().manual_seed(3))
        out = state.step(model, ids, step_views(x, nbr[:4], pool, views))
        out.loss.backward()
        valid = state.bank.valid
        outs[on], dtypes[on] = (out.loss.detach(), state.bank.feats[valid].clone()), seen
    assert set(dtypes[False]) == {torch.float32}
    # the no-grad pass (keys + pool) in bf16, the query pass with gradient in float32
    assert dtypes[True][0] == torch.bfloat16 and dtypes[True][-1] == torch.float32
    assert outs[True][1].dtype == torch.float32  # the bank keeps float32 features
    assert not torch.equal(outs[True][1], outs[False][1])  # it is an approximation...
    cos = torch.nn.functional.cosine_similarity(outs[True][1], outs[False][1], dim=1)
    assert cos.mean() > 0.98 and cos.min() > 0.9  # ...a close one (a 3-layer toy net: Lite0's are closer)
    assert abs(float(outs[True][0]) - float(outs[False][0])) < 0.05 * abs(float(outs[False][0]))


def test_bf16_nograd_changes_nothing_off_the_cpu_path() -> None:
    _, a = _run(seed=3)
    _, b = _run(seed=3, cpu_bf16_nograd=False)
    assert [s.loss for s in a.history] == [s.loss for s in b.history]
    _, c = _run(seed=3, cpu_bf16_nograd=True)
    assert len(c.history) == len(a.history) and all(math.isfinite(s.loss) for s in c.history)
