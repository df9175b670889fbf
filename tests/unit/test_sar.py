"""SAR: the reliable-entropy filter, the sharpness-aware gradient within the loop's one backward, the recovery,
and a run through the loop that trains only the normalisation layers below the top group."""

import math

import pytest
import torch
from tiny_models import AFFINE_CLASSES, AFFINE_E0, Affine, confident_run, tiny_problem
from torch import nn

from t3ar.method import sar as sar_module
from t3ar.method.augment import Normalizer
from t3ar.method.config import adapt_config
from t3ar.method.reliable import entropy_margin, masked_mean, sample_entropy
from t3ar.method.sar import RHO, SAR, perturbation
from t3ar.method.schedule import Optimiser
from t3ar.method.views import Views

C = AFFINE_CLASSES
E0 = AFFINE_E0


def _sar(model: nn.Module) -> SAR:
    views = Views(Normalizer((0.5,) * 3, (0.5,) * 3, torch.device("cpu")), torch.Generator())
    return SAR(views, model, list(model.parameters()))  # type: ignore[arg-type]


def _step(method: SAR, model: nn.Module, logits: torch.Tensor) -> torch.Tensor:
    ids = torch.arange(len(logits))
    return method.step(model, ids, ids, logits).loss  # type: ignore[arg-type]


# rows: certain (reliable), uniform (not), 71 % on one class (entropy 0.92 > E0 = 0.55: not), 95 % (reliable)
LOGITS = torch.tensor([[10.0, 0, 0, 0], [0, 0, 0, 0], [2.0, 0, 0, 0], [0, 4.0, 0, 0]])


def test_reliable_filter_selects_by_entropy() -> None:
    assert entropy_margin(C) == pytest.approx(E0)
    ent = sample_entropy(LOGITS)
    assert ent[1].item() == pytest.approx(math.log(C))
    assert (ent < E0).tolist() == [True, False, False, True]
    assert masked_mean(ent, ent < E0).item() == pytest.approx(((ent[0] + ent[3]) / 2).item())
    # nothing selected: 0, and still a gradient (of zeros) for the loop's backward
    x = LOGITS.clone().requires_grad_(True)
    empty = masked_mean(sample_entropy(x), torch.zeros(4, dtype=torch.bool))
    empty.backward()
    assert empty.item() == 0.0 and x.grad is not None and not x.grad.any()


def _sam_gradient(logits: torch.Tensor) -> list[torch.Tensor]:
    """SAR's gradient computed by hand: the reliable entropy's gradient g at w, e = rho g/||g||, then the gradient
    at w + e of the entropy of the images reliable at both points."""
    w, b = torch.ones(C, requires_grad=True), torch.zeros(C, requires_grad=True)
    ent = sample_entropy(logits * w + b)
    keep = ent < E0
    g = torch.autograd.grad(ent[keep].mean(), [w, b])
    norm = torch.sqrt(sum((t**2).sum() for t in g))  # type: ignore[arg-type]
    w2 = (w + RHO * g[0] / norm).detach().requires_grad_(True)
    b2 = (b + RHO * g[1] / norm).detach().requires_grad_(True)
    ent2 = sample_entropy(logits * w2 + b2)
    keep2 = keep & (ent2 < E0)
    return list(torch.autograd.grad(ent2[keep2].mean(), [w2, b2]))


def test_step_gives_the_sharpness_aware_gradient_and_leaves_the_weights() -> None:
    model = Affine()
    method = _sar(model)
    loss = _step(method, model, LOGITS)
    assert torch.equal(model.weight, torch.ones(C)) and torch.equal(model.bias, torch.zeros(C))  # never moved
    loss.backward()
    expected = _sam_gradient(LOGITS)
    assert torch.allclose(model.weight.grad, expected[0], atol=1e-6)  # type: ignore[arg-type]
    assert torch.allclose(model.bias.grad, expected[1], atol=1e-6)  # type: ignore[arg-type]
    # plain entropy minimisation (tent's loss over every image) gives another update
    plain = Affine()
    sample_entropy(plain(LOGITS)).mean().backward()
    assert not torch.allclose(plain.weight.grad, model.weight.grad, atol=1e-4)  # type: ignore[arg-type]
    # and so does the reliable entropy without the perturbation
    reliable = Affine()
    ent = sample_entropy(reliable(LOGITS))
    ent[ent < E0].mean().backward()
    assert not torch.allclose(reliable.weight.grad, model.weight.grad, atol=1e-6)  # type: ignore[arg-type]


def test_unreliable_images_change_nothing() -> None:
    a, b = Affine(), Affine()
    other = LOGITS.clone()
    other[1] = torch.tensor([0.3, 0.1, 0.2, 0.0])  # still far above E0
    other[2] = torch.tensor([0.0, 0.0, 1.5, 0.0])
    la, lb = _step(_sar(a), a, LOGITS), _step(_sar(b), b, other)
    la.backward()
    lb.backward()
    assert la.item() == pytest.approx(lb.item())
    assert torch.allclose(a.weight.grad, b.weight.grad)  # type: ignore[arg-type]


def test_perturbation_has_norm_rho_and_is_zero_without_a_direction() -> None:
    e = perturbation([torch.tensor([3.0, 0.0]), torch.tensor([4.0])])
    assert torch.linalg.vector_norm(torch.cat(e)).item() == pytest.approx(RHO)
    assert torch.allclose(e[0], torch.tensor([3 * RHO / 5, 0.0]))
    assert all(not t.any() for t in perturbation([torch.zeros(3)]))
    assert all(not t.any() for t in perturbation([torch.tensor([float("inf"), 1.0])]))  # fp16 overflow: no step


def test_recovery_resets_the_start_weights_on_collapse() -> None:
    model = Affine()
    method = _sar(model)
    # uncertain but reliable images: the second loss about 0.43 > 0.2, no reset
    calm = torch.tensor([[3.3, 0, 0, 0], [0, 3.3, 0, 0]])
    assert E0 > sample_entropy(calm).max().item() > 0.2
    second = _step(method, model, calm).item()  # at the perturbed weights: above the entropy at w (an ascent)
    assert second > sample_entropy(calm).mean().item()
    assert method.after_update() is False and method.ema == pytest.approx(second)
    # collapse: everything certain; the average falls under 0.2 after a few batches
    certain = torch.tensor([[30.0, 0, 0, 0], [0, 30.0, 0, 0]])
    resets = []
    for _ in range(20):
        _step(method, model, certain)
        with torch.no_grad():  # what the optimiser would have done meanwhile
            model.weight.add_(0.5)
        resets.append(method.after_update())
        if resets[-1]:
            break
    assert resets[-1] is True and resets.count(True) == 1 and len(resets) > 1  # the average, not one batch
    assert torch.equal(model.weight, torch.ones(C)) and torch.equal(model.bias, torch.zeros(C))
    assert method.ema is None and method.resets == 1
    # no reliable image: the average is left alone
    _step(method, model, torch.zeros(2, C))
    assert method.after_update() is False and method.ema is None


def _tiny_run(monkeypatch: pytest.MonkeyPatch) -> tuple[nn.Module, dict[str, torch.Tensor], SAR]:
    return confident_run(monkeypatch, SAR, "sar")


def test_adapt_trains_only_the_norm_layers_below_the_top_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sar_module, "RESET_BELOW", -1.0)  # three classes: a confident model would reset at once
    model, start, method = _tiny_run(monkeypatch)
    assert method.selection()["trained"] > 0 and method.resets == 0
    after = model.state_dict()
    changed = {k for k in start if not torch.equal(start[k], after[k])}
    # the tiny backbone's groups are stem and stage: only the stem's BatchNorm trains (stage is the top group,
    # the bottleneck's BatchNorm is above it); every BatchNorm normalises with, and follows, the batch statistics
    trained = {k for k in changed if not k.endswith(("running_mean", "running_var", "num_batches_tracked"))}
    assert trained == {"backbone.stem.1.weight", "backbone.stem.1.bias"}
    assert {"backbone.stage.1.running_mean", "bottleneck.1.running_mean"} <= changed


def test_second_pass_leaves_the_running_statistics() -> None:
    model, target, _, _ = tiny_problem(seed=5)
    twin, _, _, _ = tiny_problem(seed=5)
    views = Views(Normalizer((0.5,) * 3, (0.5,) * 3, torch.device("cpu")), torch.Generator())
    x = views.plain(target[:4])
    method = SAR(views, model, SAR.trainable_params(model, adapt_config(method="sar")))
    model.train()
    method.step(model, torch.arange(4), torch.arange(4), x)
    twin.train()
    twin(x)  # one plain training-mode forward of the batch
    for k, v in twin.state_dict().items():
        if "running" in k:
            assert torch.allclose(model.state_dict()[k], v), k


def test_forced_collapse_in_the_loop_resets_weights_and_optimiser(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    original = Optimiser.reset_state

    def reset_state(self: Optimiser) -> None:
        assert self.optim.state  # there was momentum to forget
        calls.append(1)
        original(self)
        assert not self.optim.state

    monkeypatch.setattr(Optimiser, "reset_state", reset_state)
    monkeypatch.setattr(sar_module, "RESET_BELOW", 1e9)  # every average "collapses": a reset after every update
    model, start, method = _tiny_run(monkeypatch)
    after = model.state_dict()
    for k in ("backbone.stem.1.weight", "backbone.stem.1.bias"):
        assert torch.equal(after[k], start[k]), k  # reset after the last update too
    assert len(calls) == method.resets == 6  # 12 images, batch 4, 2 epochs
    monkeypatch.setattr(sar_module, "RESET_BELOW", -1.0)  # never
    calls.clear()
    model, start, method = _tiny_run(monkeypatch)
    assert not calls and method.resets == 0
    assert not torch.equal(model.state_dict()["backbone.stem.1.weight"], start["backbone.stem.1.weight"])


def test_sar_is_test_time_only() -> None:
    with pytest.raises(ValueError, match="test-time method"):
        adapt_config(method="sar", mode="train")
