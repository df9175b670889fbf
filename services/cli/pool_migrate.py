"""``t3ar pool migrate``: move a pool's vector index between backends (faiss <-> milvus) without re-embedding.

Offline: stop the retriever first (milvus-lite also allows one process per file). Ids, sources, metadata and
image blobs stay where they are (SQLite and the blob store of the data directory, shared by both backends);
the vectors are copied from SQLite into the target. To milvus: only the ids the collection lacks are inserted
(and ids it should not hold are removed), so an interrupted migration resumes where it stopped; a sample of
the copied vectors is compared with the database; the collection is then marked in sync so the next start
trusts it. To faiss: the index is built from SQLite and saved with its marker (the next start loads it).
Either way the retriever must then be started with the target backend (T3AR_RETRIEVER_BACKEND).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import click
import numpy as np

if TYPE_CHECKING:  # imported where used: the CLI starts without the retriever's dependencies
    from t3ar_services.retriever.backend import MilvusIndex
    from t3ar_services.retriever.store import Store


@click.command("migrate")
@click.option("--data-dir", type=click.Path(file_okay=False, exists=True, path_type=Path), required=True,
              help="The pool's data directory (T3AR_RETRIEVER_DATA_DIR); the retriever must be stopped.")
@click.option("--to", "target", type=click.Choice(["faiss", "milvus"]), required=True, help="Target backend.")
@click.option("--milvus-uri", default=None,
              help="Milvus URI (default: T3AR_RETRIEVER_MILVUS_URI, else milvus-lite in DATA_DIR/milvus.db).")
@click.option("--milvus-collection", default=None,
              help="Collection (default: T3AR_RETRIEVER_MILVUS_COLLECTION, else t3ar_pool_<pool tag>).")
@click.option("--drop-old", is_flag=True,
              help="Afterwards remove the other backend's copy (the saved faiss index, or the Milvus collection).")
@click.option("--check", "check_n", default=256, show_default=True, type=click.IntRange(0),
              help="Vectors compared between the database and Milvus after the copy.")
def migrate(data_dir: Path, target: str, milvus_uri: str | None, milvus_collection: str | None,
            drop_old: bool, check_n: int) -> None:
    """Move the pool in DATA_DIR to the faiss or milvus backend (vectors, ids, sources, metadata, blobs kept;
    nothing is re-embedded). Resumable: run it again after an interruption.

    \b
    Example:
      t3ar pool migrate --data-dir data/pool --to milvus --milvus-uri http://milvus:19530
      T3AR_RETRIEVER_BACKEND=milvus T3AR_RETRIEVER_MILVUS_URI=http://milvus:19530 t3ar serve retriever ...
    """
    from t3ar_services.retriever.backend import (
        MilvusIndex,
        MilvusUnavailableError,
        connect,
        default_collection,
        local_file,
        release_local,
    )
    from t3ar_services.retriever.milvus_sync import mark_synced, sync
    from t3ar_services.retriever.settings import RetrieverSettings
    from t3ar_services.retriever.store import Store

    db = data_dir / "pool.sqlite3"
    if not db.is_file():
        raise click.ClickException(f"{data_dir} holds no pool (no pool.sqlite3)")
    settings = RetrieverSettings(data_dir=data_dir, auth_disabled=True)  # no server here: tokens are not needed
    store = Store(db)
    try:
        meta = store.meta()
        if "identity" not in meta:
            raise click.ClickException(f"{data_dir} holds an empty, never-initialised pool")
        dim, tag, count = int(meta["dim"]), meta["tag"], store.count()
        uri = milvus_uri or settings.milvus_target
        collection = milvus_collection or settings.milvus_collection or default_collection(tag)
        t0 = time.monotonic()
        if target == "milvus":
            try:
                index = MilvusIndex(connect(uri, settings.milvus_token, settings.milvus_timeout), collection, dim,
                                    local_file(uri), config=settings.milvus_config)
            except MilvusUnavailableError as e:
                raise click.ClickException(str(e)) from e
            try:
                inserted, removed = sync(index, store, dim)
                _check(index, store, check_n)
                mark_synced(index, store)
            finally:
                index.close()
            if drop_old:
                for p in (data_dir / "index").glob("faiss.index*"):
                    p.unlink()
            click.echo(f"migrated {count} items of pool {tag} to Milvus collection {collection} at {uri}: "
                       f"{inserted} vectors inserted, {removed} removed, {count - inserted} already there "
                       f"({time.monotonic() - t0:.1f}s); start the retriever with T3AR_RETRIEVER_BACKEND=milvus")
        else:
            _to_faiss(data_dir, store, settings, dim, tag)
            if drop_old:
                try:
                    client = connect(uri, settings.milvus_token, settings.milvus_timeout)
                    if client.has_collection(collection):
                        client.drop_collection(collection)
                    client.close()
                    if local_file(uri):
                        release_local(uri)
                except MilvusUnavailableError as e:
                    raise click.ClickException(f"the faiss index is saved, but dropping the collection failed: "
                                               f"{e}") from e
            click.echo(f"migrated {count} items of pool {tag} to faiss ({time.monotonic() - t0:.1f}s); start "
                       "the retriever with T3AR_RETRIEVER_BACKEND=faiss (the default)")
    finally:
        store.close()


def _check(index: MilvusIndex, store: Store, n: int) -> None:
    seqs = store.all_seqs()
    if index.count != len(seqs):
        raise click.ClickException(f"after the copy Milvus holds {index.count} vectors, the database {len(seqs)}")
    if not len(seqs) or not n:
        return
    sample = np.sort(np.random.default_rng().choice(seqs, size=min(n, len(seqs)), replace=False))
    got = index.vectors(sample)
    want = np.stack([v for s in sample if (v := store.vector(int(s))) is not None])
    if got.shape != want.shape or not np.allclose(got, want, atol=1e-6):
        raise click.ClickException("vectors in Milvus differ from the database's; run the migration again")


def _to_faiss(data_dir: Path, store: object, settings: object, dim: int, tag: str) -> None:
    """Build the faiss index from the stored vectors and save it the way a clean shutdown does."""
    from t3ar_services.retriever.blobs import BlobStore
    from t3ar_services.retriever.index import IndexConfig
    from t3ar_services.retriever.pool import Pool, PoolInfo
    from t3ar_services.retriever.settings import RetrieverSettings
    from t3ar_services.retriever.startup import load_index, save_index
    from t3ar_services.retriever.store import Store

    assert isinstance(store, Store) and isinstance(settings, RetrieverSettings)
    meta = store.meta()
    cfg = IndexConfig(settings.index_type, settings.ivf_nlist, settings.ivf_nprobe, settings.search_threads)
    info = PoolInfo(data_dir=data_dir, identity=meta["identity"], dim=dim, kind=meta["kind"],  # type: ignore[arg-type]
                    tag=tag, index_config=cfg, duplicate_threshold=settings.duplicate_threshold)
    (data_dir / "index").mkdir(exist_ok=True)
    blobs = BlobStore(data_dir / "blobs")
    try:
        pool = Pool(info, store, blobs)
        load_index(pool)  # a saved index that matches is kept, anything else is rebuilt from the database
        save_index(pool)
    finally:
        blobs.close()
