"""T3AR and its ablations (``t3ar-noretrieval``, ``t3ar-random``): bank, filtered pseudo-labels, InfoNCE
with retrieved pool negatives, cross-entropy. Pure torch; the loop that drives it (through :class:`T3AR`) is
:mod:`t3ar.method.adapt`.

One step, for a batch x of target images with retrieved neighbours N(x):
* q = g(t(x)) with gradient (weak view); keys k = g(t'(x)) and logits f(t'(x)) without gradient (strong view,
  the momentum encoder with m = 0 is the current model); pool features g(t'(a)) of every *distinct*
  neighbour a of the batch, without gradient. The key pass and the pool pass run as one forward with
  per-segment BatchNorm statistics (:mod:`t3ar.method.segments`): the same numbers as two passes. With
  ``config.joint_pass`` (CUDA by default: see :func:`joint_enabled`) the query pass joins them as the first
  segment, the only one with gradient: one forward per step instead of two.
* bank: enqueue (k, f(t'(x)), id) and (g(t'(a)), pool id); filtered pseudo-label ȳ(x) = argmax of the mean
  of the logits stored for x's id (with ``knn_refine``: AdaContrast's soft k-NN vote of the bank entries
  nearest q, :mod:`t3ar.method.vote`).
* loss = ce_weight · CE(f(t(x)), ȳ) + contrastive_weight · InfoNCE(q, k; negatives = target entries with
  another pseudo-label + the bank entries of x's own neighbours, or of every pool image with
  the benchmarks' probe switch ``pool_negatives='all'``).

Retrieval acting on the model (each off by default, :mod:`t3ar.method.pool_data`): pool entries keep their
logits in the bank, so every pool image has a filtered pseudo-label of its own; ``false_negatives`` masks (or
makes positives of) a query's neighbours pseudo-labelled in its class; ``pool_data_weight`` adds
pool_data_weight · CE(f(t(a)), ȳ(a)) over the confident, agreeing neighbours a of the batch (their weak views,
one more forward with gradient, normalised as ``pool_data_norm`` says, never counted into the running
statistics).

The bank is initialised as the steps' keys are computed: the model in training mode, each chunk of a batch's
size normalised by its own statistics, the running statistics untouched (not with the source statistics of eval
mode), so the filtered pseudo-labels average logits of one kind.

Safeguards (each off by default, :mod:`t3ar.method.safeguards`): ``reliable_entropy`` keeps only the reliable
samples in the cross-entropy (``reliable_share`` reported); ``anchor`` adds the penalty towards the start weights
(``loss_anchor``).

Reported alongside the loss (tensors, read by the loop in its one device sync): ``pool_neg_share``, the share
of the InfoNCE denominator that comes from pool negatives (always); with ``diagnostics``, the gradient norms
of the two weighted loss terms at the query feature (``grad_norm_ce``, ``grad_norm_contrastive``).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from t3ar.method import losses
from t3ar.method.adacontrast import momentum_update
from t3ar.method.bank import MemoryBank
from t3ar.method.base import MethodSetup, MethodStep, Stage, StepOut, stream
from t3ar.method.config import AdaptConfig
from t3ar.method.family_stages import BatchNormStart, CollapseFallback, PoolInputs, WiseFT
from t3ar.method.pool_data import PoolData, same_class_pool_entries, select_pool_data
from t3ar.method.pool_labels import LabelDraw, balance_weights
from t3ar.method.probe import NO_PROBE
from t3ar.method.record import StepStats
from t3ar.method.retrieval import dedup_sample
from t3ar.method.safeguards import Anchor, filtered_mean, fisher_diagonal, reliable_weights, stable_fisher
from t3ar.method.second_stage import SecondStage
from t3ar.method.segments import bucket, segmented_batch_stats
from t3ar.method.specs.family import FamilyConfig, T3ARConfig
from t3ar.method.views import Views
from t3ar.method.vote import vote
from t3ar.models.classifier import Classifier, eval_norms, freeze_frozen_norms, frozen_norm_stats, iter_batchnorms

log = logging.getLogger(__name__)

__all__ = ["CUDA_SHAPE_BUCKET", "ContrastiveState", "StepOut", "StepViews", "T3AR", "T3ARStepStats",
           "joint_enabled", "nograd_precision", "step_views"]

# Shapes of the no-gradient pool pass are padded to a multiple of this on CUDA: every new input shape costs a
# cuDNN plan search (measured on an H100: ~0.7 s per new batch size under AMP, 8 ms per step once cached).
CUDA_SHAPE_BUCKET = 32


@dataclass
class T3ARStepStats(StepStats):
    """A T3AR-family step (NaN = not measured in this run).

    ``pool_neg_share`` (always): the batch-mean share of the InfoNCE denominator (positive + negatives,
    sum exp(logit)) from pool negatives; 0.0 without any. ``false_negatives`` (``retrieval.false_negatives`` other
    than 'keep'): the mean number of negatives per query taken out as false negatives. ``grad_norm_ce`` /
    ``grad_norm_contrastive`` (``Probe.diagnostics``): L2 norm of the gradient of each weighted term at the query
    features (a proxy, not the parameter gradient). ``pool_data_count`` (neighbours as data): how many retrieved
    neighbours served as data in the step, ``loss_pool_data`` their cross-entropy; with
    ``Probe.pool_diagnostic_labels`` also ``pool_data_known``, how many of those have a known label, and
    ``pool_data_correct``, the share of the known ones whose pseudo-label was right (NaN when none was known).
    ``pool_label_count`` / ``loss_pool_labels`` (labelled neighbours as data): how many labelled pool items trained
    the step, and their cross-entropy (NaN when none did). ``reliable_share`` (``safeguards.reliable_entropy``): the
    share of the batch the cross-entropy counted; ``loss_anchor`` (``safeguards.anchor``): the weighted penalty
    towards the start weights; ``pl_class_entropy`` (``safeguards.collapse_fallback``): the entropy of the class
    histogram of the job's pseudo-labels after the step, the signal the collapse watch reads
    (:class:`~t3ar.method.family_stages.CollapseFallback`).
    """

    pool_neg_share: float = math.nan
    false_negatives: float = math.nan
    grad_norm_ce: float = math.nan
    grad_norm_contrastive: float = math.nan
    pool_data_count: float = math.nan
    loss_pool_data: float = math.nan
    pool_data_known: float = math.nan
    pool_data_correct: float = math.nan
    pool_label_count: float = math.nan
    loss_pool_labels: float = math.nan
    reliable_share: float = math.nan
    loss_anchor: float = math.nan
    pl_class_entropy: float = math.nan


@dataclass
class ContrastiveState:
    """Bank + per-id pseudo-labels for the T3AR family."""

    bank: MemoryBank
    id_pl: torch.Tensor  # [N_T] filtered pseudo-label per target id (-1 = none yet)
    labels: torch.Tensor | None  # [N_T] true labels (train-time mode) on the device
    config: FamilyConfig
    shape_bucket: int  # pad the no-grad pass to a multiple of this many rows (CUDA: few distinct shapes)
    joint: bool = False  # the query pass joins the no-grad pass (joint_enabled)
    pool_pl: torch.Tensor | None = None  # [P] filtered pseudo-label per pool image (-1 = none yet)
    pool_allowed: torch.Tensor | None = None  # [P] bool: may serve as data (None = all)
    pool_labels: torch.Tensor | None = None  # [P] true labels (-1 unknown): diagnostics / the oracle arm only
    pool_oracle: bool = False
    pool_known: torch.Tensor | None = None  # [P] pool labels as model classes (-1 = none): data and negatives
    teacher: Classifier | None = None  # the EMA teacher of the probe's teacher_ema (None: the current model, m = 0)
    teacher_ema: float = 0.0  # its momentum (Probe.teacher_ema: a benchmark switch)
    pool_negatives: Literal["own", "all"] = "own"  # which pool entries are negatives (Probe.pool_negatives)
    reliable_entropy: float | None = None  # Probe.reliable_entropy (None: every sample)
    reliable_reweight: bool = False  # Probe.reliable_reweight
    anchor: Anchor | None = None  # the penalty towards the start weights (config.safeguards.anchor; None: none)

    @classmethod
    @torch.no_grad()
    def create(cls, model: Classifier, target: torch.Tensor, config: FamilyConfig, labels: torch.Tensor | None,
               views: Views, gen: torch.Generator, device: torch.device, shape_bucket: int = 1,
               setup: MethodSetup | None = None) -> ContrastiveState:
        """Initialise the bank from min(m_b, N_T) random target samples: strong views, the current model in
        training mode with per-chunk batch statistics (chunks of a batch's size, as the steps' keys), running
        statistics untouched."""
        n = len(target)
        bank = MemoryBank(config.bank_size, model.feature_dim, model.num_classes, device)
        id_pl = torch.full((n,), -1, dtype=torch.long, device=device)
        lab = labels.to(device) if (labels is not None and config.mode == "train") else None
        was_training = model.training
        model.train()
        freeze_frozen_norms(model)
        if setup is not None and setup.probe.bn_fixed:  # the benchmarks' switch (t3ar.method.probe)
            eval_norms(model)
        init = torch.randperm(n, generator=gen)[: min(config.bank_size, n)]
        with frozen_norm_stats(model):
            for chunk in _chunks(init, min(config.batch_size, n)):
                ids = chunk.to(device)
                with nograd_precision(config, device):
                    feats, logits = model.forward_all(views.strong(target[ids]))
                bank.enqueue(F.normalize(feats.float(), dim=1), ids, logits=logits.float(),
                             labels=lab[ids] if lab is not None else None)
                id_pl[ids] = logits.argmax(1)
        model.train(was_training)
        probe = setup.probe if setup is not None else NO_PROBE
        n_pool = len(setup.pool_images) if (setup is not None and setup.pool_images is not None) else 0
        pool_pl = torch.full((n_pool,), -1, dtype=torch.long, device=device) if n_pool else None
        teacher = None
        if probe.teacher_ema > 0:  # AdaContrast's key encoder: an EMA copy, never trained by the optimiser
            if config.joint_pass:
                raise ValueError("joint_pass and the probe's teacher_ema cannot be combined: the keys come from the "
                                 "EMA teacher, a forward of its own (leave joint_pass unset: it is then off)")
            teacher = copy.deepcopy(model)
            for p in teacher.parameters():
                p.requires_grad_(False)
        return cls(bank, id_pl, lab, config, shape_bucket, joint_enabled(config, device) and teacher is None, pool_pl,
                   setup.pool_allowed if setup is not None else None,
                   probe.pool_diagnostic_labels.to(device) if probe.pool_diagnostic_labels is not None else None,
                   probe.pool_label_oracle,
                   setup.pool_known.to(device) if (setup is not None and setup.pool_known is not None) else None,
                   teacher, probe.teacher_ema, probe.pool_negatives, probe.reliable_entropy, probe.reliable_reweight)

    def _forwards(self, model: Classifier, key_model: Classifier, xw: torch.Tensor, xs: torch.Tensor, b: int,
                  n_pool: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None,
                             torch.Tensor | None]:
        """(q_feat, q_logits) of the weak views with gradient; (k, k_logits) of the batch's strong views and
        (p, p_logits), its neighbours' features and logits (None without), without gradient; k and p normalised.
        Rows are padded to the shape bucket; each part has its own BatchNorm statistics
        (:mod:`t3ar.method.segments`)."""
        cfg, dev = self.config, xw.device
        segments = [b] if not n_pool else [b, n_pool]
        if self.joint:
            segments = [b, *segments]
            xs = torch.cat([xw, xs])
        rows = len(xs)
        pad = bucket(rows, self.shape_bucket) - rows
        if pad:
            xs = torch.cat([xs, xs[:1].expand(pad, -1, -1, -1)])
        if self.joint:  # first segment: the queries, with gradient and running statistics, as a pass of their own
            with segmented_batch_stats(model, segments, first_trains=True):
                feats_all = model.features(xs)
            q_feat = feats_all[:b]
            feats_all = feats_all[b:rows].detach()
            with torch.no_grad():
                k_logits = model.head(feats_all[:b])
                p_logits = model.head(feats_all[b:b + n_pool]).float() if n_pool else None
        else:
            with torch.no_grad(), segmented_batch_stats(key_model, segments), nograd_precision(cfg, dev):
                feats_all = key_model.features(xs)
                k_logits = key_model.head(feats_all[:b])
                p_logits = key_model.head(feats_all[b:b + n_pool]).float() if n_pool else None
        with torch.no_grad():
            k = F.normalize(feats_all[:b].float(), dim=1)
            p = F.normalize(feats_all[b:b + n_pool].float(), dim=1) if n_pool else None
        if not self.joint:
            q_feat = model.features(xw)
        q_logits = model.head(q_feat)
        return q_feat, q_logits, k, k_logits, p, p_logits

    def step(self, model: Classifier, ids: torch.Tensor, sv: StepViews, *, diagnostics: bool = False) -> StepOut:
        """Forward passes, bank update, pseudo-labels and the loss for one batch.

        ids: [B] target indices on the model's device; sv: the batch's views and neighbours
        (:func:`step_views`). ``diagnostics``: also return the gradient norms of the CE and contrastive terms
        at the query feature (two extra partial backward passes through the head/normalisation only).
        """
        cfg, bank, dev = self.config, self.bank, ids.device
        b, nbr, pool_local = len(ids), sv.nbr, sv.pool_local
        n_pool = 0 if pool_local is None else len(pool_local)
        key_model = model
        if self.teacher is not None:  # the teacher follows the model (its modes too), then computes the keys
            momentum_update(self.teacher, model, self.teacher_ema)
            for mt, ms in zip(self.teacher.modules(), model.modules(), strict=True):
                mt.training = ms.training
            key_model = self.teacher
        q_feat, q_logits, k, k_logits, p, p_logits = self._forwards(model, key_model, sv.weak, sv.strong, b, n_pool)
        q = F.normalize(q_feat.float(), dim=1)
        out: dict[str, torch.Tensor] = {}
        data = None
        with torch.no_grad():
            lab = self.labels[ids] if self.labels is not None else None
            bank.enqueue(k, ids, logits=k_logits.float(), labels=lab)
            local_dev = pool_local.to(dev) if pool_local is not None else None
            if p is not None and local_dev is not None:
                bank.enqueue(p, local_dev, logits=p_logits, from_pool=True)
            live = bank.live()  # the slots written so far: the rest are empty and masked anyway
            if lab is None:
                if cfg.refinement.knn:  # AdaContrast's soft k-NN voting over the bank (t3ar.method.vote)
                    new_pl = vote(q, live, cfg.refinement.neighbors,
                                  self.pool_known if cfg.refinement.labelled else None)
                else:  # the paper's filtered pseudo-label: the mean of the logits stored for the id
                    mean_logits, _ = live.mean_logits(ids)
                    new_pl = mean_logits.argmax(1)
                had = self.id_pl[ids] >= 0
                out["pl_change_rate"] = ((new_pl != self.id_pl[ids]) & had).sum() / had.sum().clamp(min=1)
                self.id_pl[ids] = new_pl
                y = new_pl
                # pool entries and empty slots get a dummy id; negative_mask ignores their label
                target_ids = torch.where(live.from_pool | ~live.valid, 0, live.ids)
                bank_labels = self.id_pl[target_ids]
            else:
                y = lab
                bank_labels = live.labels
            nbr_dev = nbr.to(dev, non_blocking=True) if nbr is not None else None
            retrieval = cfg.retrieval_options
            neg = losses.negative_mask(live, ids, y, bank_labels, nbr_dev, self.pool_negatives)
            extra_pos = None
            if self.pool_pl is not None and local_dev is not None and len(local_dev):
                pool_mean, pool_counts = live.mean_logits(local_dev, from_pool=True)
                self.pool_pl[local_dev] = torch.where(pool_counts > 0, pool_mean.argmax(1), self.pool_pl[local_dev])
                if retrieval is not None and retrieval.false_negatives != "keep":
                    pool_ids = torch.where(live.from_pool & live.valid, live.ids, 0)
                    # a pool label, where an item has one, says its class better than its pseudo-label
                    pool_cls = (self.pool_pl if self.pool_known is None
                                else torch.where(self.pool_known >= 0, self.pool_known, self.pool_pl))
                    bank_pool_labels = torch.where(live.from_pool, pool_cls[pool_ids], -1)
                    fn = same_class_pool_entries(live.from_pool & live.valid, bank_pool_labels, y)
                    out["false_negatives"] = (neg & fn).sum(1).float().mean()
                    neg = neg & ~fn
                    if retrieval.false_negatives == "positive" and nbr_dev is not None:
                        extra_pos = fn & losses.neighbour_entries(live, nbr_dev)
                if cfg.pool_as_data and nbr_dev is not None:
                    data = self._pool_data(nbr_dev, y, local_dev, pool_mean, pool_counts, out)
        if self.reliable_entropy is None:
            loss_ce = F.cross_entropy(q_logits.float(), y)
        else:  # SAR's / EATA's reliable samples only (t3ar.method.safeguards)
            w = reliable_weights(q_logits, self.reliable_entropy, self.reliable_reweight)
            loss_ce = filtered_mean(F.cross_entropy(q_logits.float(), y, reduction="none"), w)
            out["reliable_share"] = (w > 0).float().mean()
        cols = neg if extra_pos is None else neg | extra_pos
        nce_logits = losses.info_nce_logits(q, k, live.feats, cols, cfg.temperature)
        loss_con = (losses.info_nce_from_logits(nce_logits) if extra_pos is None
                    else losses.info_nce_multi(nce_logits, extra_pos))
        out["pool_neg_share"] = losses.denominator_share(nce_logits.detach(), neg & live.from_pool[None, :])
        if diagnostics:
            out.update(_grad_norms_at(q_feat, cfg.ce_weight * loss_ce, cfg.contrastive_weight * loss_con))
        loss = cfg.ce_weight * loss_ce + cfg.contrastive_weight * loss_con
        diversity_weight = cfg.resolved_diversity_weight
        if diversity_weight > 0:
            loss = loss + diversity_weight * losses.diversity(q_logits.float())
        if data is not None and sv.pool_weak is not None and len(data.rows) >= 2:
            # the chosen neighbours' weak views, with gradient, never counted into the running statistics
            # (evaluation statistics come from target views only): normalised by the running (target) statistics
            # (``pool_data_norm='running'``) or by their own batch's, a few images of another domain
            with norms_for_pool_data(model, pooled(cfg).pool_data.norm):
                logits_pool = model(sv.pool_weak[data.rows.to(sv.pool_weak.device)])
            loss_pool = F.cross_entropy(logits_pool.float(), data.labels)
            loss = loss + pooled(cfg).pool_data.weight * loss_pool
            out["loss_pool_data"] = loss_pool.detach()
        if sv.label_rows is not None and self.pool_known is not None:
            out["pool_label_count"] = torch.tensor(float(len(sv.label_rows)), device=dev)
            if len(sv.label_rows) and sv.label_weak is not None:
                # labelled neighbours as data: their weak views against their pool labels, normalised like the
                # pseudo-labelled ones (never counted into the running statistics)
                with norms_for_pool_data(model, pooled(cfg).pool_data.norm):
                    logits_lab = model(sv.label_weak)
                y_lab = self.pool_known[sv.label_rows.to(dev)]
                per_row = F.cross_entropy(logits_lab.float(), y_lab, reduction="none")
                w = balance_weights(y_lab) if pooled(cfg).pool_labels.balance else torch.ones_like(per_row)
                loss_lab = (per_row * w).mean()
                loss = loss + pooled(cfg).pool_labels.weight * loss_lab
                out["loss_pool_labels"] = loss_lab.detach()
        if self.anchor is not None:
            loss_anchor = self.anchor()
            loss = loss + loss_anchor
            out["loss_anchor"] = loss_anchor.detach()
        out["loss_ce"], out["loss_contrastive"] = loss_ce.detach(), loss_con.detach()
        return StepOut(loss, out, y)

    def _pool_data(self, nbr: torch.Tensor, y: torch.Tensor, local: torch.Tensor, pool_mean: torch.Tensor,
                   pool_counts: torch.Tensor, out: dict[str, torch.Tensor]) -> PoolData:
        """The step's neighbours that serve as data (:func:`~t3ar.method.pool_data.select_pool_data`); with the
        oracle diagnostic, known pool images carry their true label at full confidence. Reports how many served
        and, where true labels are known (diagnostics only), how many were right."""
        cfg = self.config
        truth = self.pool_labels[local] if self.pool_labels is not None else None
        if self.pool_oracle and truth is not None:
            known = truth >= 0
            onehot = F.one_hot(truth.clamp(min=0), pool_mean.shape[1]).float() * 100.0
            pool_mean = torch.where(known[:, None], onehot, pool_mean)
            pool_counts = torch.where(known, pool_counts.clamp(min=1), pool_counts)
        allowed = self.pool_allowed[local.cpu()] if self.pool_allowed is not None else None
        data = select_pool_data(nbr, y, local, pool_mean, pool_counts, threshold=pooled(cfg).pool_data.threshold,
                                cap=pooled(cfg).pool_data.cap, allowed=allowed)
        out["pool_data_count"] = torch.tensor(float(len(data.rows)), device=y.device)
        if truth is not None:
            t = truth[data.rows]
            known_rows = t >= 0
            out["pool_data_known"] = known_rows.sum().float()
            out["pool_data_correct"] = ((data.labels == t) & known_rows).sum().float() / known_rows.sum().float() \
                if bool(known_rows.any()) else torch.tensor(float("nan"), device=y.device)
        return data


@dataclass
class StepViews:
    """What a T3AR step makes before it needs the model (:func:`step_views`)."""

    weak: torch.Tensor  # [B, 3, S, S] weak views of the batch (the queries)
    strong: torch.Tensor  # [B + P, 3, S, S] strong views of the batch (the keys), then of its P distinct neighbours
    nbr: torch.Tensor | None  # [B, k] the batch's neighbours, local pool indices on the CPU (-1 = none)
    pool_local: torch.Tensor | None  # [P] the distinct neighbours, in the order of ``strong``'s rows after B
    pool_weak: torch.Tensor | None = None  # [P, 3, S, S] weak views of the distinct neighbours (neighbours as data)
    label_rows: torch.Tensor | None = None  # [L] local pool indices of the step's labelled data items (CPU)
    label_weak: torch.Tensor | None = None  # [L, 3, S, S] their weak views


@torch.no_grad()
def step_views(x: torch.Tensor, nbr: torch.Tensor | None, pool_images: torch.Tensor | None,
               views: Views, *, pool_weak: torch.Generator | None = None) -> StepViews:
    """The views of one T3AR step: x uint8 [B,3,S,S] on the model's device; nbr [B, k] local pool indices on the
    CPU (-1 = none) or None; pool_images uint8 [P,3,S,S] on the device (or the CPU: moved per step). Each
    distinct neighbour is rendered once; draws: the batch's weak views, then its strong views, then the
    neighbours' (from their own stream); with ``pool_weak`` (neighbours as data), the neighbours' weak views
    too, from that generator (so they change no other view of the run)."""
    xw = views.weak(x)
    pool_local = pool_x = None
    if nbr is not None and pool_images is not None:
        pool_local = torch.unique(nbr[nbr >= 0])  # each distinct neighbour once (CPU: no sync)
        if len(pool_local):
            pool_x = pool_images[pool_local.to(pool_images.device)]
    # one call, every image with its own parameters; the pool's from their own stream
    xs = views.strong(x) if pool_x is None else views.strong_with(x, pool_x)
    pw = views.weak_with(pool_x, pool_weak) if (pool_weak is not None and pool_x is not None) else None
    return StepViews(xw, xs, nbr, pool_local, pw)


class T3AR(MethodStep):
    """T3AR and its ablations as a :class:`~t3ar.method.base.MethodStep`: each step takes the batch's
    neighbours (fixed, or k of the candidates drawn anew at every visit: the paper's sampling) and runs
    :meth:`ContrastiveState.step`. Its stages (:meth:`stages`) come from its config's groups; its record is
    :class:`T3ARStepStats`."""

    stats = T3ARStepStats

    @classmethod
    def stages(cls, config: AdaptConfig) -> Sequence[Stage]:
        """The pool's inputs, then, where their options are set: the BatchNorm start, WiSE-FT, the collapse
        fallback (:mod:`t3ar.method.family_stages`) and the second stage (:mod:`t3ar.method.second_stage`)."""
        cfg = _family(config)
        guards = cfg.safeguards
        stages: list[Stage] = [PoolInputs(pooled(cfg).pool_data.sources if cfg.pool_as_data else None,
                                          cfg.pool_labels_as_data)]
        stages.append(BatchNormStart())  # on where the probe sets its switch
        if guards.wise_alpha is not None:
            stages.append(WiseFT(guards.wise_alpha))
        stages.append(CollapseFallback())  # on where the probe sets its switch
        if cfg.second_stage.added_steps():
            stages.append(SecondStage(cfg.second_stage.added_steps(), lr=cfg.second_stage.lr or cfg.lr,
                                      momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                                      batch_size=cfg.batch_size))
        return stages

    def __init__(self, state: ContrastiveState, setup: MethodSetup) -> None:
        cfg = family_config(setup)
        self.state, self.views, self.device = state, setup.views, setup.device
        self.pool_images, self.neighbours, self.candidates = setup.pool_images, setup.neighbours, setup.candidates
        retrieval = cfg.retrieval_options
        self.k, self.diagnostics = (retrieval.k if retrieval is not None else 0), setup.probe.diagnostics
        self.bn_fixed = setup.probe.bn_fixed
        self.draws = stream(cfg.seed, 3)
        self.pool_weak = stream(cfg.seed, 6) if cfg.pool_as_data else None
        n_pool = len(self.pool_images) if self.pool_images is not None else 0
        self.used = torch.zeros(n_pool, dtype=torch.bool)
        self.label_draw = None
        if cfg.pool_labels_as_data and setup.pool_known is not None:
            self.label_draw = LabelDraw(setup.probe.pool_label_draw, setup.pool_known, pooled(cfg).pool_labels.cap,
                                        stream(cfg.seed, 7))
            self.label_views = stream(cfg.seed, 8)
        self.served = torch.zeros(n_pool, dtype=torch.long)

    @classmethod
    def create(cls, model: Classifier, setup: MethodSetup) -> T3AR:
        shape_bucket = CUDA_SHAPE_BUCKET if setup.device.type == "cuda" else 1
        cfg = family_config(setup)
        state = ContrastiveState.create(model, setup.target, cfg, setup.labels, setup.views,
                                        stream(cfg.seed, 2), setup.device, shape_bucket, setup)
        if cfg.safeguards.anchor is not None:  # theta_0: the weights now, after bn_start (t3ar.method.safeguards)
            params = [p for p in model.parameters() if p.requires_grad]
            fisher = None
            if cfg.safeguards.anchor == "fisher":  # full precision: squared gradients underflow in half
                with torch.autocast(setup.device.type, enabled=False):
                    fisher = fisher_diagonal(model, params, setup.target, norm=setup.views.norm,
                                             batch_size=cfg.batch_size, generator=stream(cfg.seed, 10),
                                             bn_fixed=setup.probe.bn_fixed)
            state.anchor = Anchor.at(params, cfg.resolved_anchor_weight, fisher, lr=cfg.lr)
            if state.anchor.capped:
                log.info("anchor (%s, weight %g): %d of %d values of F capped at %.3g, the curvature SGD follows at "
                         "lr %.3g", cfg.safeguards.anchor, cfg.resolved_anchor_weight, state.anchor.capped,
                         sum(p.numel() for p in params), stable_fisher(cfg.lr, cfg.resolved_anchor_weight), cfg.lr)
        return cls(state, setup)

    def prepare(self, x: torch.Tensor, idx: torch.Tensor) -> StepViews:
        if self.candidates is not None:
            nbr: torch.Tensor | None = dedup_sample(self.candidates[idx], self.k, self.draws)
        else:
            nbr = self.neighbours[idx] if self.neighbours is not None else None
        sv = step_views(x, nbr, self.pool_images, self.views, pool_weak=self.pool_weak)
        if self.label_draw is not None and self.pool_images is not None:
            rows = self.label_draw(sv.pool_local)
            sv.label_rows = rows
            if len(rows):
                imgs = self.pool_images[rows.to(self.pool_images.device)].to(x.device)
                sv.label_weak = self.views.weak_with(imgs, self.label_views)
        return sv

    def step(self, model: Classifier, ids: torch.Tensor, idx: torch.Tensor, prepared: StepViews) -> StepOut:
        if self.bn_fixed:  # every BatchNorm layer on its running statistics, never updated (a probe's switch)
            eval_norms(model)
        out = self.state.step(model, ids.to(self.device), prepared, diagnostics=self.diagnostics)
        nbr = prepared.nbr
        if nbr is not None:
            self.used[nbr[nbr >= 0]] = True
        if prepared.label_rows is not None and len(prepared.label_rows):
            self.used[prepared.label_rows] = True
            self.served[prepared.label_rows] += 1
        return out

    def pool_used(self) -> list[int]:
        return self.used.nonzero().flatten().tolist()

    def pool_labelled(self) -> dict[int, int]:
        rows = self.served.nonzero().flatten()
        return {int(i): int(self.served[i]) for i in rows}

    def final_labels(self) -> torch.Tensor | None:
        st = self.state
        return (st.labels if st.labels is not None else st.id_pl).detach().clone()


def family_config(setup: MethodSetup) -> FamilyConfig:
    """The job's config, a T3AR-family one (the registry gives this step to the family's methods alone)."""
    return _family(setup.config)


def _family(config: AdaptConfig) -> FamilyConfig:
    if not isinstance(config, FamilyConfig):
        raise TypeError(f"{config.method} is not a method of the T3AR family: its config has no family options")
    return config


def pooled(config: FamilyConfig) -> T3ARConfig:
    """A family config with a pool (its retrieval, pool data and pool labels groups): what the pool's code paths
    read, reached only where the job has a pool."""
    if not isinstance(config, T3ARConfig):
        raise TypeError(f"{config.method} reads no pool: its config has no pool options")
    return config


def joint_enabled(config: AdaptConfig, device: torch.device) -> bool:
    """A T3AR-family ``config``'s ``joint_pass`` as given; None (auto): on CUDA only. There a step at these sizes
    waits on the interpreter launching kernels, and a forward less is a third fewer launches; on a CPU the backward
    over the extra rows costs more arithmetic than the forward saves."""
    joint = _family(config).joint_pass
    return device.type == "cuda" if joint is None else joint


def nograd_precision(config: FamilyConfig, device: torch.device) -> contextlib.AbstractContextManager[object]:
    """bfloat16 autocast for the no-gradient passes where ``config.cpu_bf16_nograd`` asks for it (CPU only; on
    CUDA the loop's own mixed precision applies), else nothing."""
    if config.cpu_bf16_nograd and device.type == "cpu":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


@contextlib.contextmanager
def norms_for_pool_data(model: Classifier, how: str) -> Iterator[None]:
    """BatchNorm for the neighbours-as-data forward: ``running``, every layer in eval mode (the running
    statistics, which the target's views keep); ``batch``, the batch's own statistics, running ones untouched."""
    if how == "batch":
        with frozen_norm_stats(model):
            yield
        return
    training = [m for m in iter_batchnorms(model) if m.training]
    for m in training:
        m.eval()
    try:
        yield
    finally:
        for m in training:
            m.train()


def _chunks(idx: torch.Tensor, size: int) -> list[torch.Tensor]:
    """``idx`` in chunks of ``size``, a short tail folded in as an epoch's batches are
    (:func:`t3ar.method.schedule.epoch_batches`)."""
    out = list(idx.split(size))
    if len(out) > 1 and (2 * len(out[-1]) < size or len(out[-1]) < 2):
        tail = out.pop()
        out[-1] = torch.cat([out[-1], tail])
    return out


def _grad_norms_at(feat: torch.Tensor, loss_ce: torch.Tensor, loss_con: torch.Tensor) -> dict[str, torch.Tensor]:
    """L2 norms of d(loss_ce)/d(feat) and d(loss_con)/d(feat) over the whole [B, D] feature batch.

    A proxy measured at the query feature q_feat, not the gradient on the parameters: it tells how strongly
    each term pulls the features, cheaply (the graph is retained for the real backward). NaN when ``feat``
    carries no gradient (nothing before it trains).
    """
    if not feat.requires_grad:
        nan = torch.tensor(float("nan"), device=feat.device)
        return {"grad_norm_ce": nan, "grad_norm_contrastive": nan}
    out = {}
    for name, term in (("grad_norm_ce", loss_ce), ("grad_norm_contrastive", loss_con)):
        (g,) = torch.autograd.grad(term, feat, retain_graph=True, allow_unused=True)
        out[name] = g.float().norm() if g is not None else torch.zeros((), device=feat.device)
    return out
