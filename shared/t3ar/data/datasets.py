"""Reading image datasets (labelled or not) from folders, archives or CSV manifests into :class:`ImageSet`.

Layouts accepted by :func:`read_labelled`:
- an ImageFolder directory ``<root>/<class>/<image>`` (images may sit deeper inside a class folder); wrapper
  directories around it (``<root>/<only-dir>/<class>/<image>``, common in archives) are descended;
- a ``.zip`` / ``.tar`` / ``.tar.gz`` / ``.tar.bz2`` / ``.tar.xz`` of such a folder, extracted with
  :func:`~t3ar.data.archive.safe_extract` into a new directory under ``work_dir`` (kept: the caller owns
  it) or, when ``work_dir`` is None, into a private temporary directory removed when the process exits
  (the returned paths stay valid for the life of the process);
- a CSV manifest with header ``path,label`` (paths relative to the CSV's folder, or absolute).

Every image is decoded once while reading (``Image.verify`` misses truncated data); unreadable files are
skipped, listed in ``ImageSet.skipped`` and summarised in one warning, or raise under ``strict=True``.
Ids are POSIX paths relative to the dataset root: stable across machines and re-extractions.
"""

from __future__ import annotations

import csv
import logging
import tempfile
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from t3ar.data.archive import ExtractLimits, archive_kind, safe_extract
from t3ar.data.images import is_image_name, open_image, to_tensor_uint8
from t3ar.data.pool_labels import hidden_problem
from t3ar.data.sampling import adapted_rows, class_map_check, stratified_subsample
from t3ar.errors import DatasetError, ImageDecodeError

__all__ = [
    "ImageSet",
    "adapted_rows",
    "class_map_check",
    "find_labels_csv",
    "load_tensors",
    "read_labelled",
    "read_unlabelled",
    "stratified_subsample",
]

logger = logging.getLogger(__name__)

LABELS_CSV = "labels.csv"
_LABELLED_LAYOUT = (
    "expected an ImageFolder directory <root>/<class>/<image> (PNG/JPEG/WebP/...), a .zip/.tar.gz of one, "
    "or a CSV file with header 'path,label'"
)
_UNLABELLED_LAYOUT = "expected a directory (searched recursively) or a .zip/.tar.gz of PNG/JPEG/WebP images"
_DEFAULT_LIMITS = ExtractLimits()


@dataclass
class ImageSet:
    """Image paths with stable ids and optional integer labels indexing ``classes``.

    ``skipped`` lists ``(id, reason)`` for files that were not usable; ``root`` is the dataset root the ids
    are relative to (None for sets built by hand).
    """

    paths: list[Path]
    ids: list[str]
    labels: list[int] | None = None
    classes: list[str] | None = None
    skipped: list[tuple[str, str]] = field(default_factory=list)
    root: Path | None = None

    @property
    def labelled(self) -> bool:
        return self.labels is not None

    def __len__(self) -> int:
        return len(self.paths)

    def subset(self, indices: Sequence[int]) -> ImageSet:
        """A new set of the given items in the given order; ``classes``, ``skipped``, ``root`` are kept."""
        idx = list(indices)
        labels = None if self.labels is None else [self.labels[i] for i in idx]
        return replace(
            self,
            paths=[self.paths[i] for i in idx],
            ids=[self.ids[i] for i in idx],
            labels=labels,
            classes=None if self.classes is None else list(self.classes),
            skipped=list(self.skipped),
        )


_Item = tuple[Path, str, str | None]  # (path, id, class name or None)
# TemporaryDirectory objects clean up when collected or at interpreter exit; holding them here keeps
# extracted archives alive for the life of the process.
_process_tmp: list[tempfile.TemporaryDirectory[str]] = []


def _scratch_dir(work_dir: Path | None) -> Path:
    """A fresh directory under ``work_dir``, or a temporary one deleted at process exit."""
    if work_dir is not None:
        work_dir.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix="t3ar-data-", dir=work_dir))
    _process_tmp.append(tempfile.TemporaryDirectory(prefix="t3ar-data-"))
    return Path(_process_tmp[-1].name)


def _visible(path: Path) -> bool:
    name = path.name
    return not (name.startswith(".") or name == "__MACOSX" or name == "Thumbs.db")


def _listdir(path: Path) -> tuple[list[Path], list[Path]]:
    """(visible subdirectories, visible files) of ``path``, sorted by name."""
    entries = sorted((p for p in path.iterdir() if _visible(p)), key=lambda p: p.name)
    return [p for p in entries if p.is_dir()], [p for p in entries if p.is_file()]


def _walk_files(root: Path) -> list[Path]:
    """Visible regular files under ``root`` (recursive, symlinks not followed), sorted by relative path."""
    out = [
        p
        for p in root.rglob("*")
        if p.is_file() and not p.is_symlink() and all(_visible(Path(q)) for q in p.relative_to(root).parts)
    ]
    return sorted(out, key=lambda p: p.relative_to(root).as_posix())


def _unwrap(root: Path, *, labelled: bool) -> Path:
    """Descend through wrapper directories: a lone subdirectory next to no files (labelled: no images)."""
    for _ in range(8):
        dirs, files = _listdir(root)
        loose = [f for f in files if is_image_name(f.name)] if labelled else files
        if len(dirs) != 1 or loose:
            return root
        inner_dirs, inner_files = _listdir(dirs[0])
        # a single-class ImageFolder (<root>/<class>/<images>) must not be unwrapped
        if labelled and (not inner_dirs or any(is_image_name(f.name) for f in inner_files)):
            return root
        root = dirs[0]
    return root


def _materialise(source: Path, work_dir: Path | None, limits: ExtractLimits) -> Path | None:
    """Extract an archive source and return its directory; None when ``source`` is not an archive."""
    if source.is_file() and archive_kind(source) is not None:
        return safe_extract(source, _scratch_dir(work_dir) / "data", limits)
    return None


def _check(paths: Sequence[Path], num_workers: int) -> list[str | None]:
    """Decode every file; None if readable, else the ImageDecodeError message."""

    def one(path: Path) -> str | None:
        if not is_image_name(path.name):
            kind = path.suffix or "no suffix"
            return f"{path}: not an image file type ({kind}); remove it or convert it to PNG/JPEG"
        try:
            open_image(path)
        except ImageDecodeError as e:
            return str(e)
        return None

    if num_workers > 0 and len(paths) > 1:
        with ThreadPoolExecutor(num_workers) as pool:
            return list(pool.map(one, paths))
    return [one(p) for p in paths]


def _keep_readable(
    items: list[_Item], strict: bool, num_workers: int, skipped: list[tuple[str, str]]
) -> list[_Item]:
    """Filter (path, id, label) items to readable images; record or raise for the rest."""
    problems = _check([p for p, _, _ in items], num_workers)
    kept = []
    for item, problem in zip(items, problems, strict=True):
        if problem is None:
            kept.append(item)
        elif strict:
            raise ImageDecodeError(problem)
        else:
            skipped.append((item[1], problem))
    return kept


def _finish(
    items: list[_Item],
    skipped: list[tuple[str, str]],
    root: Path,
    source: Path,
    layout: str,
) -> ImageSet:
    if skipped:
        logger.warning(
            "%s: skipped %d unreadable or non-image file(s) of %d (first: %s); see ImageSet.skipped",
            source, len(skipped), len(skipped) + len(items), skipped[0][0],
        )
    if not items:
        raise DatasetError(f"{source}: no readable images found; {layout}")
    if items[0][2] is None:
        return ImageSet([p for p, _, _ in items], [i for _, i, _ in items], None, None, skipped, root)
    classes = sorted({lab for _, _, lab in items if lab is not None})
    for name in classes:
        problem = hidden_problem(name, "the class")
        if problem is not None:
            raise DatasetError(f"{source}: {problem}")
    index = {c: k for k, c in enumerate(classes)}
    labels = [index[lab] for _, _, lab in items if lab is not None]
    return ImageSet([p for p, _, _ in items], [i for _, i, _ in items], labels, classes, skipped, root)


def _read_csv(csv_path: Path, strict: bool) -> tuple[list[_Item], list[tuple[str, str]]]:
    base = csv_path.parent
    items: list[_Item] = []
    skipped: list[tuple[str, str]] = []
    seen: set[str] = set()
    with open(csv_path, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        header = [h.strip().lower() for h in reader.fieldnames or []]
        if "path" not in header or "label" not in header:
            raise DatasetError(
                f"{csv_path}: CSV header must contain 'path,label' (found {header}); {_LABELLED_LAYOUT}"
            )
        reader.fieldnames = header
        for row in reader:
            line = reader.line_num
            rel, label = (row.get("path") or "").strip(), (row.get("label") or "").strip()
            problem = None
            path = Path(rel) if Path(rel).is_absolute() else base / rel
            if not rel or not label:
                problem = f"row {line}: empty path or label"
            elif not path.is_file():
                problem = f"row {line}: file not found: {rel}"
            elif rel in seen:
                problem = f"row {line}: duplicate path {rel}"
            if problem is not None:
                if strict:
                    raise DatasetError(f"{csv_path}: {problem}; fix the manifest or use non-strict reading")
                skipped.append((rel or f"row {line}", problem))
                continue
            seen.add(rel)
            rel_id = path.relative_to(base).as_posix() if path.is_relative_to(base) else path.as_posix()
            items.append((path, rel_id, label))
    return items, skipped


def _open_root(source: Path, work_dir: Path | None, limits: ExtractLimits, *, labelled: bool) -> Path:
    """The folder a set's images are read from: ``source`` itself, or the archive it names safely extracted, with a
    lone wrapper folder descended. DatasetError when it does not exist or is another kind of file."""
    layout = _LABELLED_LAYOUT if labelled else _UNLABELLED_LAYOUT
    if not source.exists():
        raise DatasetError(f"{source}: does not exist; {layout}")
    extracted = _materialise(source, work_dir, limits)
    if source.is_file() and extracted is None:
        kinds = "a directory, archive or CSV" if labelled else "a directory or an archive"
        raise DatasetError(f"{source}: not {kinds}; {layout}")
    return _unwrap(extracted or source, labelled=labelled)


def read_labelled(source: Path, *, strict: bool = False, work_dir: Path | None = None,
                  limits: ExtractLimits = _DEFAULT_LIMITS, num_workers: int = 0) -> ImageSet:
    """Read a labelled set (see the module docstring for layouts); classes sorted alphabetically.

    Classes with no readable image do not appear in ``classes``. Raises DatasetError when nothing usable is
    found, ImageDecodeError (strict) for the first unreadable file, UnsafeArchiveError for a bad archive.
    """
    source = Path(source)
    skipped: list[tuple[str, str]] = []
    if source.is_file() and source.suffix.lower() == ".csv":
        items, skipped = _read_csv(source, strict)
        root = source.parent
    else:
        root = _open_root(source, work_dir, limits, labelled=True)
        class_dirs, loose = _listdir(root)
        for f in loose:
            if is_image_name(f.name):
                if strict:
                    raise DatasetError(f"{f}: image outside any class folder; {_LABELLED_LAYOUT}")
                skipped.append((f.name, "image outside any class folder"))
        items = []
        for class_dir in class_dirs:
            for path in _walk_files(class_dir):
                items.append((path, path.relative_to(root).as_posix(), class_dir.name))
    items = _keep_readable(items, strict, num_workers, skipped)
    return _finish(items, skipped, root, source, _LABELLED_LAYOUT)


def find_labels_csv(root: Path) -> Path | None:
    """``<root>/labels.csv`` (columns ``path,label``) if present: labels shipped with unlabelled data."""
    candidate = Path(root) / LABELS_CSV
    return candidate if candidate.is_file() else None


def target_labels_csv(folder: Path) -> Path | None:
    """The ``labels.csv`` that :func:`read_unlabelled`'s ``.root`` of the folder ``folder`` has (a lone wrapper
    folder descended), or None: whether a target is labelled, known before any of its images is read."""
    return find_labels_csv(_unwrap(Path(folder), labelled=False))


def read_unlabelled(source: Path, *, strict: bool = False, work_dir: Path | None = None,
                    limits: ExtractLimits = _DEFAULT_LIMITS, num_workers: int = 0) -> ImageSet:
    """Read every image under a directory (recursively) or inside an archive; ``labels`` is None.

    A lone wrapper directory is descended so ids do not depend on how the archive was made. A root
    ``labels.csv`` is never applied (and not reported as skipped): use :func:`find_labels_csv` on ``.root``.
    """
    source = Path(source)
    root = _open_root(source, work_dir, limits, labelled=False)
    labels_csv = find_labels_csv(root)
    items: list[_Item] = [
        (p, p.relative_to(root).as_posix(), None) for p in _walk_files(root) if p != labels_csv
    ]
    skipped: list[tuple[str, str]] = []
    items = _keep_readable(items, strict, num_workers, skipped)
    return _finish(items, skipped, root, source, _UNLABELLED_LAYOUT)


def load_tensors(
    imageset: ImageSet, size: int, *, num_workers: int = 0, progress: bool = False
) -> torch.Tensor:
    """``uint8`` tensor ``[N, 3, size, size]`` in ``imageset`` order (each image decoded once).

    Uses ``num_workers`` threads when > 0 (Pillow releases the GIL while decoding). Raises ImageDecodeError
    if a file became unreadable since the set was read.
    """
    out = torch.empty((len(imageset), 3, size, size), dtype=torch.uint8)

    def one(i: int) -> None:
        out[i] = to_tensor_uint8(open_image(imageset.paths[i]), size)

    def run(results: Iterable[None]) -> None:
        if progress:
            from tqdm import tqdm

            results = tqdm(results, total=len(imageset), desc="decoding images", unit="img")
        for _ in results:
            pass

    if num_workers > 0 and len(imageset) > 1:
        with ThreadPoolExecutor(num_workers) as pool:
            run(pool.map(one, range(len(imageset))))
    else:
        run(map(one, range(len(imageset))))
    return out
