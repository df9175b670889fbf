"""The memory bank: a FIFO queue of features (+ logits for target entries) with ids and a pool flag.

Target entries (from T) store g(t'(x)) (L2-normalised), f(t'(x)) and the sample id; pool entries (from
A) store the feature, the id and, where the method keeps them (neighbours as data, false-negative control), the
logits f(t'(a)) too, so pool items get filtered pseudo-labels of their own; otherwise zeros. Ids: target
samples are ``0..N_T-1``; pool entries use their own id space, told apart by ``from_pool``.

The queue fills from slot 0 and only wraps once full, so the slots written so far are always a prefix:
:meth:`MemoryBank.live` is that prefix (views, no copy), which is what the losses scan. A bank that is not full
yet (every job's first steps, and whole jobs whose target and retrieved images are fewer than its size) costs
what it holds, not what it could hold; the empty slots it leaves out are the ones every loss masks anyway.
"""

from __future__ import annotations

import torch


class MemoryBank:
    """Fixed-size circular queue. Empty slots are marked invalid and never used as negatives."""

    def __init__(self, size: int, feat_dim: int, num_classes: int, device: torch.device | str = "cpu") -> None:
        if size < 1:
            raise ValueError("bank size must be >= 1")
        self.size = size
        self.feats = torch.zeros(size, feat_dim, device=device)
        self.logits = torch.zeros(size, num_classes, device=device)
        self.ids = torch.full((size,), -1, dtype=torch.long, device=device)
        self.labels = torch.full((size,), -1, dtype=torch.long, device=device)
        self.from_pool = torch.zeros(size, dtype=torch.bool, device=device)
        self.valid = torch.zeros(size, dtype=torch.bool, device=device)
        self.ptr = 0
        self.filled = 0  # slots written at least once: always the prefix [0, filled)

    def __len__(self) -> int:
        return int(self.valid.sum())

    @torch.no_grad()
    def enqueue(self, feats: torch.Tensor, ids: torch.Tensor, *, logits: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, from_pool: bool = False) -> None:
        """Write a batch at the head of the queue, overwriting the oldest entries (dequeue)."""
        n = len(ids)
        if n == 0:
            return
        if n > self.size:  # only the newest entries fit
            feats, ids = feats[-self.size:], ids[-self.size:]
            logits = logits[-self.size:] if logits is not None else None
            labels = labels[-self.size:] if labels is not None else None
            n = self.size
        slots = (self.ptr + torch.arange(n, device=self.ids.device)) % self.size
        self.feats[slots] = feats.detach().float()
        self.ids[slots] = ids.to(self.ids.device)
        if logits is not None:
            self.logits[slots] = logits.detach().float()
        else:
            self.logits[slots] = 0
        self.labels[slots] = labels.to(self.ids.device) if labels is not None else -1
        self.from_pool[slots] = from_pool
        self.valid[slots] = True
        self.ptr = int((self.ptr + n) % self.size)
        self.filled = min(self.size, self.filled + n)

    def live(self) -> MemoryBank:
        """The slots written so far, as a bank of their own (views of this one's tensors: no copy). Every slot
        left out is invalid, so masks, means and InfoNCE logits over it equal those over the whole bank."""
        view = object.__new__(MemoryBank)
        view.size = view.filled = self.filled
        view.ptr = self.ptr % max(1, self.filled)
        for name in ("feats", "logits", "ids", "labels", "from_pool", "valid"):
            setattr(view, name, getattr(self, name)[: self.filled])
        return view

    @torch.no_grad()
    def mean_logits(self, ids: torch.Tensor, *, from_pool: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean of the stored logits for each id: ([B, C], counts [B]); zeros where none stored. ``ids`` are
        target ids, or pool ids with ``from_pool`` (the two id spaces are apart)."""
        side = self.from_pool if from_pool else ~self.from_pool
        mask = (self.ids[None, :] == ids[:, None]) & (self.valid & side)[None, :]
        counts = mask.sum(1)
        sums = mask.float() @ self.logits
        return sums / counts.clamp(min=1)[:, None].float(), counts
