"""Retriever settings: one pydantic-settings class, env prefix ``T3AR_RETRIEVER_``, built at start-up.

Every field is documented in ``services/retriever/README.md``; keep the two in sync.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from t3ar_services.common.settings import ServiceSettings
from t3ar_services.retriever.backend import MilvusConfig

MiB = 1024**2


class RetrieverSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="T3AR_RETRIEVER_", extra="ignore", frozen=True)

    data_dir: Path = Path("data/retriever")

    # --- auth (ServiceSettings): token = read/write, admin_token = everything, plus deletes; auth_disabled ---

    # --- the retriever R ---
    embedder: str = "efficientnet_lite0"  # an EmbedderSpec arch string, or "none" (vectors-only pool)
    embedder_weights: str | None = None
    embedder_pretrained_tag: str | None = None
    embedder_image_size: int = Field(default=96, ge=16, le=1024)
    device: str = "cpu"
    embed_batch_size: int = Field(default=64, ge=1, le=4096)
    reembed_on_start: bool = False
    vector_dim: int | None = Field(default=None, ge=1, le=65536)  # vectors-only pools
    vector_identity: str | None = None  # vectors-only pools

    # --- backend: where the vector index lives (services/retriever/backend.py) ---
    backend: Literal["faiss", "milvus"] = "faiss"
    milvus_uri: str = ""  # "" = milvus-lite in <data_dir>/milvus.db; http://host:19530 = Milvus standalone/cluster
    milvus_token: str | None = None  # "user:password" or an API key, for a Milvus server with auth
    milvus_collection: str = ""  # "" = t3ar_pool_<pool tag>
    milvus_timeout: float = Field(default=10.0, gt=0)  # seconds, for the start-up connection
    milvus_index: Literal["HNSW", "IVF_FLAT", "FLAT"] = "HNSW"  # the collection's vector index (built by Milvus)
    milvus_hnsw_m: int = Field(default=16, ge=2, le=2048)
    milvus_hnsw_ef_construction: int = Field(default=200, ge=1, le=2**31 - 1)
    milvus_hnsw_ef: int = Field(default=128, ge=1, le=32768)  # per search; raised to k when k is larger
    milvus_ivf_nlist: int = Field(default=1024, ge=1, le=65536)
    milvus_ivf_nprobe: int = Field(default=32, ge=1, le=65536)
    milvus_consistency: Literal["Bounded", "Session", "Strong"] = "Session"  # searches' read level

    # --- index ---
    index_type: Literal["flat", "ivf", "ivfpq"] = "flat"
    ivf_nlist: int = Field(default=1024, ge=1, le=1 << 20)
    ivf_nprobe: int = Field(default=32, ge=1, le=1 << 20)
    pq_m: int = Field(default=64, ge=1, le=4096)  # ivfpq: bytes of code per vector; must divide the dimension
    rerank_factor: int = Field(default=4, ge=1, le=64)  # ivfpq: candidates re-scored exactly per result
    ivf_train_min: int = Field(default=40_000, ge=1)  # flat (exact) below this; IVF trained in the background
    ivf_retrain_growth: float = Field(default=2.0, gt=1.0)  # retrain once the pool grew this many times
    ivf_flat_max: int = Field(default=0, ge=0)  # adds wait beyond this many until the first training (0: 2 x min)
    ivf_flat_wait_s: float = Field(default=20.0, ge=0.0, le=300.0)  # then answer 503 with Retry-After
    index_device: str = "auto"  # auto | faiss | a torch device (cpu, cuda, cuda:N) for exact search
    search_threads: int = Field(default=0, ge=0, le=256)  # for batches of >= 20 queries; 0 = all cores
    vector_storage: Literal["auto", "sqlite", "float16"] = "auto"  # where a pool keeps its vectors (store.py)
    compact_threshold: int = Field(default=512, ge=1)
    compact_idle_seconds: float = Field(default=2.0, ge=0.0)

    # --- adds ---
    duplicate_threshold: float = Field(default=0.98, ge=-1.0, le=1.0)
    duplicate_policy: Literal["skip", "keep"] = "skip"

    # --- limits ---
    max_upload_bytes: int = Field(default=512 * MiB, ge=1)
    max_image_bytes: int = Field(default=32 * MiB, ge=1)
    max_image_pixels: int = Field(default=40_000_000, ge=1)
    max_items_per_request: int = Field(default=2048, ge=1)
    max_archive_files: int = Field(default=20_000, ge=1)
    max_archive_bytes: int = Field(default=2048 * MiB, ge=1)
    max_archive_ratio: int = Field(default=100, ge=1)  # unpacked bytes per archive byte
    max_k: int = Field(default=1000, ge=1)
    max_queries: int = Field(default=4096, ge=1)
    max_search_image_bytes: int = Field(default=64 * MiB, ge=1)  # query images of one POST /search, in all
    max_vectors_per_request: int = Field(default=200_000, ge=1)

    @field_validator("token", "admin_token", "embedder_weights", "embedder_pretrained_tag", "vector_identity",
                     "milvus_token", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return None if value == "" else value

    @field_validator("index_device")
    @classmethod
    def _index_device(cls, value: str) -> str:
        if value not in ("auto", "faiss", "cpu", "cuda") and not value.startswith("cuda:"):
            raise ValueError("index_device must be auto, faiss, cpu, cuda or cuda:N")
        return value

    @property
    def search_device(self) -> str | None:
        """The torch device exact search runs on, or None for faiss on the CPU. ``auto``: the embedder's
        device when that is CUDA (``T3AR_RETRIEVER_DEVICE=cuda``), else faiss."""
        if self.index_device == "faiss":
            return None
        if self.index_device == "auto":
            return self.device if self.device.startswith("cuda") else None
        return self.index_device

    @property
    def milvus_config(self) -> MilvusConfig:
        return MilvusConfig(self.milvus_index, self.milvus_hnsw_m, self.milvus_hnsw_ef_construction,
                            self.milvus_hnsw_ef, self.milvus_ivf_nlist, self.milvus_ivf_nprobe,
                            self.milvus_consistency)

    @property
    def milvus_target(self) -> str:
        return self.milvus_uri or str(self.data_dir / "milvus.db")

    @property
    def vectors_only(self) -> bool:
        return self.embedder.lower() == "none"
