"""bn-adapt: the target's own BatchNorm statistics, nothing else (AdaBN)."""

import pytest
import torch
from tiny_models import TinyBackbone

from t3ar.device import seed_everything
from t3ar.method.adapt import adapt
from t3ar.method.augment import Normalizer
from t3ar.method.config import adapt_config
from t3ar.models.classifier import Classifier


def _model() -> Classifier:
    seed_everything(0)
    return Classifier(TinyBackbone(), 8, 3, 16)


def _target(n: int = 22) -> torch.Tensor:
    return torch.randint(0, 256, (n, 3, 16, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(5))


def test_running_statistics_become_the_targets_and_nothing_else_changes() -> None:
    model, target = _model(), _target()
    params = {k: v.clone() for k, v in model.named_parameters()}
    res = adapt(model, target, adapt_config(method="bn-adapt", batch_size=8, train_groups=None),
                mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), device=torch.device("cpu"))
    assert res.steps == 3 and not model.training  # 22 at batch 8: 8 + 14 (a short tail folded in)
    assert all(torch.equal(params[k], v) for k, v in model.named_parameters())
    # the stem's first BatchNorm sees the convolution of the normalised images: its running mean is their mean
    x = Normalizer((0.5, 0.5, 0.5), (0.5, 0.5, 0.5), torch.device("cpu"))(target)
    with torch.no_grad():
        conv = model.backbone.stem[0](x)
    assert torch.allclose(model.backbone.stem[1].running_mean, conv.mean((0, 2, 3)), atol=1e-5)
    # and the model now evaluates with them (not the source's zeros / ones)
    assert not torch.allclose(model.backbone.stem[1].running_var, torch.ones(8))


def test_only_the_groups_that_would_train_adapt() -> None:
    model = _model()
    before = model.backbone.stem[1].running_mean.clone()
    adapt(model, _target(), adapt_config(method="bn-adapt", batch_size=8, train_groups=1),
          mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), device=torch.device("cpu"))
    assert torch.equal(model.backbone.stem[1].running_mean, before)  # a frozen group keeps the source statistics
    assert not torch.equal(model.backbone.stage[1].running_mean, torch.zeros(8))
    assert model.backbone.stage[1].momentum == 0.1  # restored


def test_the_same_target_gives_the_same_statistics_in_any_order() -> None:
    a, b = _model(), _model()
    cfg = adapt_config(method="bn-adapt", batch_size=8, train_groups=None)
    for m, seed in ((a, 1), (b, 2)):  # another batch order: the same whole-pass means
        adapt(m, _target(), cfg, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), device=torch.device("cpu"),
              generator=torch.Generator().manual_seed(seed))
    assert torch.allclose(a.backbone.stem[1].running_mean, b.backbone.stem[1].running_mean, atol=1e-5)


@pytest.mark.gpu
def test_on_cuda_the_statistics_match_the_cpus() -> None:
    from t3ar.device import resolve_device

    dev = resolve_device("auto")  # CUDA: the gpu mark skips this test without it
    cfg = adapt_config(method="bn-adapt", batch_size=8, train_groups=None)
    cpu, gpu = _model(), _model().to(dev)
    adapt(cpu, _target(), cfg, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), device=torch.device("cpu"))
    adapt(gpu, _target(), cfg, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), device=dev)
    for (name, a), b in zip(cpu.state_dict().items(), gpu.state_dict().values(), strict=True):
        assert b.device.type == "cuda"
        assert torch.allclose(a.float(), b.cpu().float(), atol=1e-4, rtol=1e-4), name
