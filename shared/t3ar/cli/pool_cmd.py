"""``t3ar pool``: manage the auxiliary pool held by a retriever service over HTTP."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import click
from pydantic import BaseModel, Field

from t3ar.cli.common import echo_result, service_options
from t3ar.cli.json_arg import json_object
from t3ar.clients.retriever import RetrieverClient
from t3ar.clients.retriever_errors import RetrieverInputError
from t3ar.clients.retriever_models import AddItemResult, AddResponse
from t3ar.data.pool_labels import PoolLabels, resolve_pool_labels
from t3ar.errors import T3arError

F = TypeVar("F", bound=Callable[..., Any])
DEFAULT_URL = "http://127.0.0.1:8701"


def _common() -> Callable[[F], F]:
    return service_options("Retriever", "T3AR_RETRIEVER_URL", DEFAULT_URL, ("T3AR_TOKEN",))


@click.group("pool")
def pool() -> None:
    """Manage the auxiliary pool held by a retriever service.

    Pool items leave through the API only: ``t3ar withdraw POOL_ID`` (admin) records the withdrawal, answers
    which jobs used the item and tells the workers' caches. The retriever's own delete route serves the API.
    """


def _image_files(root: Path) -> list[Path]:
    from t3ar.data.images import is_image_name

    return sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink() and is_image_name(p.name)
                  and not any(part.startswith(".") or part == "__MACOSX" for part in p.relative_to(root).parts))


def _label_batches(items: list[Path], label_of: dict[Path, str | None], size: int) -> Iterator[list[Path]]:
    """Batches of at most ``size`` files in file order, each of one label (a request carries one label): a new
    batch starts where the label changes."""
    batch: list[Path] = []
    for f in items:
        if batch and (len(batch) == size or label_of[batch[0]] != label_of[f]):
            yield batch
            batch = []
        batch.append(f)
    if batch:
        yield batch


@pool.command("ingest")
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option("--source", default="", help="Source tag stored with every item.")
@click.option("--metadata", default="{}", help="JSON object stored with every item.")
@click.option("--labels", "labels_spec", default=None, metavar="folders|FILE.csv",
              help="Class labels: 'folders' (an image under PATH/<class>/ carries <class>, a loose image none) or a "
                   "CSV of path,label rows (paths relative to PATH; an image not in it carries none).")
@click.option("--batch-size", default=64, show_default=True, type=click.IntRange(1, 1000))
@click.option("--in-flight", default=2, show_default=True, type=click.IntRange(1, 8),
              help="Upload requests in flight at once. 1 commits the batches in file order, so the pool's content "
                   "does not depend on timing (near-duplicate skipping keeps whichever copy is committed first).")
@_common()
def ingest(path: Path, source: str, metadata: str, labels_spec: str | None, batch_size: int, in_flight: int, url: str,
           token: str | None, as_json: bool) -> None:
    """Add every image under PATH (a folder, a zip/tar archive, or one image) to the pool.

    Resumable: files whose sha256 is already in the pool are skipped before upload, so re-running after an
    interruption only sends what is missing. Unreadable images are reported and skipped. With more than one
    request in flight (the default, faster) the retriever may commit two batches in either order; with
    near-duplicate skipping on, which of two near-identical images is kept then varies from run to run:
    use ``--in-flight 1`` for a reproducible pool.

    Labels (``--labels``) are stored with the items added by this run; an image already in the pool keeps the
    label it has (an ingest never relabels). For an archive, paths are relative to the extracted archive.

    \b
    Example:
      t3ar pool ingest data/clipart.tar.gz --source openclipart --url http://127.0.0.1:8701
      t3ar pool ingest data/emoji-archive --labels folders --source emoji-archive
    """
    from tqdm import tqdm

    from t3ar.data.archive import archive_kind, safe_extract

    meta = json_object(metadata, "--metadata")
    tmp: Path | None = None
    try:
        if path.is_dir():
            files = _image_files(path)
        elif archive_kind(path) is not None:
            tmp = Path(tempfile.mkdtemp(prefix="t3ar-ingest-"))
            files = _image_files(safe_extract(path, tmp / "x"))
        else:
            files = [path]
        if not files:
            raise click.ClickException(f"{path}: no image files (.png/.jpg/.webp/...) found")
        root = path if path.is_dir() else (tmp / "x" if tmp is not None else None)
        rels = [f.relative_to(root).as_posix() if root is not None else f.name for f in files]
        try:
            resolved = resolve_pool_labels(rels, labels_spec) if labels_spec else PoolLabels([None] * len(files))
        except T3arError as e:
            raise click.BadParameter(str(e), param_hint="--labels") from e
        label_of = dict(zip(files, resolved.labels, strict=True))
        with RetrieverClient(url, token) as client:
            shas = {f: hashlib.sha256(f.read_bytes()).hexdigest() for f in files}
            present = client.exists(list(shas.values()))
            todo = [f for f in files if shas[f] not in present]
            summary = IngestSummary(files=len(files), skipped_existing=len(files) - len(todo),
                                    labelled=sum(label_of[f] is not None for f in todo),
                                    csv_rows_unmatched=len(resolved.unmatched))
            with tqdm(total=len(files), initial=len(files) - len(todo), unit="img", desc="ingest",
                      disable=None) as bar, ThreadPoolExecutor(max_workers=in_flight) as ex:
                def send(batch: list[Path]) -> AddResponse:
                    try:
                        return client.add_images([(str(f.relative_to(path) if path.is_dir() else f.name),
                                                   f.read_bytes()) for f in batch], source=source, metadata=meta,
                                                 label=label_of[batch[0]])
                    except RetrieverInputError as e:
                        if not e.items:
                            raise
                        return AddResponse(items=e.items, added=0, exists=0, duplicates=0, rejected=len(e.items))

                pending: list[tuple[Future[AddResponse], int]] = []
                try:
                    for batch in _label_batches(todo, label_of, batch_size):
                        pending.append((ex.submit(send, batch), len(batch)))
                        if len(pending) >= in_flight:  # >1 in flight: upload/decode overlaps embedding
                            _collect(pending.pop(0), summary, bar)
                    while pending:
                        _collect(pending.pop(0), summary, bar)
                except T3arError as e:
                    raise click.ClickException(f"{e}\n{summary.added} item(s) were added before this; re-run "
                                               "the same command to resume (items already in are skipped)") from e
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    text = (f"{summary.files} files: {summary.added} added, {summary.skipped_existing} already in the "
            f"pool, {summary.exists} exact repeats, {summary.duplicates} near-duplicates skipped, "
            f"{summary.rejected} rejected")
    if labels_spec:
        text += f"; {summary.labelled} of the uploaded images carried a label"
        if resolved.unmatched:
            text += f" ({len(resolved.unmatched)} CSV row(s) named no image, e.g. {resolved.unmatched[0]})"
    for item in summary.rejected_items[:20]:
        text += f"\n  rejected {item.name}: {item.error.message if item.error else ''}"
    echo_result(as_json, summary.model_dump(mode="json"), text)


class IngestSummary(BaseModel):
    """What ``t3ar pool ingest`` did (its ``--json`` output): files found, skipped as already in the pool, and the
    retriever's counts over the batches it sent."""

    files: int
    skipped_existing: int
    added: int = 0
    exists: int = 0
    duplicates: int = 0
    rejected: int = 0
    rejected_items: list[AddItemResult] = Field(default_factory=list)
    labelled: int
    csv_rows_unmatched: int


def _collect(entry: tuple[Future[AddResponse], int], summary: IngestSummary, bar: Any) -> None:
    fut, n = entry
    res = fut.result()
    summary.added += res.added
    summary.exists += res.exists
    summary.duplicates += res.duplicates
    summary.rejected += res.rejected
    summary.rejected_items += [i for i in res.items if i.status == "rejected"]
    bar.update(n)


@pool.command("search")
@click.argument("image", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--k", "k", default=10, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--r", "r", default=1, show_default=True, type=click.IntRange(1, 100),
              help="Dedup: sample k of the top r*k.")
@click.option("--source", default=None, help="Only items with this source tag.")
@_common()
def search(image: Path, k: int, r: int, source: str | None, url: str, token: str | None, as_json: bool) -> None:
    """Nearest pool items to IMAGE (embedded by the retriever with the pool's embedder)."""
    with RetrieverClient(url, token) as client:
        res = client.search_images([image], k, r=r, source=source)
    hits = list(zip(res.ids[0], res.scores[0], res.labels[0], strict=True))
    text = "\n".join(f"{score:.4f}  {pid}" + (f"  {label}" if label else "")
                     for pid, score, label in hits) or "(the pool is empty)"
    echo_result(as_json, {"identity": res.identity,
                          "results": [{"id": pid, "score": score, "label": label} for pid, score, label in hits]}, text)


@pool.command("stats")
@_common()
def stats(url: str, token: str | None, as_json: bool) -> None:
    """Pool size, embedder identity, index type and sources."""
    with RetrieverClient(url, token) as client:
        st = client.stats()
    idx = st.index
    lines = [f"items:      {st.count}", f"dim:        {st.dim}", f"embedder:   {st.identity}",
             f"index:      {idx.type} ({idx.vectors} vectors, {idx.tombstones} tombstones)",
             f"duplicates: {st.duplicate_policy} at cosine >= {st.duplicate_threshold}",
             "sources:    " + (", ".join(f"{k or '(none)'}={v}" for k, v in st.sources.items()) or "-"),
             "labels:     " + (", ".join(f"{k}={v}" for k, v in st.labels.items()) or "-")]
    echo_result(as_json, st, "\n".join(lines))
