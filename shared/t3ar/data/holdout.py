"""A job's acceptance holdout: a small labelled set of the target's own images, never trained on, that decides
which candidate model the job returns (:mod:`t3ar.acceptance`).

Layouts (:func:`read_holdout`): class folders ``<root>/<class>/<image>``, a CSV of ``path,label`` (paths relative
to the CSV's folder), a folder with ``labels.csv`` at its root (what an archive uploaded to the API holds), or a
zip/tar of class folders. Every image must decode (a holdout is small: a bad file is an error, not a skip).

The checks (:func:`check_holdout`), each an :class:`~t3ar.errors.InvalidInputError` (a 4xx at the API):

- every label is one of the model's classes;
- every class the holdout names has at least one image (a class folder with no image in it is refused; a CSV names
  a class only through a row, so its classes always have one);
- no holdout image is an image of the target (the same bytes, by sha256; with ``target_pixels``, also the same
  pixels in other bytes, by :func:`~t3ar.data.images.pixel_digest`): the holdout must never be trained on, and the
  target is what a job adapts to and may add to the pool;
- at most ``max_images`` images (:data:`MAX_HOLDOUT_IMAGES` by default; the API's ``T3AR_API_MAX_HOLDOUT_IMAGES``).

And, for a job where a candidate retrieves, :func:`refuse_pooled`: no holdout image is already a pool image (a
retrieval candidate could draw it as a neighbour).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from t3ar.data.datasets import ImageSet, class_map_check, find_labels_csv, read_labelled
from t3ar.digest import file_sha256
from t3ar.errors import DatasetError, InvalidInputError

#: the largest holdout a job takes by default (every candidate is evaluated on all of it)
MAX_HOLDOUT_IMAGES = 2000


class HoldoutError(InvalidInputError):
    """A holdout that cannot decide a job's acceptance: unknown labels, an empty class, overlap with the target,
    too large, or unreadable."""


@dataclass(frozen=True)
class Holdout:
    """The holdout's images (labelled) and the classes it names (folders or CSV labels, with images or not)."""

    images: ImageSet
    named: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.images)


def _named_folders(root: Path) -> list[str]:
    return sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith((".", "__")))


def read_holdout(source: Path, *, num_workers: int = 0) -> Holdout:
    """Read a holdout in any of the layouts of the module docstring (every image must decode)."""
    from t3ar.data.target import read_target

    source = Path(source)
    try:
        if source.is_dir() and find_labels_csv(source) is not None:
            images = read_target(source, strict=True, num_workers=num_workers)
        else:
            images = read_labelled(source, strict=True, num_workers=num_workers)
    except DatasetError as e:
        raise HoldoutError(f"holdout: {e}") from e
    if images.labels is None or images.classes is None:
        raise HoldoutError("holdout: it has no labels; give class folders, a CSV of path,label, or labels.csv")
    is_csv = source.is_file() and source.suffix.lower() == ".csv"
    if is_csv or images.root is None or find_labels_csv(images.root) is not None:
        named: Sequence[str] = images.classes  # a CSV names a class only through a row of it
    else:
        named = _named_folders(images.root)
    return Holdout(images, tuple(named))


def image_digests(images: ImageSet) -> list[str]:
    """The sha256 of each image file's bytes, in the set's order."""
    return [file_sha256(p) for p in images.paths]


def too_many(count: int, max_images: int, setting: str) -> HoldoutError | None:
    """The refusal of a holdout of ``count`` images over ``max_images`` (None: within it)."""
    if count <= max_images:
        return None
    return HoldoutError(f"holdout: {count} images, more than the {max_images} allowed ({setting}); send a smaller "
                        "one (a few images per class decide between candidates)")


def count_listed(files: Iterable[tuple[str, int]], max_images: int, setting: str = "max_images") -> None:
    """Refuse an archive listing (relative path, declared size) with more image files than ``max_images``: checked
    from the archive's headers, before any image is extracted or decoded (a holdout at the upload limit took
    ~2,000 s of decoding before the cap was checked)."""
    from t3ar.data.images import is_image_name

    error = too_many(sum(1 for rel, _ in files if is_image_name(rel)), max_images, setting)
    if error is not None:
        raise error


def pixel_digests(paths: Sequence[Path], *, num_workers: int = 0) -> list[str]:
    """The pixel digest (:func:`~t3ar.data.images.file_pixel_digest`) of each image file, in order; files that do
    not decode get an empty digest (they are refused elsewhere)."""
    from t3ar.data.images import file_pixel_digest
    from t3ar.errors import ImageDecodeError

    def one(p: Path) -> str:
        try:
            return file_pixel_digest(p)
        except (ImageDecodeError, OSError):
            return ""

    if num_workers > 1 and len(paths) > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(num_workers) as ex:
            return list(ex.map(one, paths))
    return [one(p) for p in paths]


def check_holdout(holdout: Holdout, model_classes: Sequence[str], *, target_digests: Iterable[str],
                  max_images: int = MAX_HOLDOUT_IMAGES, setting: str = "max_images",
                  target_pixels: Iterable[str] | None = None) -> None:
    """Refuse (HoldoutError) a holdout that breaks a rule of the module docstring; ``setting`` names the limit
    ``max_images`` comes from in the message."""
    images = holdout.images
    if len(images) == 0:
        raise HoldoutError("holdout: no images")
    if (error := too_many(len(images), max_images, setting)) is not None:
        raise error
    assert images.classes is not None and images.labels is not None
    try:
        class_map_check(list(holdout.named), list(model_classes))
    except DatasetError as e:
        raise HoldoutError(f"holdout: {e}") from e
    present = {images.classes[y] for y in images.labels}
    empty = [c for c in holdout.named if c not in present]
    if empty:
        raise HoldoutError(f"holdout: class(es) {', '.join(empty[:10])} have no image; every class the holdout names "
                           "needs at least one image (add one, or drop the empty folder)")
    target = set(target_digests)
    same = [images.ids[i] for i, d in enumerate(image_digests(images)) if d in target]
    how = "the same bytes"
    if not same and target_pixels is not None:
        pixels = set(target_pixels) - {""}
        same = [images.ids[i] for i, d in enumerate(pixel_digests(list(images.paths))) if d and d in pixels]
        how = "the same pixels in other bytes"
    if same:
        raise HoldoutError(f"holdout: {len(same)} image(s) are also in the target ({how}; first: "
                           f"{', '.join(same[:5])}); the holdout must never be trained on: take them out of one")


def refuse_pooled(digests: dict[str, str], in_pool: dict[str, str]) -> None:
    """Refuse a holdout with images already in the pool. ``digests``: holdout id -> sha256 of its bytes; ``in_pool``:
    sha256 -> pool id, for those the pool holds (a retrieval candidate could draw them as neighbours, so they
    would be trained on)."""
    same = [(hid, in_pool[sha]) for hid, sha in digests.items() if sha in in_pool]
    if same:
        shown = ", ".join(f"{hid} (pool item {pid})" for hid, pid in same[:5])
        raise HoldoutError(f"holdout: {len(same)} image(s) are already in the pool (the same bytes; first: {shown}); a "
                           "retrieval candidate could draw them as neighbours: take them out of the holdout, or "
                           "withdraw them from the pool")
