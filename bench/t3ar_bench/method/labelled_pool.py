"""The benchmark's labelled pool: which labelled styles a shift's pool holds, and which of them its arms used.

Pure functions (no I/O, no torch). Pool ids are ``<component>/<file stem>`` (:class:`~t3ar_bench.method.data.
Component`), and a labelled component is named after its style, so an id's style is the part before its first
``/``. A style's *artwork family* (:func:`t3ar.datakit.archive.family_of`) says which styles are the same artwork:
a target's family never enters that target's pool.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from t3ar.datakit.archive import family_of
from t3ar_bench.method.protocol import SOURCE_STYLE

#: the archive styles the benchmark's labelled pool draws on: every archive style but those whose artwork is
#: already a kit style of the pool (``twemoji`` = twitter, ``openmoji-iconify`` = openmoji, ``fluent-emoji-flat``
#: = fluentflat, the flat rendering of fluent3d's designs) and the older Noto copy; ``noto`` (the source's family)
#: is listed but :func:`pool_names` leaves it out unless asked
ARCHIVE_POOL_STYLES: tuple[str, ...] = ("noto", "noto-v1", "emojione", "emojione-monotone", "emojione-v1", "fxemoji",
                                        "streamline-emojis", "fluent-emoji", "fluent-emoji-high-contrast")


def excluded_families(shift: str, source: str = SOURCE_STYLE, *, exclude_source_family: bool = True) -> set[str]:
    """The artwork families kept out of ``shift``'s pool: the target's own, and the source's unless told not to
    (today's pools hold no source-style emoji: the source model was trained on them)."""
    out = {family_of(shift)}
    if exclude_source_family:
        out.add(family_of(source))
    return out


def pool_names(shift: str, unlabelled: Sequence[str], kit_styles: Sequence[str], archive_styles: Sequence[str],
               source: str = SOURCE_STYLE, *, exclude_source_family: bool = True) -> list[str]:
    """The component names of ``shift``'s pool, in order: the unlabelled sources (clipart) as given, then the kit
    and archive styles whose family is not excluded (:func:`excluded_families`).

    Unlike the pools before the archive, a kit style of the target's family is left out too (the openmoji
    target's pool loses openmoji-black and vice versa: the same artwork in line art).
    """
    gone = excluded_families(shift, source, exclude_source_family=exclude_source_family)
    labelled = [s for s in dict.fromkeys([*kit_styles, *archive_styles]) if s != shift and family_of(s) not in gone]
    return [*unlabelled, *labelled]


def style_of(pool_id: str) -> str:
    """The component (style) of a pool id ``<component>/<stem>``."""
    return pool_id.split("/", 1)[0]


def pool_style_shares(pool_ids: Iterable[str], labels: Mapping[str, Any]) -> dict[str, float]:
    """Share of each style among the *labelled* items of a pool (``labels``: pool id -> label, e.g. the side
    table); empty when none is labelled. Says how small the target's nearest styles are in the labelled pool."""
    counts = Counter(style_of(p) for p in pool_ids if p in labels)
    total = sum(counts.values())
    return {s: n / total for s, n in sorted(counts.items())} if total else {}


@dataclass
class UseCounts:
    """Labelled uses of pool items: of one style (:class:`StyleUse`) or of a whole arm (:class:`LabelledUse`)."""

    uses: int = 0  # (item, query) uses of pool items as labelled data
    items: int = 0  # distinct pool items
    query_class: int = 0  # uses whose label was the class of the query that retrieved (or drew) the item
    query_class_share: float = 0.0  # query_class / uses


@dataclass
class StyleUse(UseCounts):
    """One style's part in an arm's labelled uses."""

    share: float = 0.0  # of all labelled uses of the arm


@dataclass
class LabelledUse(UseCounts):
    """What :func:`labelled_use` reports for one arm (``to_dict`` for a results file)."""

    styles: dict[str, StyleUse] = field(default_factory=dict)
    skipped: int = 0  # entries without a label (unlabelled neighbours): not labelled uses

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def labelled_use(used: Iterable[tuple[str, str | None, str | Collection[str]]]) -> LabelledUse:
    """Per style, the share of an arm's labelled uses and how many carried the query's class.

    ``used``: one ``(pool id, label it served with, query class)`` per use (a neighbour used for two queries, or
    at two steps, counts twice; ``items`` counts it once). The query class is the true class of the target image
    that retrieved the item, or a collection of classes (e.g. those of the step's batch, for a random or whole-pool
    draw that no single query made): the use "had the query's class" when its label is that class or in that
    collection. Entries whose label is None or empty are not labelled uses: they are counted in ``skipped`` only.
    Shares are over all labelled uses; 0 when there are none.
    """
    per: dict[str, StyleUse] = {}
    seen: dict[str, set[str]] = {}
    out = LabelledUse()
    for pid, label, query_class in used:
        if not label:
            out.skipped += 1
            continue
        style = style_of(pid)
        u = per.setdefault(style, StyleUse())
        u.uses += 1
        u.query_class += int(label == query_class if isinstance(query_class, str) else label in query_class)
        seen.setdefault(style, set()).add(pid)
    out.uses = sum(u.uses for u in per.values())
    out.query_class = sum(u.query_class for u in per.values())
    out.query_class_share = out.query_class / out.uses if out.uses else 0.0
    for style in sorted(per):
        u = per[style]
        u.items = len(seen[style])
        u.share = u.uses / out.uses
        u.query_class_share = u.query_class / u.uses
        out.styles[style] = u
    out.items = sum(u.items for u in per.values())
    return out
