"""A vectors-only retriever app in-process (TestClient), ready to serve: what several retriever unit tests start;
a pool's restart (:func:`restarted`); the settings of a vectors-only pool and random unit vectors for it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from fastapi.testclient import TestClient

from t3ar_services.retriever.main import create_app
from t3ar_services.retriever.pool import Pool
from t3ar_services.retriever.settings import RetrieverSettings
from t3ar_services.retriever.startup import load_index, open_pool, save_index

ADMIN = {"Authorization": "Bearer admin-t"}


def unit_vectors(n: int, dim: int, seed: int) -> np.ndarray:
    """``n`` random unit vectors of ``dim`` numbers (float32), the same for the same seed."""
    v = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def pool_settings(tmp_path: Path, dim: int, **kw: Any) -> RetrieverSettings:
    """Settings of a vectors-only pool of ``dim``-d vectors (identity ``t``) in ``tmp_path/pool``, auth off."""
    args: dict[str, Any] = {"data_dir": tmp_path / "pool", "auth_disabled": True, "embedder": "none",
                            "vector_dim": dim, "vector_identity": "t", **kw}
    return RetrieverSettings(**args)


@contextmanager
def vector_retriever(data_dir: Path, dim: int, **settings: Any) -> Iterator[TestClient]:
    """A retriever of ``dim``-d vectors (tokens ``rw-t`` and ``admin-t``) on ``data_dir``, once ``/ready``."""
    config = RetrieverSettings(data_dir=data_dir, token="rw-t", admin_token="admin-t",  # type: ignore[arg-type]
                               embedder="none", vector_dim=dim, vector_identity="synthetic", **settings)
    with TestClient(create_app(config), raise_server_exceptions=False) as client:
        deadline = time.monotonic() + 30
        while client.get("/ready").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        yield client


def restarted(pool: Pool, settings: RetrieverSettings) -> Pool:
    """What a clean restart does to ``pool``: its index saved and its store closed, then the pool opened again from
    ``settings`` with its index loaded (the saved one where it matches the database, else rebuilt)."""
    save_index(pool)
    pool.store.close()
    pool, _ = open_pool(settings, None, None)
    load_index(pool)
    return pool
