"""Exact inner-product search on a torch device (the retriever's ``T3AR_RETRIEVER_DEVICE=cuda`` index mirror).

The vectors live in one device tensor with spare capacity (amortised appends), their ids in a host array of the
same order. A search is one matrix product and one ``topk`` on the device; filters (an ``allowed`` id set, ids to
drop) become a mask over the rows. The retriever's ``VectorIndex`` calls every method under its RW lock
(reads concurrent, writes exclusive), so this class has no lock of its own.

The same code runs on ``cpu`` (the unit tests compare it with faiss); on a GPU, a 1M x 512-d float32 pool is
2 GiB of device memory, and faiss keeps its host copy (persistence, ``live_ids``).
"""

from __future__ import annotations

from collections.abc import Set
from typing import Any

import numpy as np
import torch

from t3ar.device import resolve_device

QUERY_CHUNK = 1024  # queries per matrix product: bounds the [queries, N] score matrix (4 GiB at 1M vectors)


class TorchFlat:
    def __init__(self, dim: int, device: torch.device) -> None:
        self.dim, self.device = dim, device
        self._vecs = torch.empty((0, dim), dtype=torch.float32, device=device)
        self._ids = np.empty(0, dtype=np.int64)
        self._n = 0

    @classmethod
    def from_array(cls, vectors: np.ndarray, ids: np.ndarray, device: str) -> TorchFlat:
        out = cls(int(vectors.shape[1]), resolve_device(device))
        out.add(ids, vectors)
        return out

    @classmethod
    def from_faiss(cls, index: Any, device: str) -> TorchFlat:
        """Mirror a faiss ``IndexIDMap2(IndexFlatIP)``. ``device``: ``cuda``, ``cuda:N`` or ``cpu``; an
        unavailable CUDA device raises :class:`~t3ar.errors.DeviceUnavailableError` with the reason."""
        import faiss

        mirror = cls(int(index.d), resolve_device(device))
        n = int(index.ntotal)
        if n:
            flat: Any = faiss.downcast_index(index.index)
            vecs = faiss.rev_swig_ptr(flat.get_xb(), n * mirror.dim).reshape(n, mirror.dim)
            mirror.add(faiss.vector_to_array(index.id_map).astype(np.int64), vecs)
        return mirror

    @property
    def device_name(self) -> str:
        return str(self.device)

    @property
    def ntotal(self) -> int:
        return self._n

    def add(self, ids: np.ndarray, vecs: np.ndarray) -> None:
        m = len(ids)
        if self._n + m > len(self._vecs):
            cap = max(self._n + m, 2 * len(self._vecs), 1024)
            grown = torch.empty((cap, self.dim), dtype=torch.float32, device=self.device)
            grown[: self._n] = self._vecs[: self._n]
            self._vecs = grown
            ids_grown = np.empty(cap, dtype=np.int64)
            ids_grown[: self._n] = self._ids[: self._n]
            self._ids = ids_grown
        self._vecs[self._n: self._n + m] = torch.from_numpy(np.ascontiguousarray(vecs, dtype=np.float32)).to(
            self.device)
        self._ids[self._n: self._n + m] = ids
        self._n += m

    def remove(self, ids: np.ndarray) -> int:
        """Drop these ids (compaction); keeps the order of the others. Returns how many were removed."""
        keep = ~np.isin(self._ids[: self._n], ids)
        removed = int(self._n - keep.sum())
        if removed:
            rows = torch.from_numpy(np.nonzero(keep)[0]).to(self.device)
            kept = self._vecs.index_select(0, rows)
            self._vecs[: len(kept)] = kept
            self._ids[: len(kept)] = self._ids[: self._n][keep]
            self._n = len(kept)
        return removed

    def search(self, queries: np.ndarray, k: int, *, allowed: np.ndarray | None = None,
               drop: Set[int] = frozenset()) -> tuple[np.ndarray, np.ndarray]:
        """faiss' result layout: (scores [nq, k], ids [nq, k]) best first, ``-1`` ids where fewer qualify."""
        nq, n = len(queries), self._n
        scores_out = np.full((nq, k), -np.inf, dtype=np.float32)
        ids_out = np.full((nq, k), -1, dtype=np.int64)
        if n == 0 or k == 0:
            return scores_out, ids_out
        ids = self._ids[:n]
        mask: torch.Tensor | None = None
        if allowed is not None or drop:
            ok = np.ones(n, dtype=bool)
            if allowed is not None:
                ok &= np.isin(ids, allowed)
            if drop:
                ok &= ~np.isin(ids, np.fromiter(drop, dtype=np.int64, count=len(drop)))
            mask = torch.from_numpy(~ok).to(self.device)
        kk = min(k, n)
        base = self._vecs[:n]
        with torch.inference_mode():
            for start in range(0, nq, QUERY_CHUNK):
                q = torch.from_numpy(np.ascontiguousarray(queries[start:start + QUERY_CHUNK])).to(self.device)
                sims = q @ base.T
                if mask is not None:
                    sims.masked_fill_(mask, -torch.inf)
                top_s, top_i = torch.topk(sims, kk, dim=1)  # sorted, best first
                s_np, i_np = top_s.cpu().numpy(), top_i.cpu().numpy()
                rows = slice(start, start + len(q))
                scores_out[rows, :kk] = s_np
                ids_out[rows, :kk] = np.where(np.isfinite(s_np), ids[i_np], -1)
        return scores_out, ids_out
