"""Frozen convolution + BatchNorm pairs folded into one convolution: the same function, patched only within
the block, and only where it is still exact."""

import pytest
import timm
import torch
from timm.layers import BatchNormAct2d
from timm.layers.conv2d_same import Conv2dSame
from torch import nn

from t3ar.device import resolve_device
from t3ar.models.fold import fold_inplace, folded_frozen_norms, frozen_pairs


class Net(nn.Module):
    """Every case: a plain pair, timm's pair (same padding, activation inside the norm), a convolution with a
    bias, a convolution whose output is also used elsewhere, and a pair that trains."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.c2, self.b2 = Conv2dSame(8, 8, 3, stride=2, groups=8, bias=False), BatchNormAct2d(8, act_layer=nn.ReLU6)
        self.c3, self.b3 = nn.Conv2d(8, 8, 1, bias=False), nn.BatchNorm2d(8)  # output also feeds the residual
        self.c4, self.b4 = nn.Conv2d(8, 4, 1, bias=False), nn.BatchNorm2d(4)  # trains
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.b1(self.c1(x)))
        x = self.b2(self.c2(x))
        y = self.c3(x)
        x = self.b3(y) + y
        return self.pool(self.b4(self.c4(x))).flatten(1)


def _net() -> Net:
    torch.manual_seed(0)
    net = Net()
    for m in net.modules():  # running statistics far from (0, 1), so a fold that is wrong shows
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.5, 0.5)
    for m in (net.c1, net.b1, net.c2, net.b2, net.c3, net.b3):
        m.requires_grad_(False)
    net.train()
    for m in (net.b1, net.b2, net.b3):
        m.eval()
    return net


def _output_and_grads(net: Net, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    net.zero_grad()
    out = net(x)
    out.square().sum().backward()
    return out.detach(), [p.grad.clone() for p in net.parameters() if p.requires_grad]


def test_folds_exactly_the_frozen_single_use_pairs_and_gives_the_same_function() -> None:
    net, x = _net(), torch.randn(6, 3, 16, 16)
    assert [(c, b) for c, b in frozen_pairs(net)] == [(net.c1, net.b1), (net.c2, net.b2)]
    state = {k: v.clone() for k, v in net.state_dict().items() if "running" not in k and "num_batches" not in k}
    out0, grads0 = _output_and_grads(net, x)
    with folded_frozen_norms(net) as n:
        assert n == 2
        out1, grads1 = _output_and_grads(net, x)
        assert "forward" in net.c1.__dict__ and "forward" not in net.c3.__dict__
    assert torch.allclose(out0, out1, atol=1e-5, rtol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-5, rtol=1e-4) for a, b in zip(grads0, grads1, strict=True))
    assert not any("forward" in m.__dict__ for m in net.modules())  # patches removed
    after = {k: v for k, v in net.state_dict().items() if k in state}
    assert all(torch.equal(state[k], after[k]) for k in state)  # parameters never touched


def test_the_fold_is_used_not_just_patched() -> None:
    net, x = _net(), torch.randn(4, 3, 16, 16)
    with folded_frozen_norms(net):
        net.b1.running_mean.data += 0  # no change
        out = net(x)
        net.b1.forward.__defaults__[0].shadow.weight.data.zero_()  # the folded weight is what runs
        assert not torch.allclose(out, net(x))


def test_falls_back_where_the_pair_would_no_longer_be_exact() -> None:
    net, x = _net(), torch.randn(6, 3, 16, 16)
    with torch.no_grad():
        net.b1.train()  # batch statistics now: nothing to fold
        with folded_frozen_norms(net):
            folded = net(x)
        assert torch.allclose(folded, net(x), atol=1e-6)
        net.b1.eval()
        with folded_frozen_norms(net):
            net(x)
            net.b2.running_var.mul_(3)  # a statistic changed in place: folded anew
            folded = net(x)
        assert torch.allclose(folded, net(x), atol=1e-5, rtol=1e-5)
    with folded_frozen_norms(net):
        net.c1.weight.requires_grad_(True)  # trains now: runs as it is, and gets its gradient
        net(x).sum().backward()
    assert net.c1.weight.grad is not None and net.c1.weight.grad.abs().sum() > 0


def test_off_or_untraceable_means_untouched() -> None:
    net = _net()
    with folded_frozen_norms(net, enabled=False) as n:
        assert n == 0 and not any("forward" in m.__dict__ for m in net.modules())

    class Branchy(nn.Module):  # data-dependent control flow does not trace
        def __init__(self) -> None:
            super().__init__()
            self.c, self.b = nn.Conv2d(3, 3, 1), nn.BatchNorm2d(3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.c(x)) if x.sum() > 0 else x

    branchy = Branchy().requires_grad_(False).eval()
    assert frozen_pairs(branchy) == []
    with folded_frozen_norms(branchy) as n:
        assert n == 0

    class Twice(nn.Module):  # one pair called at two places: left as it is
        def __init__(self) -> None:
            super().__init__()
            self.c, self.b = nn.Conv2d(3, 3, 1), nn.BatchNorm2d(3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.c(self.b(self.c(x))))

    assert frozen_pairs(Twice().requires_grad_(False).eval()) == []


def test_efficientnet_lite0_with_its_last_groups_training() -> None:
    from t3ar.models.classifier import Classifier, configure_trainable, freeze_frozen_norms

    torch.manual_seed(0)
    backbone = timm.create_model("tf_efficientnet_lite0", pretrained=False, num_classes=0)
    for m in backbone.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2)
    model = Classifier(backbone, backbone.num_features, 5).to(memory_format=torch.channels_last)
    configure_trainable(model, 2)
    model.train()
    freeze_frozen_norms(model)
    x = torch.randn(4, 3, 64, 64).contiguous(memory_format=torch.channels_last)
    feats0 = model.features(x)
    with folded_frozen_norms(model.backbone) as n:
        assert n == 33  # stem + the 16 frozen blocks' pairs (the last two groups train)
        feats1 = model.features(x)
    assert (feats0 - feats1).abs().max() < 1e-3 * feats0.abs().max()  # float rounding, through 16 blocks


def test_fold_inplace_makes_the_network_smaller_with_the_same_function() -> None:
    net, x = _net().eval(), torch.randn(6, 3, 16, 16)
    net.requires_grad_(False)  # only ever evaluated, like the embedder's network
    with torch.no_grad():
        before = net(x)
        assert fold_inplace(net) == 3  # c4/b4 frozen now too; c3/b3 still shares its output
        after = net(x)
    assert torch.allclose(before, after, atol=1e-5, rtol=1e-5)
    assert isinstance(net.b1, nn.Identity) and isinstance(net.b2, nn.Sequential)  # BatchNormAct2d: its act kept
    assert isinstance(net.b3, nn.BatchNorm2d) and net.c1.bias is not None and net.c2.bias is not None


def test_the_embedder_is_folded_and_gives_the_vectors_of_the_plain_network() -> None:
    import numpy as np

    from t3ar.embedder import Embedder, EmbedderSpec
    from t3ar.models.backbones import build_backbone

    emb = Embedder(EmbedderSpec(image_size=64))
    assert not any(isinstance(m, nn.BatchNorm2d) for m in emb.net.modules())  # Lite0: every one folded
    x = torch.randint(0, 256, (4, 3, 64, 64), dtype=torch.uint8)
    plain = build_backbone(emb.spec.backbone).eval()
    with torch.no_grad():
        ref = torch.nn.functional.normalize(plain((x.float() / 255 - 0.5) / 0.5), dim=1).numpy()
    assert np.abs(emb.embed(x) - ref).max() < 1e-5


@pytest.mark.gpu
def test_on_cuda_under_mixed_precision() -> None:
    dev = resolve_device("auto")  # CUDA: the gpu mark skips this test without it
    net, x = _net().to(dev), torch.randn(6, 3, 16, 16, device=dev)
    with torch.autocast(dev.type):
        out0 = net(x).float()
        with folded_frozen_norms(net) as n:
            assert n == 2
            out1 = net(x).float()
    assert torch.allclose(out0, out1, atol=1e-2, rtol=1e-2)  # half precision rounding
