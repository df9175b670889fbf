"""Background (re)training of the approximate (IVF) index while exact or older search keeps serving.

With ``T3AR_RETRIEVER_INDEX_TYPE=ivf`` a pool starts on an exact flat index; once it holds
``T3AR_RETRIEVER_IVF_TRAIN_MIN`` vectors (``IndexConfig.train_min``), and again each time it has grown to
``T3AR_RETRIEVER_IVF_RETRAIN_GROWTH`` times the size the current IVF index was trained on,
:class:`IndexTrainer` builds a new IVF index off to the side and swaps it in:

1. ``index.begin_rebuild()``: from now on the live index journals adds and removes;
2. pass 1 over the database (one read snapshot): a uniform sample of ~256 vectors per list, k-means training;
3. pass 2 (a new snapshot, read after step 1): every stored vector added to the new index;
4. ``index.finish_rebuild(new, seqs)`` under the write lock: journaled adds missing from the snapshot are
   replayed, ids removed during the build are tombstoned again, the faiss index is swapped.

While the pool is still flat, adds are held back once it holds :func:`flat_cap` vectors (twice
``train_min`` unless ``T3AR_RETRIEVER_IVF_FLAT_MAX`` says otherwise), until the first training has swapped in:
the flat index keeps float32 vectors, so an ingest faster than that training would otherwise grow it without
bound, and the first training's second pass reads at most that many.

Searches run on the live index throughout; a delete acknowledged during the build is filtered from the new index
by the shared tombstone set. Peak memory of a rebuild: the live index + the new one + the sample (~0.5 GiB at
nlist 1024, 512-d) + one database batch + the journal of adds made meanwhile (their vectors with ``flat`` and
``ivf``; only their seqs with ``ivfpq``, whose float16 rows hold the vectors). With ``ivfpq`` both indexes are
codes (``pq_m`` + 8 bytes of id per vector: 0.7 GiB each at 10 M, m 64), the float16 re-ranking rows are one file
on disk shared by both (keyed by id, written by every add, not rebuilt by a retrain), so a retrain never holds
two copies of the vectors; its sample is 64 vectors per list (0.5 GiB at nlist 4096).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

import numpy as np

from t3ar_services.retriever.index import IndexConfig, VectorIndex, min_to_train, new_trained, open_vector_file
from t3ar_services.retriever.vecfile import VectorFile

log = logging.getLogger(__name__)

MIN_PER_LIST = 39  # faiss' own warning threshold for k-means training points per centroid
SAMPLE_PER_LIST = 256  # faiss' default cap of training points per centroid
# ivfpq: fewer (the pool it is for is large: at nlist 4096, 256 per list would hold 2 GiB of float32 while a retrain
# runs beside the live index; 64 per list is 0.5 GiB, above faiss' 39, and 262,144 points for the PQ codebooks)
SAMPLE_PER_LIST_PQ = 64

Batches = Callable[[], Iterable[tuple[np.ndarray, np.ndarray]]]


def nlist_to_train(index: VectorIndex, config: IndexConfig) -> int | None:
    """The nlist to (re)train with now, or None. ``index.count`` excludes tombstones."""
    if not config.trained:
        return None
    n = index.count
    nlist = min(config.nlist, n // MIN_PER_LIST)
    if n < config.train_min or nlist < 1 or n < min_to_train(config):
        return None
    if index.kind == "flat":
        return nlist
    trained = index.trained_on or n
    return nlist if n >= config.retrain_growth * trained else None


def flat_cap(config: IndexConfig) -> int | None:
    """The most vectors a pool of a trained kind takes on its exact (flat) index, before its first IVF training
    has been swapped in; None for ``flat`` pools. Adds beyond it are held back (:meth:`Pool.add` waits, then
    answers 503): the flat index holds float32 (2 KiB per 512-d vector), and a 10 M ingest that outran the first
    training grew it to 14 GiB. Never under twice the least a training can start from, so the cap cannot hold
    adds back before the training that lifts it can begin."""
    if not config.trained:
        return None
    least = least_to_train(config)
    return max(config.flat_max or 2 * config.train_min, 2 * least)


def least_to_train(config: IndexConfig) -> int:
    """The fewest vectors the first training of a trained kind starts from."""
    return max(config.train_min, min_to_train(config), MIN_PER_LIST)


def build_ivf_two_pass(dim: int, config: IndexConfig, nlist: int, total: int, batches: Batches,
                       write_to: VectorFile | None = None) -> tuple[VectorIndex, np.ndarray]:
    """A trained IVF (or IVF-PQ) index holding every vector of ``batches()`` (called twice: sample, then add)
    and the ids it holds. ``total``: about how many vectors there are (sets the sampling rate). ``write_to``:
    also write each vector of the second pass there (the start-up rebuild of the re-ranking rows). Never more
    than the sample and one batch of float32 vectors in memory besides the index itself."""
    rng = np.random.default_rng(0)
    per_list = SAMPLE_PER_LIST_PQ if config.kind == "ivfpq" else SAMPLE_PER_LIST
    frac = min(1.0, nlist * per_list / max(total, 1))
    sample = np.concatenate([v[rng.random(len(v)) < frac] for _, v in batches()] or [np.empty((0, dim), np.float32)])
    if len(sample) < nlist:
        raise ValueError(f"{len(sample)} training vectors for {nlist} lists")
    ivf = new_trained(dim, config, nlist, sample)
    del sample
    seqs: list[np.ndarray] = []
    for ids, vecs in batches():
        if write_to is not None:
            write_to.write(ids, vecs)
        ivf.add_with_ids(np.ascontiguousarray(vecs, dtype=np.float32), ids.astype(np.int64))
        seqs.append(ids.astype(np.int64))
    ivf.nprobe = min(config.nprobe, nlist)
    out = VectorIndex(ivf, dim, config.kind, ivf.nprobe)
    out.threads, out.rerank = config.threads, config.rerank
    all_seqs = np.concatenate(seqs) if seqs else np.empty(0, np.int64)
    out.trained_on = len(all_seqs)
    return out, all_seqs


def rebuild_ivf(index: VectorIndex, config: IndexConfig, nlist: int, batches: Batches,
                should_stop: Callable[[], bool] = lambda: False) -> bool:
    """Build a new IVF index off to the side and swap it into ``index`` (see the module docstring).
    Returns False when stopped before the swap (``index`` is then unchanged)."""
    t0 = time.monotonic()
    index.begin_rebuild()
    try:
        new, seqs = build_ivf_two_pass(index.dim, config, nlist, index.count, batches)
        if should_stop():
            index.abort_rebuild()
            return False
        replayed = index.finish_rebuild(new, seqs)
    except BaseException:
        index.abort_rebuild()
        raise
    log.info("IVF index trained in the background: %d lists, %d vectors (+%d added during the build) in %.1fs",
             nlist, len(seqs), replayed, time.monotonic() - t0)
    return True


class IndexTrainer(threading.Thread):
    """Checks after adds (and every ``interval`` seconds) whether the IVF index should be (re)trained."""

    def __init__(self, get_index: Callable[[], VectorIndex | None], config: IndexConfig, batches: Batches,
                 wanted: threading.Event | None = None, interval: float = 5.0) -> None:
        super().__init__(name="index-trainer", daemon=True)
        self.get_index, self.config, self.batches, self.interval = get_index, config, batches, interval
        self.wanted = wanted if wanted is not None else threading.Event()
        self.stop_event = threading.Event()
        self.builds = 0
        self.last_error: str | None = None

    def run(self) -> None:
        while not self.stop_event.is_set():
            self.wanted.wait(timeout=self.interval)
            self.wanted.clear()
            if self.stop_event.is_set():
                break
            index = self.get_index()
            nlist = nlist_to_train(index, self.config) if index is not None else None
            if index is None or nlist is None:
                continue
            try:
                if rebuild_ivf(index, self.config, nlist, self.batches, self.stop_event.is_set):
                    self.builds += 1
                    self.last_error = None
            except Exception as e:
                self.last_error = f"{type(e).__name__}: {e}"
                log.exception("background IVF training failed; searches keep using the current index")
                self.stop_event.wait(60)  # do not retry in a tight loop

    def stop(self) -> None:
        self.stop_event.set()
        self.wanted.set()
        self.join(timeout=120)


def build_index(dim: int, config: IndexConfig, total: int, batches: Batches) -> VectorIndex:
    """The index for ``batches()`` (the whole pool, ``total`` vectors) at start-up or after a failed add.
    ``ivfpq`` is built in two passes over the database (never the pool's float32 vectors in memory at once) and
    rewrites its float16 re-ranking rows on the way; the other kinds as :meth:`VectorIndex.build`."""
    nlist = min(config.nlist, total // MIN_PER_LIST)
    if config.kind != "ivfpq" or total < max(config.train_min, min_to_train(config)) or nlist < 1:
        return VectorIndex.build(dim, config, batches())
    vf = open_vector_file(dim, config, reset=True)
    index, _ = build_ivf_two_pass(dim, config, nlist, total, batches,
                                  write_to=None if config.vectors_shared else vf)
    index.vectors, index.owns_vectors = vf, not config.vectors_shared
    index.attach_device(config.device)
    return index
