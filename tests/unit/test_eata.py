"""EATA: the reliable and non-redundant selection, the re-weighted entropy, the Fisher anchor (estimated on the
target's pseudo-labels) and a run through the loop that trains only the normalisation layers."""

import math

import pytest
import torch
import torch.nn.functional as F
from tiny_models import AFFINE_CLASSES, AFFINE_E0, Affine, confident_run, tiny_problem
from torch import nn

from t3ar.method import eata as eata_module
from t3ar.method import safeguards
from t3ar.method.augment import Normalizer
from t3ar.method.config import adapt_config
from t3ar.method.eata import D_MARGIN, EATA, FISHER_ALPHA, PROBS_EMA
from t3ar.method.reliable import fisher_diagonal, fisher_penalty, running_stats_kept, sample_entropy
from t3ar.method.safeguards import stable_fisher
from t3ar.method.schedule import epoch_batches
from t3ar.method.views import Views

C = AFFINE_CLASSES
E0 = AFFINE_E0


def _views() -> Views:
    return Views(Normalizer((0.5,) * 3, (0.5,) * 3, torch.device("cpu")), torch.Generator())


def _eata(model: Affine, fisher: list[torch.Tensor] | None = None) -> EATA:
    params = list(model.parameters())
    return EATA(_views(), model, params, fisher or [torch.zeros_like(p) for p in params])  # type: ignore[arg-type]


def _onehot(cls: int, margin: float = 6.0) -> list[float]:
    return [margin if i == cls else 0.0 for i in range(C)]


def test_first_batch_selects_the_reliable_images() -> None:
    method = _eata(Affine())
    logits = torch.tensor([_onehot(0), [0.0] * C, _onehot(1)])
    ent, reliable, selected = method.select(logits)
    assert reliable.tolist() == [True, False, True] and selected.tolist() == [True, False, True]
    probs = logits.softmax(1)
    assert torch.allclose(method.probs, probs[[0, 2]].mean(0))  # no average yet: it starts at their mean


def test_redundant_images_are_left_out_and_the_average_moves() -> None:
    method = _eata(Affine())
    method.select(torch.tensor([_onehot(0)]))  # the average: class 0
    avg = method.probs.clone()
    logits = torch.tensor([_onehot(0), _onehot(1), [0.0] * C, _onehot(0, 5.0)])
    _, reliable, selected = method.select(logits)
    probs = logits.softmax(1)
    cos = F.cosine_similarity(avg[None], probs, dim=1)
    assert cos[1] < D_MARGIN < cos[0]  # the class-1 image is new, the class-0 ones repeat the average
    assert reliable.tolist() == [True, True, False, True]
    assert selected.tolist() == [False, True, False, False]
    assert torch.allclose(method.probs, PROBS_EMA * avg + (1 - PROBS_EMA) * probs[1])
    # a batch that selects nothing (an uncertain image, one that repeats the average) leaves the average as it is
    before = method.probs.clone()
    _, _, none = method.select(torch.tensor([[0.0] * C, _onehot(0)]))
    assert not none.any() and torch.equal(method.probs, before)
    assert method.selection() == {"seen": 7, "reliable": 5, "selected": 2}


def test_loss_is_the_reweighted_entropy_of_the_selected_images() -> None:
    model = Affine()
    method = _eata(model)
    logits = torch.tensor([_onehot(0, 4.0), [0.0] * C, _onehot(1, 3.0)])
    ids = torch.arange(3)
    loss = method.step(model, ids, ids, logits).loss  # type: ignore[arg-type]
    ent = sample_entropy(logits)
    expected = (torch.exp(E0 - ent[0]) * ent[0] + torch.exp(E0 - ent[2]) * ent[2]) / 2
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)


def test_fisher_penalty_is_zero_at_the_anchor_and_pulls_back() -> None:
    model = Affine()
    fisher = [torch.tensor([1.0, 2.0, 0.0, 4.0]), torch.full((C,), 0.5)]
    method = _eata(model, fisher)
    assert method.penalty().item() == 0.0
    with torch.no_grad():
        model.weight.add_(torch.tensor([0.1, -0.2, 0.3, 0.0]))
    assert method.penalty().item() == pytest.approx(1 * 0.01 + 2 * 0.04)
    # a batch without any selected image: the step's gradient is the anchor's alone, towards theta0
    ids = torch.arange(2)
    method.step(model, ids, ids, torch.zeros(2, C)).loss.backward()  # type: ignore[arg-type]
    delta = model.weight.detach() - 1
    assert torch.allclose(model.weight.grad, FISHER_ALPHA * 2 * fisher[0] * delta)  # type: ignore[arg-type]
    assert (model.weight.grad * delta >= 0).all()  # type: ignore[operator]
    with torch.no_grad():
        model.weight.sub_(1e-4 * model.weight.grad)  # type: ignore[operator]
    assert method.penalty().item() < 1 * 0.01 + 2 * 0.04
    assert fisher_penalty([torch.ones(2)], [torch.ones(2)], [torch.ones(2)]).item() == 0.0


def test_fisher_uses_the_targets_pseudo_labels_only_and_touches_nothing() -> None:
    model, target, _, _ = tiny_problem(seed=5)
    params = EATA.trainable_params(model, adapt_config(method="eata"))
    model.train()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    sizes: list[int] = []

    def view(x: torch.Tensor) -> torch.Tensor:
        sizes.append(len(x))
        return _views().plain(x)

    fisher = fisher_diagonal(model, params, target, view, batch_size=4, samples=8,
                             generator=torch.Generator().manual_seed(0))
    assert sizes == [4, 4]  # 8 of the 12 images, in batches of the job's size
    assert all((f >= 0).all() for f in fisher) and any(f.sum() > 0 for f in fisher)
    assert all(p.grad is None for p in params)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())  # running statistics kept
    # by hand: the mean over batches of the squared gradient of the batch's cross-entropy to its own argmax (the
    # subset and the batches drawn from the one generator, in that order)
    g = torch.Generator().manual_seed(0)
    order = torch.randperm(12, generator=g)[:8]
    batches = epoch_batches(8, 4, g)
    expected = [torch.zeros_like(p) for p in params]
    with running_stats_kept(model):
        for pos in batches:
            logits = model(_views().plain(target[order[pos]]))
            grads = torch.autograd.grad(F.cross_entropy(logits, logits.argmax(1)), params)
            for e, gr in zip(expected, grads, strict=True):
                e.add_(gr.square() / len(batches))
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-12) for a, b in zip(fisher, expected, strict=True))


def _tiny_run(monkeypatch: pytest.MonkeyPatch) -> tuple[nn.Module, dict[str, torch.Tensor], EATA]:
    return confident_run(monkeypatch, EATA, "eata")


def test_adapt_trains_only_the_norm_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    model, start, method = _tiny_run(monkeypatch)
    assert method.selection()["selected"] > 0 and method.penalty().item() > 0
    after = model.state_dict()
    changed = {k for k in start if not torch.equal(start[k], after[k])}
    trained = {k for k in changed if not k.endswith(("running_mean", "running_var", "num_batches_tracked"))}
    assert trained == {f"{m}.{p}" for m in ("backbone.stem.1", "backbone.stage.1", "bottleneck.1")
                       for p in ("weight", "bias")}


def test_the_anchor_holds_the_weights_closer(monkeypatch: pytest.MonkeyPatch) -> None:
    def drift(model: nn.Module, start: dict[str, torch.Tensor]) -> float:
        return sum(float((v - start[k]).square().sum()) for k, v in model.state_dict().items()
                   if k.endswith(("1.weight", "1.bias")) and "head" not in k)

    anchored, start, _ = _tiny_run(monkeypatch)
    monkeypatch.setattr(eata_module, "FISHER_ALPHA", 0.0)
    free, start_free, _ = _tiny_run(monkeypatch)
    assert 0 < drift(anchored, start) < drift(free, start_free)


def test_the_anchor_is_capped_where_sgd_cannot_follow_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny model's Fisher reaches 0.2: at lr 0.05 the uncapped anchor (curvature 2 * 2000 * 0.2 = 800, times
    the lr 40) diverges; capped, every Fisher value is at most 1 / (2 alpha lr) and the weights stay near theta0."""
    assert stable_fisher(0.05, FISHER_ALPHA) == pytest.approx(1 / (2 * FISHER_ALPHA * 0.05))
    assert stable_fisher(0.05, 0.0) == math.inf
    model, start, method = _tiny_run(monkeypatch)
    assert all((f <= stable_fisher(0.05, FISHER_ALPHA) + 1e-12).all() for f in method.fisher)
    assert any((f == stable_fisher(0.05, FISHER_ALPHA)).any() for f in method.fisher)  # some were capped
    assert all(torch.isfinite(v).all() for v in model.state_dict().values() if v.is_floating_point())
    monkeypatch.setattr(safeguards, "ANCHOR_STABILITY", math.inf)  # the paper's anchor as it is: it diverges
    wild, start_wild, _ = _tiny_run(monkeypatch)
    far = max(float((wild.state_dict()[k] - start_wild[k]).abs().max()) for k in ("backbone.stem.1.weight",))
    near = max(float((model.state_dict()[k] - start[k]).abs().max()) for k in ("backbone.stem.1.weight",))
    assert far > 100 * near


def test_eata_is_test_time_only() -> None:
    with pytest.raises(ValueError, match="test-time method"):
        adapt_config(method="eata", mode="train")
