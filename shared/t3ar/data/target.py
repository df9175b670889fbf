"""A target folder (an extracted upload): every image under it, labelled by ``labels.csv`` when one sits at its
root, whose paths must stay inside the folder.

The adaptation API reads an upload with this to validate it before enqueueing; the worker reads the same folder
again, so both see the same images with the same ids. Imports torch (via :mod:`t3ar.data.datasets`): a process
that must stay torch-free (the worker parent) never imports it.
"""

from __future__ import annotations

import csv
from pathlib import Path, PurePosixPath

from t3ar.data.datasets import ImageSet, find_labels_csv, read_labelled, read_unlabelled
from t3ar.errors import DatasetError


def _check_csv_paths(csv_path: Path, limit: int = 20) -> None:
    """labels.csv is untrusted: its paths must stay inside the archive (relative, no '..')."""
    bad: list[str] = []
    with open(csv_path, newline="", encoding="utf-8-sig") as fh:
        reader = csv.DictReader(fh)
        header = [h.strip().lower() for h in reader.fieldnames or []]
        if "path" not in header or "label" not in header:
            raise DatasetError(f"labels.csv: the header must be 'path,label' (found {header})")
        reader.fieldnames = header
        for row in reader:
            rel = (row.get("path") or "").strip().replace("\\", "/")
            p = PurePosixPath(rel)
            if rel and (p.is_absolute() or ".." in p.parts or ":" in p.parts[0]):
                bad.append(rel)
                if len(bad) >= limit:
                    break
    if bad:
        raise DatasetError(f"labels.csv: paths must be relative to the archive root without '..'; "
                           f"offending: {', '.join(bad[:5])}")


def read_target(root: Path, *, strict: bool = True, num_workers: int = 0) -> ImageSet:
    """All images under ``root``; labels from ``<root>/labels.csv`` (``path,label``) when present.

    With labels, every image must have exactly one row and every row must name an image of the archive
    (DatasetError otherwise). ``strict``: an unreadable or non-image file is an error (ImageDecodeError)
    instead of being skipped.
    """
    images = read_unlabelled(root, strict=strict, num_workers=num_workers)
    assert images.root is not None
    labels_csv = find_labels_csv(images.root)
    if labels_csv is None:
        return images
    _check_csv_paths(labels_csv)
    labelled = read_labelled(labels_csv, strict=True, num_workers=num_workers)
    unlabelled_ids = set(images.ids)
    missing = sorted(unlabelled_ids - set(labelled.ids))
    if missing:
        raise DatasetError(f"labels.csv has no row for {len(missing)} image(s) (first: {', '.join(missing[:5])}); "
                           "label every image or drop labels.csv for test-time (unlabelled) adaptation")
    extra = sorted(set(labelled.ids) - unlabelled_ids)
    if extra:
        raise DatasetError(f"labels.csv names {len(extra)} file(s) that are not usable images of the archive "
                           f"(first: {', '.join(extra[:5])})")
    return labelled
