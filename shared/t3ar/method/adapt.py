"""The adaptation loop: T3AR and its baselines on in-memory tensors. No I/O.

Inputs are uint8 image tensors already at the model's input size, the (optional) retrieved neighbours
as local pool indices ``[N_T, k]`` and the pool images they index. Progress goes to a callback, which
may raise to cancel the run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from t3ar.method import losses
from t3ar.method.augment import Normalizer, apply_each, strong_view, weak_view
from t3ar.method.bank import MemoryBank
from t3ar.method.config import AdaptConfig
from t3ar.method.schedule import epoch_batches, lr_lambda, steps_per_epoch
from t3ar.models.classifier import (
    Classifier,
    configure_trainable,
    freeze_frozen_norms,
    frozen_norm_stats,
    iter_batchnorms,
)


@dataclass
class StepStats:
    """One optimiser step, reported to ``on_step``."""

    epoch: int
    step: int
    total_steps: int
    lr: float
    loss: float
    loss_ce: float = 0.0
    loss_contrastive: float = 0.0
    pl_change_rate: float = 0.0
    seconds_augment: float = 0.0
    seconds_forward_backward: float = 0.0
    seconds_bank: float = 0.0

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


@dataclass
class AdaptResult:
    steps: int = 0
    epochs: int = 0
    seconds: float = 0.0
    seconds_per_epoch: float = 0.0
    pool_used: list[int] = field(default_factory=list)
    history: list[StepStats] = field(default_factory=list)


def _setup_params(model: Classifier, config: AdaptConfig) -> list[nn.Parameter]:
    if config.method == "tent":
        for p in model.parameters():
            p.requires_grad_(False)
        params: list[nn.Parameter] = []
        for bn in iter_batchnorms(model):
            for p in (bn.weight, bn.bias):
                if p is not None:
                    p.requires_grad_(True)
                    params.append(p)
        return params
    return configure_trainable(model, config.train_groups, head=config.method != "shot-im")


def adapt(
    model: Classifier,
    target: torch.Tensor,
    config: AdaptConfig,
    *,
    mean: tuple[float, float, float],
    std: tuple[float, float, float],
    labels: torch.Tensor | None = None,
    neighbours: torch.Tensor | None = None,
    pool_images: torch.Tensor | None = None,
    device: torch.device | None = None,
    generator: torch.Generator | None = None,
    on_step: Callable[[StepStats], None] | None = None,
) -> AdaptResult:
    """Adapt ``model`` in place on ``target`` (uint8 [N,3,S,S]) with ``config.method``.

    ``labels`` are required in train mode. Retrieval methods need ``neighbours`` ([N, k] indices into
    ``pool_images``). Returns timings, the history of steps and the pool indices actually used.
    """
    device = device or next(model.parameters()).device
    gen = generator or torch.Generator().manual_seed(config.seed)
    result = AdaptResult()
    if config.method == "source":
        return result
    if config.mode == "train" and labels is None:
        raise ValueError("train-time mode needs labels")
    if config.uses_retrieval and (neighbours is None or pool_images is None):
        raise ValueError(f"{config.method} needs neighbours and pool images")
    if device.type == "cuda":  # page-locked host memory makes the non_blocking copies asynchronous
        target = target.pin_memory()
        pool_images = pool_images.pin_memory() if pool_images is not None else None
    n = len(target)
    if n < 2:
        raise ValueError("need at least 2 target images")

    params = _setup_params(model, config)
    optim = torch.optim.SGD(params, lr=config.lr, momentum=config.momentum,
                            weight_decay=config.weight_decay, nesterov=True)
    batch_size = min(config.batch_size, n)
    spe = steps_per_epoch(n, batch_size)
    total = max(config.epochs * spe, config.min_steps)
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lr_lambda(total, config.warmup_frac))
    use_amp = device.type == "cuda" and config.amp
    scaler = torch.amp.GradScaler("cuda", enabled=use_amp)
    norm = Normalizer(mean, std, device)
    size = target.shape[-1]
    weak, strong = weak_view(size), strong_view(size)
    state = _ContrastiveState.create(model, target, config, labels, norm, strong, gen, device) \
        if config.method in ("adacontrast", "t3ar-random", "t3ar") else None
    pool_used: set[int] = set()

    t_start = time.perf_counter()
    step = 0
    epoch = 0
    while step < total:
        epoch += 1
        for idx in epoch_batches(n, batch_size, gen):
            if step >= total:
                break
            model.train()
            if config.method != "tent":
                freeze_frozen_norms(model)
            t0 = time.perf_counter()
            x = target[idx]
            stats = StepStats(epoch, step + 1, total, float(sched.get_last_lr()[0]), 0.0)
            with torch.autocast(device.type, enabled=use_amp):
                if config.method == "tent":  # test images as they are, BN affine only
                    xt = norm(x)
                    t1 = time.perf_counter()
                    loss = losses.entropy(model(xt))
                elif config.method == "shot-im":
                    xw = norm(apply_each(weak, x))
                    t1 = time.perf_counter()
                    loss = losses.information_maximisation(model(xw))
                else:
                    assert state is not None
                    nbr = neighbours[idx] if (config.uses_retrieval and neighbours is not None) else None
                    loss, t1 = state.step(model, x, idx, nbr, pool_images, weak, strong, stats)
                    if nbr is not None:
                        pool_used.update(int(i) for i in nbr.flatten() if i >= 0)
            optim.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optim)
            scaler.update()
            sched.step()
            step += 1
            t2 = time.perf_counter()
            stats.loss = float(loss.detach())
            if config.method == "shot-im":
                stats.seconds_augment = t1 - t0
            stats.seconds_forward_backward = t2 - t1 - stats.seconds_bank  # bank time is reported apart
            result.history.append(stats)
            if on_step is not None:
                on_step(stats)
    model.eval()
    result.steps, result.epochs = step, epoch
    result.seconds = time.perf_counter() - t_start
    result.seconds_per_epoch = result.seconds * spe / max(1, step)
    result.pool_used = sorted(pool_used)
    return result


@dataclass
class _ContrastiveState:
    """Bank + per-id pseudo-labels for AdaContrast / T3AR."""

    bank: MemoryBank
    id_pl: torch.Tensor  # [N_T] filtered pseudo-label per target id (-1 = none yet)
    labels: torch.Tensor | None
    config: AdaptConfig
    norm: Normalizer

    @classmethod
    @torch.no_grad()
    def create(cls, model: Classifier, target: torch.Tensor, config: AdaptConfig, labels: torch.Tensor | None,
               norm: Normalizer, strong: Callable[[torch.Tensor], torch.Tensor], gen: torch.Generator,
               device: torch.device) -> _ContrastiveState:
        """Initialise the bank from min(m_b, N_T) random target samples (strong views, current model)."""
        n = len(target)
        bank = MemoryBank(config.bank_size, model.feature_dim, model.num_classes, device)
        id_pl = torch.full((n,), -1, dtype=torch.long, device=device)
        lab = labels.to(device) if (labels is not None and config.mode == "train") else None
        model.eval()
        init = torch.randperm(n, generator=gen)[: min(config.bank_size, n)]
        for chunk in init.split(256):
            feats, logits = model.forward_all(norm(apply_each(strong, target[chunk])))
            ids = chunk.to(device)
            bank.enqueue(F.normalize(feats.float(), dim=1), ids, logits=logits.float(),
                         labels=lab[ids] if lab is not None else None)
            id_pl[ids] = logits.argmax(1)
        return cls(bank, id_pl, lab, config, norm)

    def step(self, model: Classifier, x: torch.Tensor, idx: torch.Tensor, nbr: torch.Tensor | None,
             pool_images: torch.Tensor | None, weak: Callable[[torch.Tensor], torch.Tensor],
             strong: Callable[[torch.Tensor], torch.Tensor], stats: StepStats) -> tuple[torch.Tensor, float]:
        """Forward passes, bank update, pseudo-labels and the loss for one batch."""
        cfg, bank = self.config, self.bank
        t0 = time.perf_counter()
        xw = self.norm(apply_each(weak, x))
        xs = self.norm(apply_each(strong, x))
        pool_local: torch.Tensor | None = None
        xp: torch.Tensor | None = None
        if nbr is not None and pool_images is not None:
            pool_local = torch.unique(nbr[nbr >= 0])
            xp = self.norm(apply_each(strong, pool_images[pool_local]))
        t1 = time.perf_counter()
        stats.seconds_augment = t1 - t0
        ids = idx.to(bank.ids.device)
        # keys: the momentum encoder with m = 0 is the current model, without gradient
        with torch.no_grad(), frozen_norm_stats(model):
            k_feat, k_logits = model.forward_all(xs)
            k = F.normalize(k_feat.float(), dim=1)
            p = F.normalize(model.features(xp).float(), dim=1) if xp is not None else None
        q_feat, q_logits = model.forward_all(xw)
        q = F.normalize(q_feat.float(), dim=1)
        tb = time.perf_counter()
        with torch.no_grad():
            lab = self.labels[ids] if self.labels is not None else None
            bank.enqueue(k, ids, logits=k_logits.float(), labels=lab)
            if p is not None and pool_local is not None:
                bank.enqueue(p, pool_local.to(bank.ids.device), from_pool=True)
            if lab is None:
                mean_logits, _ = bank.mean_logits(ids)
                new_pl = mean_logits.argmax(1)
                had = self.id_pl[ids] >= 0
                changed = (new_pl != self.id_pl[ids]) & had
                stats.pl_change_rate = float(changed.sum()) / max(1, int(had.sum()))
                self.id_pl[ids] = new_pl
                y = new_pl
                # pool entries and empty slots get a dummy id; negative_mask ignores their label
                target_ids = torch.where(bank.from_pool | ~bank.valid, 0, bank.ids)
                bank_labels = self.id_pl[target_ids]
            else:
                y = lab
                bank_labels = bank.labels
            neg = losses.negative_mask(bank, ids, y, bank_labels,
                                       nbr.to(bank.ids.device) if nbr is not None else None)
        stats.seconds_bank = time.perf_counter() - tb
        loss_ce = F.cross_entropy(q_logits.float(), y)
        loss_con = losses.info_nce(q, k, bank.feats, neg, cfg.temperature)
        loss = cfg.ce_weight * loss_ce + cfg.contrastive_weight * loss_con
        if cfg.diversity_weight > 0:
            loss = loss + cfg.diversity_weight * losses.diversity(q_logits.float())
        stats.loss_ce, stats.loss_contrastive = float(loss_ce.detach()), float(loss_con.detach())
        return loss, t1
