"""The classifier f = head ∘ bottleneck ∘ backbone used by every method (the TTA head of SHOT/AdaContrast).

backbone -> [B, D] -> (optional) Linear(D, 256) + BatchNorm1d -> g(x) (the contrastive feature)
         -> WeightNorm Linear(256, C) -> f(x) (logits)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn
from torch.nn.utils.parametrizations import weight_norm

from t3ar.models.backbones import BackboneSpec, build_backbone


class ModelSpec(BaseModel):
    """Everything that defines a classifier's architecture and its input contract. Saved in checkpoints."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backbone: BackboneSpec
    classes: tuple[str, ...] = Field(min_length=2)
    image_size: int = Field(default=96, ge=16, le=1024)
    bottleneck_dim: int | None = Field(default=256, ge=8)
    weight_norm: bool = True

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def arch_signature(self) -> str:
        """What must agree between a checkpoint and the model it is loaded into."""
        b = self.backbone
        return f"{b.kind}:{b.name}|bottleneck={self.bottleneck_dim}|wn={self.weight_norm}|C={self.num_classes}"


class Classifier(nn.Module):
    """Backbone + bottleneck + (weight-normalised) linear head."""

    def __init__(self, backbone: nn.Module, num_features: int, num_classes: int,
                 bottleneck_dim: int | None = 256, use_weight_norm: bool = True) -> None:
        super().__init__()
        self.backbone = backbone
        if bottleneck_dim:
            self.bottleneck: nn.Module = nn.Sequential(
                nn.Linear(num_features, bottleneck_dim), nn.BatchNorm1d(bottleneck_dim)
            )
            feat_dim = bottleneck_dim
        else:
            self.bottleneck = nn.Identity()
            feat_dim = num_features
        head = nn.Linear(feat_dim, num_classes)
        self.head: nn.Module = weight_norm(head, dim=0) if use_weight_norm else head
        self.feature_dim = feat_dim
        self.num_classes = num_classes

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """g(x): the bottleneck feature (not normalised)."""
        out: torch.Tensor = self.bottleneck(self.backbone(x))
        return out

    def forward_all(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(g(x), f(x)) in one pass."""
        feats = self.features(x)
        logits: torch.Tensor = self.head(feats)
        return feats, logits

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_all(x)[1]


def build_classifier(spec: ModelSpec) -> Classifier:
    """Build the classifier (backbone weights per ``spec.backbone.weights``; head randomly initialised)."""
    backbone = build_backbone(spec.backbone)
    num_features = int(getattr(backbone, "num_features"))  # noqa: B009 - timm/open_clip both expose it
    return Classifier(backbone, num_features, spec.num_classes, spec.bottleneck_dim, spec.weight_norm)


def backbone_groups(backbone: nn.Module) -> list[list[nn.Parameter]]:
    """Backbone parameters in input-to-output groups (timm's coarse groups: stem, stages, head conv).

    Used to train only the last ``n`` groups. Models without timm's ``group_matcher`` fall back to their
    top-level children (open_clip towers: treated per child module).
    """
    matcher = getattr(backbone, "group_matcher", None)
    if matcher is not None:
        from timm.models import group_parameters

        names = group_parameters(backbone, matcher(coarse=True))
        by_name = dict(backbone.named_parameters())
        return [[by_name[n] for n in names[g]] for g in sorted(names)]
    inner = getattr(backbone, "visual", backbone)
    blocks = getattr(getattr(inner, "transformer", None), "resblocks", None)
    if blocks is not None:  # open_clip ViT: embedding stem, each residual block, final norm/projection
        in_blocks = {id(p) for p in blocks.parameters()}
        stem_names = ("conv1", "class_embedding", "positional_embedding", "ln_pre", "patch_dropout")
        stem: list[nn.Parameter] = []
        tail: list[nn.Parameter] = []
        for name, p in inner.named_parameters():
            if id(p) not in in_blocks:
                (stem if name.startswith(stem_names) else tail).append(p)
        return [stem] + [list(b.parameters()) for b in blocks] + [tail]
    return [list(c.parameters()) for c in inner.children() if any(True for _ in c.parameters())]


def configure_trainable(model: Classifier, train_groups: int | None, *, head: bool = True) -> list[nn.Parameter]:
    """Freeze all but the last ``train_groups`` backbone groups (None = all) and return trainable params.

    Bottleneck is always trainable; the classifier head only when ``head`` (SHOT-IM freezes it).
    """
    for p in model.parameters():
        p.requires_grad_(False)
    groups = backbone_groups(model.backbone)
    chosen = groups if train_groups is None else (groups[len(groups) - train_groups:] if train_groups else [])
    for group in chosen:
        for p in group:
            p.requires_grad_(True)
    for p in model.bottleneck.parameters():
        p.requires_grad_(True)
    if head:
        for p in model.head.parameters():
            p.requires_grad_(True)
    return [p for p in model.parameters() if p.requires_grad]


def freeze_frozen_norms(model: nn.Module) -> None:
    """Put BatchNorm layers whose parameters are all frozen in eval mode (keep their running stats).

    Call after ``model.train()``: a frozen stage must behave like the pretrained one.
    """
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            params = list(m.parameters(recurse=False))
            if params and not any(p.requires_grad for p in params):
                m.eval()


def eval_norms(model: nn.Module) -> None:
    """Put every BatchNorm layer in eval mode: it normalises with its running statistics and keeps them
    (the benchmarks' ``Probe.bn_fixed``). Call after ``model.train()``."""
    for m in iter_batchnorms(model):
        m.eval()


def iter_batchnorms(model: nn.Module) -> Iterator[nn.modules.batchnorm._BatchNorm]:
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            yield m


@contextmanager
def frozen_norm_stats(model: nn.Module) -> Iterator[None]:
    """BatchNorm still normalises with batch statistics but does not update its running stats.

    Used for auxiliary forward passes (keys, retrieved pool images) so that evaluation-time statistics
    come from the target's own (weak) views only, never from pool images of another domain.
    """
    saved = [(bn, bn.momentum) for bn in iter_batchnorms(model)]
    for bn, _ in saved:
        bn.momentum = 0.0
    try:
        yield
    finally:
        for bn, momentum in saved:
            bn.momentum = momentum
