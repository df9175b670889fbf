"""One forward over several batches with per-segment BatchNorm statistics equals separate forwards."""

import pytest
import torch
from torch import nn

from t3ar.method.segments import bucket, segmented_batch_stats


def _net() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 3), nn.BatchNorm2d(4),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 5), nn.BatchNorm1d(5))
    net.train()
    net[4].eval()  # a frozen layer: row-independent, left alone
    return net


def test_segments_equal_separate_passes_and_padding_is_ignored() -> None:
    net = _net()
    a, b = torch.randn(6, 3, 8, 8), torch.randn(9, 3, 8, 8) * 3 + 1
    running = [m.running_mean.clone() for m in net.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    with torch.no_grad():
        with segmented_batch_stats(net, [6, 9]):
            joint = net(torch.cat([a, b, torch.randn(5, 3, 8, 8) * 100]))  # 5 padding rows of wild values
        for m in net.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.momentum = 0.0
        sep_a, sep_b = net(a), net(b)
    assert torch.allclose(joint[:6], sep_a, atol=1e-5) and torch.allclose(joint[6:15], sep_b, atol=1e-5)
    after = [m.running_mean for m in net.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    assert all(torch.equal(x, y) for x, y in zip(running, after, strict=True))  # running stats untouched


def test_without_segments_the_batches_would_mix() -> None:
    net = _net()
    a, b = torch.randn(6, 3, 8, 8), torch.randn(9, 3, 8, 8) * 3 + 1
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.momentum = 0.0
        mixed = net(torch.cat([a, b]))
        sep_a = net(a)
    assert not torch.allclose(mixed[:6], sep_a, atol=1e-3)


def test_patch_is_removed_and_bad_segments_refused() -> None:
    net = _net()
    with segmented_batch_stats(net, [2, 2]):
        assert "forward" in vars(net[1])
    assert "forward" not in vars(net[1])
    with pytest.raises(ValueError), segmented_batch_stats(net, [3, 0]):
        pass
    assert bucket(33, 32) == 64 and bucket(32, 32) == 32 and bucket(5, 1) == 5


def test_batchnorm_with_fused_activation_keeps_it() -> None:
    """Regression: timm's BatchNormAct2d applies its activation inside forward; a segmented pass must keep it
    (an earlier version replaced forward with a bare batch norm and dropped the activation)."""
    import timm
    from timm.layers import BatchNormAct2d

    bn = BatchNormAct2d(4, act_layer=nn.ReLU6)
    bn.train()
    x = torch.randn(10, 4, 3, 3) * 4
    with torch.no_grad():
        with segmented_batch_stats(bn, [4, 6]):
            joint = bn(x)
        bn.momentum = 0.0
        sep = torch.cat([bn(x[:4]), bn(x[4:])])
    assert joint.min() >= 0 and joint.max() <= 6  # ReLU6 applied
    assert torch.allclose(joint, sep, atol=1e-6)

    net = timm.create_model("tf_efficientnet_lite0", pretrained=False, num_classes=0)
    net.train()
    for m in list(net.modules())[: len(list(net.modules())) // 2]:  # freeze the first half, as train_groups does
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.eval()
    a, b = torch.randn(3, 3, 32, 32), torch.randn(5, 3, 32, 32) + 0.5
    with torch.no_grad():
        with segmented_batch_stats(net, [3, 5]):
            joint = net(torch.cat([a, b, a[:2]]))
        for m in net.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.momentum = 0.0
        sep = torch.cat([net(a), net(b)])
    assert torch.allclose(joint[:8], sep, atol=1e-4)


def test_first_segment_trains_like_a_pass_of_its_own() -> None:
    """first_trains (the T3AR family's joint pass): the first segment gets the output, gradient and running
    statistics of a plain training-mode forward of it alone; the others what they get without it."""
    a, b = torch.randn(6, 3, 8, 8), torch.randn(9, 3, 8, 8) * 3 + 1
    w = torch.randn(6, 5)
    joint_net, sep_net = _net(), _net()
    with segmented_batch_stats(joint_net, [6, 9], first_trains=True):
        joint = joint_net(torch.cat([a, b, torch.randn(3, 3, 8, 8) * 100]))  # 3 padding rows
    (joint[:6] * w).sum().backward()
    sep_a = sep_net(a)
    (sep_a * w).sum().backward()
    with torch.no_grad(), segmented_batch_stats(sep_net, [9]):
        sep_b = sep_net(b)
    assert torch.allclose(joint[:6], sep_a, atol=1e-5) and torch.allclose(joint[6:15], sep_b, atol=1e-5)
    assert joint.requires_grad and not joint[6:15].detach().requires_grad
    for (name, pj), (_, ps) in zip(joint_net.named_parameters(), sep_net.named_parameters(), strict=True):
        assert pj.grad is not None and torch.allclose(pj.grad, ps.grad, atol=1e-5), name
    norms = [(x, y) for x, y in zip(joint_net.modules(), sep_net.modules(), strict=True)
             if isinstance(x, nn.modules.batchnorm._BatchNorm)]
    for x, y in norms:  # the first segment moved the running statistics as its own pass did; momentum restored
        assert torch.allclose(x.running_mean, y.running_mean, atol=1e-6)
        assert torch.allclose(x.running_var, y.running_var, atol=1e-6) and x.momentum == y.momentum
    assert not torch.equal(norms[0][0].running_mean, _net()[1].running_mean)  # and they did move
