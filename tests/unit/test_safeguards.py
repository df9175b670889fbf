"""The T3AR family's safeguards (t3ar.method.safeguards): reliable samples, an anchor to the start weights, the
collapse fallback to the bn-adapt state and WiSE-FT's interpolation. Each off by default, and a default run is
the same as the one before they existed (within a tolerance that float summation order stays inside and a real
change does not)."""

import copy
import dataclasses
import math
from typing import Any

import pytest
import torch
from tiny_models import tiny_problem

from t3ar.jobsize import planned_steps
from t3ar.method import contrastive, family_stages, safeguards
from t3ar.method.adapt import AdaptResult, adapt, fast_layout
from t3ar.method.augment import Normalizer
from t3ar.method.base import stream
from t3ar.method.bn_adapt import bn_adapt
from t3ar.method.config import adapt_config
from t3ar.method.probe import PROBE_SWITCHES, Probe
from t3ar.method.safeguards import (
    Anchor,
    CollapseWatch,
    bn_adapt_state,
    class_entropy,
    entropy,
    filtered_mean,
    fisher_diagonal,
    interpolate,
    reliable_weights,
    stable_fisher,
)
from t3ar.models.classifier import Classifier
from t3ar.pipeline import AdaptOutcome

NORM = Normalizer((0.5,) * 3, (0.5,) * 3, torch.device("cpu"))


def _run(method: str = "t3ar", probe: Probe | None = None, **kw: Any) -> tuple[Classifier, AdaptResult, torch.Tensor]:
    model, target, pool, nbr = tiny_problem()
    switches = {k: kw.pop(k) for k in PROBE_SWITCHES if k in kw}  # the benchmarks' (t3ar.method.probe)
    probe = dataclasses.replace(probe or Probe(), **switches)
    labels = torch.arange(len(target)) % 3 if kw.get("mode") == "train" else None
    cfg = adapt_config(**{"method": method, **({} if method == "t3ar-noretrieval" else {"k": 3}), "epochs": 2,
                         "batch_size": 4, "bank_size": 32, "train_groups": None, "seed": 0, **kw})
    res = adapt(model, target, cfg, mean=(0.5,) * 3, std=(0.5,) * 3, neighbours=nbr, pool_images=pool,
                device=torch.device("cpu"), generator=torch.Generator().manual_seed(0), probe=probe, labels=labels)
    return model, res, target


def _signature(model: Classifier) -> list[float]:
    """How far the run moved the model from its start (:func:`_start`): the norm of the change of every float
    tensor of its state (weights and BatchNorm statistics), and its projection on a fixed random direction."""
    start = _start().state_dict()
    d = torch.cat([(v.double() - start[k].double()).flatten() for k, v in sorted(model.state_dict().items())
                   if v.is_floating_point()])
    r = torch.randn(len(d), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    return [float(d.norm()), float((d * r).sum())]


def _start() -> Classifier:
    """The tiny model as a run starts it (the same seed and weight layout as _run's)."""
    model, _, _, _ = tiny_problem()
    fast_layout(model, torch.device("cpu"))
    return model


# --- off by default: the same run as before -----------------------------------------------------------------

#: each step's loss and the model's :func:`_signature` after these runs on the code before the safeguards existed
#: (main at d971728; recomputed on a7c3674, where the same runs were still bit-identical to d971728's digests):
#: the options off change nothing. Compared within :data:`REL`: another CPU sums floats in another order (a
#: relative difference of about 1e-7 in these figures), while a real change moves them far more (the lr 10 %
#: higher moves the signature by 2e-3 and the second step's loss by 2 %:
#: :func:`test_a_real_change_exceeds_the_tolerance`)
BEFORE: dict[tuple[str, tuple[tuple[str, Any], ...]], tuple[list[float], list[float]]] = {
    ("t3ar", ()): ([17.032141, 5.063604, 17.83024, 9.790886, 11.080491, 6.707203],
                   [2.6173572216906797, 3.0431189535081007]),
    ("t3ar-noretrieval", ()): ([16.916462, 4.500371, 19.018892, 9.929782, 10.378027, 6.685134],
                               [2.6180462823739323, 3.2293246418125467]),
    ("t3ar", (("bn_start", True), ("second_stage_steps", 3))):
        ([17.032141, 5.063604, 17.83024, 9.790886, 11.080491, 6.707203], [5.506844068311989, 5.556505076841287]),
}
REL = 1e-4


@pytest.mark.parametrize(("method", "options"), list(BEFORE))
def test_off_the_run_is_the_one_before(method: str, options: tuple[tuple[str, Any], ...],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    def never(*args: Any, **kw: Any) -> Any:
        raise AssertionError("a safeguard ran with its option off")

    for module, name in ((contrastive, "reliable_weights"), (contrastive, "filtered_mean"),
                         (contrastive, "fisher_diagonal"), (family_stages, "bn_adapt_state"),
                         (family_stages, "class_entropy"), (family_stages, "interpolate")):
        monkeypatch.setattr(module, name, never)
    monkeypatch.setattr(contrastive.Anchor, "at", never)
    model, res, _ = _run(method, **dict(options))
    losses, signature = BEFORE[(method, options)]
    assert [s.loss for s in res.history] == pytest.approx(losses, rel=REL)
    assert _signature(model) == pytest.approx(signature, rel=REL)
    assert res.collapse_step is None
    assert all(math.isnan(s.reliable_share) and math.isnan(s.loss_anchor) and math.isnan(s.pl_class_entropy)
               for s in res.history)


def test_a_real_change_exceeds_the_tolerance() -> None:
    """The tolerance tells a change of behaviour: the lr 10 % higher is outside it, in the losses and the model."""
    model, res, _ = _run("t3ar", lr=0.0011)
    losses, signature = BEFORE[("t3ar", ())]
    assert [s.loss for s in res.history] != pytest.approx(losses, rel=REL)
    assert _signature(model)[0] != pytest.approx(signature[0], rel=REL)
    assert _signature(model)[1] != pytest.approx(signature[1], rel=REL)


# --- the config: each group's checks ------------------------------------------------------------------------

def test_every_safeguard_is_off_by_default() -> None:
    cfg = adapt_config()
    g = cfg.safeguards
    assert (g.anchor, g.anchor_weight, g.wise_alpha) == (None, None, None)
    assert cfg.resolved_anchor_weight == 0.0
    p = Probe()  # the safeguards no round kept: the benchmarks' probe switches, off unless a probe sets them
    assert (p.reliable_entropy, p.reliable_reweight, p.collapse_fallback) == (None, False, None)


def test_the_groups_check_their_interactions() -> None:
    with pytest.raises(ValueError, match="reliable_reweight .* needs reliable_entropy"):
        Probe(reliable_reweight=True).check(2, 0)
    with pytest.raises(ValueError, match="reliable_entropy: test-time only"):
        _run(mode="train", reliable_entropy=0.4)
    with pytest.raises(ValueError, match="anchor_weight .* needs anchor"):
        adapt_config(anchor_weight=1.0)
    with pytest.raises(ValueError, match="collapse_fallback: test-time only"):
        _run(mode="train", collapse_fallback=0.5)
    for switch in ({"reliable_entropy": 0.0}, {"collapse_fallback": 1.0}):
        with pytest.raises(ValueError):
            Probe(**switch).check(2, 0)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="no benchmark round kept it"):  # no job option
            adapt_config(**switch)
    for bad in ({"wise_alpha": 0.0}, {"wise_alpha": 1.5}, {"anchor": "l1"}):
        with pytest.raises(ValueError):
            adapt_config(**bad)
    adapt_config(wise_alpha=1.0)  # the adapted weights (the same as off)
    adapt_config(mode="train", anchor="fisher", wise_alpha=0.5)  # the anchor and the interpolation need no labels
    assert adapt_config(anchor="l2").resolved_anchor_weight == 0.05
    assert adapt_config(anchor="fisher").resolved_anchor_weight == 2000.0
    assert adapt_config(anchor="fisher", anchor_weight=3.0).resolved_anchor_weight == 3.0


@pytest.mark.parametrize("option", [{"anchor": "l2"}, {"wise_alpha": 0.5}])
def test_the_safeguards_are_the_familys_own(option: dict[str, Any]) -> None:
    for method in ("t3ar", "t3ar-noretrieval", "t3ar-random"):
        adapt_config(method=method, **option)
    for method in ("tent", "adacontrast", "bn-adapt"):
        with pytest.raises(ValueError, match="options? of the T3AR family"):
            adapt_config(method=method, **option)


def test_the_fisher_pass_counts_against_the_step_cap() -> None:
    base = adapt_config(k=2, epochs=2, batch_size=4)
    assert planned_steps(base, 12) == 6
    assert planned_steps(adapt_config(**{**base.flat(), "anchor": "l2"}), 12) == 6  # no pass of its own
    assert planned_steps(adapt_config(k=2, epochs=2, batch_size=4, anchor="fisher"), 12) == 6 + 3  # 3 batches
    assert planned_steps(adapt_config(k=2, epochs=2, batch_size=4, anchor="fisher", second_stage_steps=5), 12) == 14


# --- reliable samples ---------------------------------------------------------------------------------------

def test_reliable_weights_keep_the_confident_rows_and_eata_reweights_them() -> None:
    logits = torch.tensor([[10.0, 0.0, 0.0], [0.0, 0.0, 0.0], [2.0, 1.0, 0.0]])
    h = entropy(logits)
    assert h[1] == pytest.approx(math.log(3)) and h[0] < 0.01
    margin = 0.4 * math.log(3)
    assert bool(h[2] > margin)  # the third row is not reliable at 0.4 ln 3 (0.83 nats > 0.44)
    assert reliable_weights(logits, 0.4).tolist() == [1.0, 0.0, 0.0]
    assert reliable_weights(logits, 0.9).tolist() == [1.0, 0.0, 1.0]
    eata = reliable_weights(logits, 0.9, reweight=True)
    assert eata[1] == 0 and eata[0] == pytest.approx(math.exp(0.9 * math.log(3) - float(h[0])))
    assert eata[2] == pytest.approx(math.exp(0.9 * math.log(3) - float(h[2])))


def test_the_filtered_mean_averages_the_kept_rows_and_is_zero_without_any() -> None:
    per_row = torch.tensor([1.0, 5.0, 3.0], requires_grad=True)
    assert float(filtered_mean(per_row, torch.tensor([1.0, 0.0, 1.0])).detach()) == 2.0
    assert float(filtered_mean(per_row, torch.tensor([2.0, 0.0, 0.0])).detach()) == 2.0
    none = filtered_mean(per_row, torch.zeros(3))
    assert float(none.detach()) == 0.0 and none.requires_grad


def test_reliable_samples_in_a_run() -> None:
    _, plain, _ = _run()
    _, every, _ = _run(reliable_entropy=1.0)  # every row is under ln C (none is exactly uniform)
    assert every.history[0].reliable_share == 1.0
    assert every.history[0].loss_ce == pytest.approx(plain.history[0].loss_ce, rel=1e-6)  # the same first step
    model, res, _ = _run(reliable_entropy=0.001)  # no row is that confident: no cross-entropy at all
    assert all(s.reliable_share == 0.0 and s.loss_ce == 0.0 for s in res.history)
    assert all(math.isfinite(s.loss) for s in res.history)
    _, eata, _ = _run(reliable_entropy=1.0, reliable_reweight=True)
    assert eata.history[0].loss_ce > plain.history[0].loss_ce  # every weight above 1


# --- the anchor ---------------------------------------------------------------------------------------------

def test_the_anchor_is_the_weighted_squared_distance_to_the_start() -> None:
    a = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    b = torch.nn.Parameter(torch.tensor([[3.0]]))
    l2 = Anchor.at([a, b], 0.5)
    assert float(l2().detach()) == 0.0
    with torch.no_grad():
        a += torch.tensor([1.0, -2.0])
        b -= 3.0
    assert float(l2().detach()) == pytest.approx(0.5 * (1 + 4 + 9))
    fisher = Anchor.at([a, b], 2.0, [torch.tensor([0.0, 1.0]), torch.tensor([[0.5]])])
    with torch.no_grad():
        a += 1.0
        b += 2.0
    assert float(fisher().detach()) == pytest.approx(2.0 * (0 * 1 + 1 * 1 + 0.5 * 4))
    fisher().backward()
    assert a.grad is not None and a.grad.tolist() == [0.0, 4.0]  # 2 x F x 2 (theta - theta_0)
    with pytest.raises(ValueError, match="one Fisher diagonal per parameter"):
        Anchor.at([a, b], 1.0, [torch.ones(2)])


def test_the_anchor_is_capped_where_sgd_cannot_follow_it() -> None:
    """With the job's lr, each F is at most 1 / (2 weight lr) (the curvature SGD follows); L2-SP (F = 1) lowers its
    weight to that; below the cap nothing changes."""
    a = torch.nn.Parameter(torch.zeros(3))
    assert stable_fisher(0.01, 2000.0) == pytest.approx(1 / (2 * 2000 * 0.01))
    assert stable_fisher(0.01, 0.0) == math.inf
    cap = stable_fisher(0.01, 2000.0)  # 0.025
    fisher = Anchor.at([a], 2000.0, [torch.tensor([0.01, 0.025, 0.64])], lr=0.01)
    assert fisher.fisher is not None and fisher.fisher[0].tolist() == pytest.approx([0.01, cap, cap])
    assert fisher.capped == 1 and fisher.weight == 2000.0
    assert Anchor.at([a], 2000.0, [torch.tensor([0.01, 0.025, 0.64])]).capped == 0  # no lr: as given
    l2 = Anchor.at([a], 200.0, lr=0.01)  # 2 x 200 x 0.01 = 4 > 1: the weight comes down to 1 / (2 lr)
    assert l2.weight == pytest.approx(50.0) and l2.capped == 3 and l2.fisher is None
    assert Anchor.at([a], 0.05, lr=0.01).weight == 0.05  # L2-SP's default weight is far under the cap


def test_the_familys_fisher_anchor_at_eatas_weight_does_not_diverge(monkeypatch: pytest.MonkeyPatch) -> None:
    """EATA's weight (2000) on the tiny model's Fisher (up to 0.64) at lr 0.01: uncapped, lr x 2 x 2000 x F reaches
    26 and each step overshoots theta_0 further (the weights reached ~1e7 in 6 steps; a job on the e2e tests' small
    model reached ~1e23 and infinite BatchNorm variances); capped, the run stays near its start."""
    def largest(model: Classifier) -> float:
        return max(float(v.abs().max()) for v in model.state_dict().values() if v.is_floating_point())

    held, res, _ = _run(lr=0.01, anchor="fisher")
    assert largest(held) < 10 and all(math.isfinite(s.loss) for s in res.history)
    monkeypatch.setattr(safeguards, "ANCHOR_STABILITY", math.inf)  # the anchor as it was: no cap
    wild, _, _ = _run(lr=0.01, anchor="fisher")
    assert largest(wild) > 1000 * largest(held)


def test_the_fisher_diagonal_is_the_mean_squared_gradient_of_the_own_argmax() -> None:
    model, target, _, _ = tiny_problem()
    params = [p for p in model.parameters() if p.requires_grad]
    before = copy.deepcopy(model.state_dict())
    fisher = fisher_diagonal(model, params, target, norm=NORM, batch_size=6, generator=torch.Generator().manual_seed(3))
    # the model is untouched: parameters, running statistics (BatchNorm's batch counter aside, as in every
    # auxiliary pass of the family), .grad
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items() if "num_batches" not in k)
    assert all(p.grad is None for p in params)
    # by hand: two batches of 6 in the same order, batch statistics
    twin = copy.deepcopy(model)
    twin.train()
    tp = list(twin.parameters())
    expected = [torch.zeros_like(p) for p in tp]
    order = torch.randperm(len(target), generator=torch.Generator().manual_seed(3))
    for idx in order.split(6):
        for m in twin.modules():
            if isinstance(m, torch.nn.BatchNorm2d | torch.nn.BatchNorm1d):
                m.momentum = 0.0
        logits = twin(NORM(target[idx]))
        grads = torch.autograd.grad(torch.nn.functional.cross_entropy(logits, logits.argmax(1)), tp)
        for e, g in zip(expected, grads, strict=True):
            e += g.pow(2)
    for f, e in zip(fisher, expected, strict=True):
        torch.testing.assert_close(f, e / 2)
    assert sum(float(f.sum()) for f in fisher) > 0


@pytest.mark.parametrize("kind", ["l2", "fisher"])
def test_the_anchor_holds_the_weights_near_the_start(kind: str) -> None:
    start = {k: v.detach().clone() for k, v in _start().named_parameters()}

    def distance(model: Classifier) -> float:
        return sum(float((p.detach() - start[k]).pow(2).sum()) for k, p in model.named_parameters())

    free, _, _ = _run(lr=0.05)
    held, res, _ = _run(lr=0.05, anchor=kind, anchor_weight=5.0 if kind == "l2" else 50.0)
    assert res.history[0].loss_anchor == 0.0  # the first step starts at theta_0
    assert all(math.isfinite(s.loss_anchor) for s in res.history) and res.history[-1].loss_anchor > 0
    assert distance(held) < 0.5 * distance(free)


def test_the_fisher_anchor_is_estimated_after_bn_start(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, torch.Tensor]] = []
    original = contrastive.fisher_diagonal

    def spy(model: Classifier, *args: Any, **kw: Any) -> list[torch.Tensor]:
        seen.append({k: v.clone() for k, v in model.state_dict().items() if "running" in k})
        return original(model, *args, **kw)

    monkeypatch.setattr(contrastive, "fisher_diagonal", spy)
    _run(anchor="fisher", bn_start=True)
    fresh = _start()
    bn_adapt(fresh, tiny_problem()[1], train_groups=None, batch_size=4, norm=NORM, generator=stream(0, 9))
    assert len(seen) == 1
    assert all(torch.equal(v, fresh.state_dict()[k]) for k, v in seen[0].items())


# --- collapse fallback --------------------------------------------------------------------------------------

def test_class_entropy_and_the_watch() -> None:
    assert float(class_entropy(torch.tensor([0, 1, 2, 0, 1, 2]), 3)) == pytest.approx(math.log(3))
    assert float(class_entropy(torch.tensor([1, 1, 1, -1]), 3)) == 0.0
    assert float(class_entropy(torch.tensor([-1, -1]), 3)) == 0.0
    assert float(class_entropy(torch.tensor([0, 0, 1, 1, -1]), 4)) == pytest.approx(math.log(2))
    watch = CollapseWatch(reference=math.log(8), fraction=0.5)
    assert not watch.fired(math.log(3)) and watch.fired(math.log(2.5))
    assert not CollapseWatch(0.0, 0.5).fired(0.0)  # a start on one class never fires


def test_bn_adapt_state_is_bn_adapt_on_a_copy() -> None:
    model, target, _, _ = tiny_problem()
    before = copy.deepcopy(model.state_dict())
    state = bn_adapt_state(model, target, done=False, train_groups=None, batch_size=4, norm=NORM,
                           generator=stream(0, 9))
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # untouched
    bn_adapt(model, target, train_groups=None, batch_size=4, norm=NORM, generator=stream(0, 9))
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    again = bn_adapt_state(model, target, done=True, train_groups=None, batch_size=4, norm=NORM,
                           generator=stream(0, 9))
    assert all(torch.equal(v, state[k]) for k, v in again.items())


def _bn_adapted_start() -> dict[str, torch.Tensor]:
    model, target = _start(), tiny_problem()[1]
    bn_adapt(model, target, train_groups=None, batch_size=4, norm=NORM, generator=stream(0, 9))
    return model.state_dict()


def test_the_watch_reports_its_signal_and_stays_quiet_without_a_collapse() -> None:
    _, plain, _ = _run()
    model, res, _ = _run(collapse_fallback=0.01)
    assert res.collapse_step is None and res.steps == plain.steps == len(res.history)
    assert all(0 <= s.pl_class_entropy <= math.log(3) + 1e-6 for s in res.history)
    assert [s.loss for s in res.history] == [s.loss for s in plain.history]  # watching changes nothing


@pytest.mark.parametrize("bn_start", [False, True])
def test_a_collapse_restores_the_bn_adapt_state_and_ends(bn_start: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = family_stages.class_entropy

    def signal(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
        calls.append(1)  # the start's value, then each step's: collapsed from the third step on
        return real(labels, num_classes) if len(calls) < 4 else torch.tensor(0.0)

    monkeypatch.setattr(family_stages, "class_entropy", signal)
    model, res, _ = _run(collapse_fallback=0.5, bn_start=bn_start, second_stage_steps=3)
    assert res.collapse_step == 3 and res.steps == 3 and len(res.history) == 3
    assert res.second_stage_steps == 0  # the run ended: no second stage
    assert res.history[-1].pl_class_entropy == 0.0
    start = _bn_adapted_start()
    assert all(torch.equal(v, start[k]) for k, v in model.state_dict().items())
    metrics = AdaptOutcome(res, None).checkpoint_metrics()  # type: ignore[arg-type]
    assert metrics["collapse_fallback_step"] == 3
    assert "collapse_fallback_step" not in AdaptOutcome(_run()[1], None).checkpoint_metrics()  # type: ignore[arg-type]


def test_a_real_collapse_fires_the_watch() -> None:
    """BatchNorm on fixed statistics and a large lr: the cross-entropy on its own pseudo-labels pulls every
    prediction onto a class or two (the collapse the validation shift showed), and the watch sees it."""
    model, res, _ = _run(collapse_fallback=0.5, bn_start=True, lr=1.0, contrastive_weight=0.0, epochs=6,
                         probe=Probe(bn_fixed=True))
    assert res.collapse_step is not None and res.collapse_step < 6 * 3
    assert res.history[-1].pl_class_entropy < 0.5 * res.history[0].pl_class_entropy or \
        res.history[-1].pl_class_entropy < 0.5 * math.log(3)
    start = _bn_adapted_start()
    assert all(torch.equal(v, start[k]) for k, v in model.state_dict().items())


# --- WiSE-FT ------------------------------------------------------------------------------------------------

def test_interpolate_blends_the_parameters() -> None:
    layer = torch.nn.Linear(2, 1)
    start = {k: torch.zeros_like(v) for k, v in layer.named_parameters()}
    w = layer.weight.detach().clone()
    interpolate(layer, start, 0.25)
    torch.testing.assert_close(layer.weight.detach(), 0.25 * w)
    kept = layer.weight.detach().clone()
    interpolate(layer, {k: v + 1 for k, v in start.items()}, 1.0)
    assert torch.equal(layer.weight.detach(), kept)


def test_wise_ft_interpolates_from_the_start_and_re_estimates_the_statistics() -> None:
    start = dict(_start().named_parameters())
    adapted, _, target = _run()
    mixed, res, _ = _run(wise_alpha=0.5)
    assert [s.loss for s in res.history] == [s.loss for s in _run()[1].history]  # the run itself is the same
    ad = dict(adapted.named_parameters())
    for k, p in mixed.named_parameters():
        torch.testing.assert_close(p.detach(), 0.5 * ad[k].detach() + 0.5 * start[k].detach())
    # the statistics are the target's for the interpolated weights: bn-adapt of them gives the same again
    twin = copy.deepcopy(mixed)
    bn_adapt(twin, target, train_groups=None, batch_size=4, norm=NORM, generator=stream(0, 11))
    assert all(torch.equal(v, twin.state_dict()[k]) for k, v in mixed.state_dict().items())
    assert not torch.equal(mixed.state_dict()["bottleneck.1.running_mean"],
                           adapted.state_dict()["bottleneck.1.running_mean"])


def test_the_cli_summary_says_the_fallback_fired() -> None:
    from t3ar.cli.model_cmds import _adapt_summary

    payload = {"checkpoint": "out.pt", "method": "t3ar", "adapted_on": 12, "steps": 3, "seconds_per_epoch": 0.1,
               "pool_ids_used": 4}
    assert "collapse" not in _adapt_summary(payload)
    assert "collapse detected after step 3: the checkpoint is the bn-adapt state" in _adapt_summary(
        {**payload, "collapse_fallback_step": 3})
