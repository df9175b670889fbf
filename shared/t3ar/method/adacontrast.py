"""AdaContrast (Chen et al., CVPR 2022, "Contrastive Test-Time Adaptation"), pure torch.

Contract: ``AdaContrastState.create`` runs one eval-mode pass of the model over the whole target set with the
``plain`` view and builds the state (momentum/key encoder = deep copy of the model, MoCo queue, feature/probability
bank). Each ``loss(model, x_w, x_q, x_k)`` takes one weak and two strong views of a batch (:func:`views_of`
draws them, in that order), does the momentum update, the forwards, the pseudo-label refinement and the
queue/bank updates, and returns ``alpha*ce + beta*ins + eta*div`` plus its parts. The caller owns train/eval mode
of ``model``, zero_grad, backward, the optimizer step and the lr schedule. No I/O, no global state; random draws
come from the given generator. :class:`AdaContrast` is the method the adaptation loop drives: the state built from
an ``AdaptConfig``.

Faithful to the official code (github.com/DianCh/AdaContrast: ``target.py`` train_epoch / eval_and_label_dataset /
soft_k_nearest_neighbors / update_labels / instance_loss / div, ``moco/builder.py`` AdaMoCo) with its published
defaults (configs/learn/target.yaml, configs/model_tta/moco.yaml):
  - key encoder: copy of the source model, frozen, EMA of the *parameters* only (m=0.999, before the keys);
    its buffers (BN running stats) are not averaged. It runs in the same per-module train/eval modes as the
    query model (official: both in train mode). Keys are its normalised features of the second strong view.
  - queue: K=16384 random unit features with random labels in [0, C); FIFO-updated with (keys, refined
    pseudo-labels) before the instance loss, so same-label keys of the current batch are masked too.
  - bank: eval-mode features and softmax probs of the whole target set, randomly permuted; default size = the
    whole target set (official learn.queue_size=-1); FIFO-updated every step with the key encoder's
    features/softmax of the weak view (the key encoder is unchanged by the optimizer step, so computing this
    before the step as done here equals the official post-step update).
  - refinement: cosine soft-kNN voting (10 neighbours) on the current model's weak-view features.
  - losses: CE(strong-query logits, refined labels) ("weak_strong"), class-aware InfoNCE (T=0.07),
    diversity sum(p_mean * log(p_mean + 1e-8)) on the strong-query logits; alpha = beta = eta = 1.
Deviations (numerically neutral): the weak forward of the query model runs under no_grad (official keeps a graph
it never uses); single process, so no DDP batch shuffle/gather (on one GPU shuffle+unshuffle is the identity for
BN batch statistics); features/logits are cast to float32 (for autocast) before any loss or bank math.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from t3ar.method.base import MethodSetup, MethodStep, StepOut, stream
from t3ar.method.specs.adacontrast import AdaContrastConfig
from t3ar.method.views import Views
from t3ar.models.classifier import Classifier

View = Callable[[torch.Tensor], torch.Tensor]


def views_of(x: torch.Tensor, weak: View, strong: View) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A step's views of the uint8 batch ``x``, drawn in the official order: weak, strong (query), strong (key)."""
    return weak(x), strong(x), strong(x)


@torch.no_grad()
def soft_knn_refine(feats: torch.Tensor, bank_feats: torch.Tensor, bank_probs: torch.Tensor,
                    num_neighbors: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Average the bank probs of the ``num_neighbors`` nearest bank features (cosine); labels = argmax."""
    bank_n = F.normalize(bank_feats.float(), dim=1)
    k = min(num_neighbors, bank_n.shape[0])
    out = []
    for chunk in torch.split(feats.float(), 64):  # official chunking: bounds the [64, M] distance matrix
        distances = 1 - F.normalize(chunk, dim=1) @ bank_n.T
        idxs = distances.topk(k, dim=1, largest=False).indices
        out.append(bank_probs.float()[idxs].mean(dim=1))
    probs = torch.cat(out)
    return probs.argmax(dim=1), probs


@torch.no_grad()
def momentum_update(key_model: torch.nn.Module, query_model: torch.nn.Module, m: float) -> None:
    """param_k <- m * param_k + (1 - m) * param_q for every parameter (buffers untouched, as official)."""
    for param_k, param_q in zip(key_model.parameters(), query_model.parameters(), strict=True):
        param_k.copy_(param_k * m + param_q.detach() * (1.0 - m))


def class_aware_info_nce(q: torch.Tensor, k: torch.Tensor, queue_feats: torch.Tensor, queue_labels: torch.Tensor,
                         pseudo_labels: torch.Tensor, temperature: float) -> torch.Tensor:
    """MoCo InfoNCE; q [B,D], k [B,D], queue [K,D] are unit-norm. Queue entries labelled as the query are masked."""
    l_pos = (q * k.detach()).sum(dim=1, keepdim=True)
    l_neg = q @ queue_feats.detach().T
    logits = torch.cat([l_pos, l_neg], dim=1) / temperature
    mask = torch.ones_like(logits, dtype=torch.bool)
    mask[:, 1:] = pseudo_labels.reshape(-1, 1) != queue_labels.reshape(1, -1)
    logits = logits.masked_fill(~mask, float("-inf"))
    return F.cross_entropy(logits, torch.zeros(len(q), dtype=torch.long, device=q.device))


def diversity_loss(logits: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Negative entropy of the batch-mean softmax: sum(p_mean * log(p_mean + eps)) (minimising spreads classes)."""
    p_mean = F.softmax(logits.float(), dim=1).mean(dim=0)
    return torch.sum(p_mean * torch.log(p_mean + eps))


@torch.no_grad()
def fifo_write(buffer: torch.Tensor, ptr: int, rows: torch.Tensor) -> int:
    """Write ``rows`` into the ring ``buffer`` at ``ptr`` (wrapping); return the new pointer.

    More rows than slots behaves like writing them one after another (the newest ``len(buffer)`` survive).
    """
    size, n = len(buffer), len(rows)
    end = (ptr + n) % size
    if n > size:
        ptr, rows = (ptr + n - size) % size, rows[n - size:]
    idxs = (ptr + torch.arange(len(rows), device=buffer.device)) % size
    buffer[idxs] = rows.to(device=buffer.device, dtype=buffer.dtype)
    return end


def _copy_modes(dst: torch.nn.Module, src: torch.nn.Module) -> None:
    for md, ms in zip(dst.modules(), src.modules(), strict=True):
        md.training = ms.training


@dataclass
class AdaContrastState:
    key_model: Classifier
    queue_feats: torch.Tensor  # [K, D] unit-norm keys
    queue_labels: torch.Tensor  # [K] pseudo-labels of the keys
    bank_feats: torch.Tensor  # [M, D] features (not normalised) for the soft-kNN refinement
    bank_probs: torch.Tensor  # [M, C] softmax probs
    num_neighbors: int = 10
    momentum: float = 0.999
    temperature: float = 0.07
    alpha: float = 1.0
    beta: float = 1.0
    eta: float = 1.0
    queue_ptr: int = 0
    bank_ptr: int = 0

    @classmethod
    def create(cls, model: Classifier, target: torch.Tensor, *, plain: View, queue_size: int,
               num_neighbors: int = 10, momentum: float = 0.999, temperature: float = 0.07,
               generator: torch.Generator, bank_size: int | None = None,
               eval_batch_size: int = 256) -> AdaContrastState:
        """Build the state. ``bank_size`` None = whole target set (official default); ``queue_size`` = MoCo K."""
        if queue_size < 1 or len(target) == 0:
            raise ValueError("queue_size must be >= 1 and the target set non-empty")
        queue = F.normalize(torch.randn(queue_size, model.feature_dim, generator=generator), dim=1)
        queue_labels = torch.randint(0, model.num_classes, (queue_size,), generator=generator)
        modes = [m.training for m in model.modules()]
        model.eval()
        feats, probs = [], []
        try:
            with torch.no_grad():
                for i in range(0, len(target), eval_batch_size):
                    f, logits = model.forward_all(plain(target[i:i + eval_batch_size]))
                    feats.append(f.float())
                    probs.append(F.softmax(logits.float(), dim=1))
        finally:
            for m, was in zip(model.modules(), modes, strict=True):
                m.training = was
        all_feats, all_probs = torch.cat(feats), torch.cat(probs)
        device = all_feats.device
        perm = torch.randperm(len(all_feats), generator=generator).to(device)[:bank_size]
        key_model = copy.deepcopy(model)
        key_model.requires_grad_(False)
        for p in key_model.parameters():
            p.grad = None
        return cls(key_model=key_model, queue_feats=queue.to(device), queue_labels=queue_labels.to(device),
                   bank_feats=all_feats[perm].clone(), bank_probs=all_probs[perm].clone(),
                   num_neighbors=num_neighbors, momentum=momentum, temperature=temperature)

    def loss(self, model: Classifier, x_w: torch.Tensor, x_q: torch.Tensor, x_k: torch.Tensor
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One AdaContrast step's loss on a batch's weak view ``x_w`` and its two strong views ``x_q`` (query)
        and ``x_k`` (key) (updates key encoder, queue and bank); its parts are detached tensors, read by the
        loop in its one device sync per step."""
        with torch.no_grad():  # refined pseudo-labels from the current model's weak view
            feats_w, _ = model.forward_all(x_w)
            pseudo_labels, _ = soft_knn_refine(feats_w.float(), self.bank_feats, self.bank_probs,
                                               self.num_neighbors)
        feats_q, logits_q = model.forward_all(x_q)
        q = F.normalize(feats_q.float(), dim=1)
        logits_q = logits_q.float()
        with torch.no_grad():
            _copy_modes(self.key_model, model)
            momentum_update(self.key_model, model, self.momentum)
            k = F.normalize(self.key_model.features(x_k).float(), dim=1)
            fifo_write(self.queue_labels, self.queue_ptr, pseudo_labels)  # update_memory, before the loss
            self.queue_ptr = fifo_write(self.queue_feats, self.queue_ptr, k)
        loss_ins = class_aware_info_nce(q, k, self.queue_feats, self.queue_labels, pseudo_labels, self.temperature)
        loss_ce = F.cross_entropy(logits_q, pseudo_labels)
        loss_div = diversity_loss(logits_q)
        total = self.alpha * loss_ce + self.beta * loss_ins + self.eta * loss_div
        with torch.no_grad():  # slow (key) features of the weak view refresh the neighbour space
            feats_kw, logits_kw = self.key_model.forward_all(x_w)
            fifo_write(self.bank_probs, self.bank_ptr, F.softmax(logits_kw.float(), dim=1))
            self.bank_ptr = fifo_write(self.bank_feats, self.bank_ptr, feats_kw.float())
        return total, {"ce": loss_ce.detach(), "ins": loss_ins.detach(), "div": loss_div.detach(),
                       "pseudo_labels": pseudo_labels}


class AdaContrast(MethodStep):
    """AdaContrast as a :class:`~t3ar.method.base.MethodStep`: ``bank_size`` is the MoCo queue's K,
    ``refine_neighbors`` the soft-voting neighbours, ``ema`` the key encoder's momentum, the loss weights
    ``ce_weight``, ``contrastive_weight`` and the diversity weight (1 unless set)."""

    def __init__(self, state: AdaContrastState, views: Views) -> None:
        self.state, self.views = state, views

    @classmethod
    def create(cls, model: Classifier, setup: MethodSetup) -> AdaContrast:
        cfg = setup.config
        if not isinstance(cfg, AdaContrastConfig):
            raise TypeError(f"{cfg.method}'s config is not AdaContrast's")
        state = AdaContrastState.create(model, setup.target, plain=setup.views.plain, queue_size=cfg.bank_size,
                                        num_neighbors=cfg.refine_neighbors, momentum=cfg.ema,
                                        temperature=cfg.temperature, generator=stream(cfg.seed, 2))
        state.alpha, state.beta, state.eta = cfg.ce_weight, cfg.contrastive_weight, cfg.resolved_diversity_weight
        return cls(state, setup.views)

    def prepare(self, x: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return views_of(x, self.views.weak, self.views.strong)

    def step(self, model: Classifier, ids: torch.Tensor, idx: torch.Tensor,
             prepared: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> StepOut:
        loss, info = self.state.loss(model, *prepared)
        parts = {"loss_ce": info["ce"], "loss_contrastive": info["ins"], "loss_diversity": info["div"]}
        return StepOut(loss, parts, info["pseudo_labels"])
