"""Pool labels: which class name, if any, each pool image carries, and the rule a label obeys.

A pool item may carry a class label (a class name, not an index: the pool serves many models, and
:func:`t3ar.pipeline.pool_classes` maps a label to a model's class, a label that is not one of its classes being
unlabelled). Two ways to say which images carry which label, for ``t3ar pool ingest DIR --labels ...`` and
``t3ar adapt --pool DIR --pool-labels ...``:

- ``folders``: an image under ``DIR/<class>/`` (at any depth below it) carries ``<class>``; an image directly in
  ``DIR`` carries none;
- a CSV file: rows of ``path,label``, the path relative to ``DIR`` with ``/`` separators (an optional header row
  ``path,label``); an image whose path is not in the CSV, or whose label cell is empty, carries none. A row naming
  no image of ``DIR`` is counted (:attr:`PoolLabels.unmatched`), not an error, so one CSV can describe a superset.

The rule of a label (checked here before an upload, and by the retriever where it arrives): at most
:data:`MAX_LABEL_CHARS` characters, no control characters (C0, DEL, C1), no invisible or bidi formatting
characters (:func:`hidden_character`: format characters and the other code points that show as nothing), no
leading or trailing spaces, valid UTF-8 text. The empty string means no
label. Target labels (folder names, ``labels.csv``) and a model's class names obey the hidden-character part too:
``do<U+200B>g`` shows as ``dog`` and silently never matches the class.
"""

from __future__ import annotations

import csv
import io
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from t3ar.errors import DatasetError, InvalidInputError

MAX_LABEL_CHARS = 200
FOLDERS = "folders"
_HEADERS = ({"path", "label"}, {"file", "label"})


#: Unicode categories no label or class name may hold: format characters (Cf: bidi controls such as U+202E,
#: zero-width ones such as U+200B, U+FEFF, the soft hyphen) and line and paragraph separators (Zl, Zp)
HIDDEN_CATEGORIES = frozenset({"Cf", "Zl", "Zp"})

#: And the code points that show as nothing outside those categories (issue 50, N8): Unicode's other
#: Default_Ignorable_Code_Point characters (Hangul fillers, which are letters; the combining grapheme joiner,
#: variation selectors, Mongolian free variation selectors, Khmer inherent vowels: marks) and the blank braille
#: pattern (a symbol)
HIDDEN_SPANS: tuple[tuple[int, int], ...] = (
    (0x034F, 0x034F), (0x115F, 0x1160), (0x17B4, 0x17B5), (0x180B, 0x180F), (0x2800, 0x2800), (0x3164, 0x3164),
    (0xFE00, 0xFE0F), (0xFFA0, 0xFFA0), (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF))


def _hidden(ch: str) -> bool:
    code = ord(ch)
    return unicodedata.category(ch) in HIDDEN_CATEGORIES or any(a <= code <= b for a, b in HIDDEN_SPANS)


def hidden_character(text: str) -> str | None:
    """The first invisible or bidi formatting character of ``text`` as ``U+200B (ZERO WIDTH SPACE)``, or None."""
    for ch in text:
        if _hidden(ch):
            return f"U+{ord(ch):04X} ({unicodedata.name(ch, 'unnamed')})"
    return None


def hidden_ranges(last: int = 0xFFFF) -> str:
    """The :func:`hidden_character` code points up to ``last`` as the body of a regular-expression character class
    (``\\u00ad\\u0600-\\u0605...``; the Basic Multilingual Plane by default: ``\\uXXXX`` reads the same in
    Python's and ECMAScript's expressions)."""
    spans: list[list[int]] = []
    for code in range(last + 1):
        if _hidden(chr(code)):
            if spans and spans[-1][1] == code - 1:
                spans[-1][1] = code
            else:
                spans.append([code, code])
    return "".join(f"\\u{a:04x}" if a == b else f"\\u{a:04x}-\\u{b:04x}" for a, b in spans)


def hidden_problem(text: str, what: str) -> str | None:
    """A message refusing ``text`` (called ``what``) when it holds a :func:`hidden_character`, else None."""
    found = hidden_character(text)
    if found is None:
        return None
    return (f"{what} {ascii(text)} contains the invisible or formatting character {found}: it would show as another "
            "name and never match it; remove it")


def label_problem(label: str) -> str | None:
    """Why ``label`` cannot be a pool label, or None if it can (the empty string is no label: never a problem)."""
    hidden = hidden_problem(label, "label")
    if hidden is not None:
        return hidden
    if len(label) > MAX_LABEL_CHARS or any(ord(ch) < 32 or 127 <= ord(ch) < 160 for ch in label) \
            or label != label.strip():
        return (f"label must be at most {MAX_LABEL_CHARS} printable characters without leading or trailing spaces "
                "(a class name, e.g. 'dog'); leave it empty for no label")
    try:
        label.encode("utf-8")
    except UnicodeEncodeError:
        return "label contains a lone surrogate (\\ud800-\\udfff), which is not text: send valid UTF-8"
    return None


def check_label(label: str | None) -> str | None:
    """``label`` as a pool label (``""`` or None: no label), else :class:`InvalidInputError` naming the rule."""
    if not label:
        return None
    problem = label_problem(label)
    if problem is not None:
        raise InvalidInputError(problem)
    return label


def folder_label(rel_path: str) -> str | None:
    """The label ``folders`` gives the image at ``rel_path`` (relative to the pool folder, ``/`` separators)."""
    parts = PurePosixPath(rel_path).parts
    return parts[0] if len(parts) > 1 else None


@dataclass(frozen=True)
class PoolLabels:
    """The label of each image (aligned with the paths given), and the CSV rows that named no image."""

    labels: list[str | None]
    unmatched: list[str] = field(default_factory=list)

    @property
    def labelled(self) -> int:
        return sum(lab is not None for lab in self.labels)


def read_label_csv(path: Path) -> dict[str, str | None]:
    """``path,label`` rows of a CSV file -> {relative posix path: label or None}; DatasetError on a bad row."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise DatasetError(f"{path}: cannot read the labels CSV ({e}); it must be UTF-8 text") from e
    out: dict[str, str | None] = {}
    for n, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        if not row or all(not c.strip() for c in row):
            continue
        if n == 1 and {c.strip().lower() for c in row} in _HEADERS:
            continue
        if len(row) != 2:
            raise DatasetError(f"{path}, row {n}: expected two columns (path,label); got {len(row)}")
        rel, label = _normal(row[0]), row[1].strip()
        problem = label_problem(label)
        if problem is not None:
            raise DatasetError(f"{path}, row {n}: {problem}")
        if not rel:
            raise DatasetError(f"{path}, row {n}: the path is empty")
        if rel in out and out[rel] != (label or None):
            raise DatasetError(f"{path}, row {n}: {rel} is given two labels ({out[rel]!r} and {label!r})")
        out[rel] = label or None
    return out


def _normal(rel: str) -> str:
    """A CSV path as an image's relative path is written (``/`` separators, no ``./``)."""
    return PurePosixPath(rel.strip().replace("\\", "/")).as_posix().lstrip("/") if rel.strip() else ""


def resolve_pool_labels(rel_paths: Sequence[str], spec: str) -> PoolLabels:
    """The labels of the images at ``rel_paths`` (relative to the pool folder) under ``spec``: ``folders`` or the
    path of a labels CSV (see the module docstring)."""
    if spec == FOLDERS:
        labels = [folder_label(r) for r in rel_paths]
        for r, lab in zip(rel_paths, labels, strict=True):
            if lab is not None and label_problem(lab) is not None:
                raise DatasetError(f"{r}: the folder name {lab!r} cannot be a label: {label_problem(lab)}")
        return PoolLabels(labels)
    csv_path = Path(spec)
    if not csv_path.is_file():
        raise DatasetError(f"--labels {spec}: give 'folders' or the path of a CSV file (path,label rows)")
    table = read_label_csv(csv_path)
    wanted = set(rel_paths)
    return PoolLabels([table.get(r) for r in rel_paths], sorted(r for r in table if r not in wanted))
