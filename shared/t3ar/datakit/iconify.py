"""Readers for emoji artwork shipped as SVG inside npm packages: Iconify JSON sets and svgmoji sprites, and the
mapping of their icon names to emoji codes.

- An Iconify set (``@iconify-json/<prefix>``) keeps every icon's SVG *body* in one ``icons.json``, keyed by a
  CLDR-style name (``grinning-face``), with the set's default ``width``/``height``; ``aliases`` point at a parent
  icon, possibly flipped or rotated. Some sets ship ``chars.json`` (code point → name); most do not.
- An svgmoji sprite (``@svgmoji/<set>/sprites/all.svg``) nests one ``<svg id="<UNIFIED>">`` per emoji.

Codes are *normalised*: upper-case hex code points joined by ``-`` without the ``FE0F`` variation selector
(``2764-FE0F`` → ``2764``), so the forms used by emoji-datasource, Iconify and svgmoji compare equal.
"""

from __future__ import annotations

import json
import logging
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from t3ar.errors import InvalidInputError

logger = logging.getLogger(__name__)

_SVG_NS = "http://www.w3.org/2000/svg"
_FLAG_FOR = re.compile(r"^flag-for-")


def norm_code(code: str) -> str:
    """``"2764-fe0f"`` → ``"2764"``: upper case, ``FE0F`` dropped (the form every reader compares)."""
    return "-".join(p for p in code.strip().upper().replace("_", "-").split("-") if p and p != "FE0F")


@dataclass(frozen=True)
class Icon:
    """One icon of an Iconify set: its SVG body and the viewBox/transform it is drawn with."""

    body: str
    width: float
    height: float
    left: float = 0.0
    top: float = 0.0
    h_flip: bool = False
    v_flip: bool = False

    def svg(self) -> str:
        """A standalone SVG document (black ``currentColor``, as monochrome sets expect)."""
        body, w, h = self.body, self.width, self.height
        ops = []
        if self.h_flip:
            ops.append(f"translate({2 * self.left + w} 0) scale(-1 1)")
        if self.v_flip:
            ops.append(f"translate(0 {2 * self.top + h}) scale(1 -1)")
        if ops:
            body = f'<g transform="{" ".join(ops)}">{body}</g>'
        return (f'<svg xmlns="{_SVG_NS}" xmlns:xlink="http://www.w3.org/1999/xlink" color="black" '
                f'width="{w}" height="{h}" viewBox="{self.left} {self.top} {w} {h}">{body}</svg>')


@dataclass
class IconifySet:
    """An Iconify set as read from its package folder: icons (aliases resolved), ``chars.json`` and ``info``."""

    prefix: str
    icons: dict[str, Icon]
    chars: dict[str, str]  # icon name → normalised code, from chars.json (empty when the set has none)
    info: dict[str, Any]

    @property
    def licence(self) -> str:
        """The artwork licence the set declares (``info.license.spdx``), ``"unknown"`` if absent."""
        lic = self.info.get("license") or {}
        return str(lic.get("spdx") or lic.get("title") or "unknown") if isinstance(lic, dict) else str(lic)


def _icon(raw: Mapping[str, Any], defaults: Mapping[str, Any], parent: Icon | None = None) -> Icon:
    base: dict[str, Any] = {"body": parent.body, "width": parent.width, "height": parent.height,
                            "left": parent.left, "top": parent.top} if parent else {
        "body": str(raw["body"]), "width": float(defaults.get("width", 16)),
        "height": float(defaults.get("height", 16)), "left": float(defaults.get("left", 0)),
        "top": float(defaults.get("top", 0))}
    for k in ("width", "height", "left", "top"):
        if k in raw:
            base[k] = float(raw[k])
    h = bool(raw.get("hFlip", False)) != (parent.h_flip if parent else False)
    v = bool(raw.get("vFlip", False)) != (parent.v_flip if parent else False)
    return Icon(h_flip=h, v_flip=v, **base)


def read_iconify(package: Path) -> IconifySet:
    """Read ``icons.json`` (+ ``chars.json``, ``info.json`` when present) of an extracted ``@iconify-json`` package.

    Hidden icons (kept by Iconify for old names) are skipped; an alias becomes an icon of its own (its parent's
    body with the alias's flips). Icons and aliases that are rotated are skipped (no emoji set of ours has one;
    a quarter turn of a non-square icon would also swap its box). Raises InvalidInputError when ``icons.json``
    is missing or malformed.
    """
    try:
        data = json.loads((package / "icons.json").read_text(encoding="utf-8"))
        raw_icons: dict[str, Any] = data["icons"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InvalidInputError(f"{package}: not an Iconify JSON package ({e}); delete it from the cache") from e
    icons = {n: _icon(r, data) for n, r in raw_icons.items() if isinstance(r, dict) and "body" in r
             and not r.get("hidden") and not r.get("rotate")}
    aliases: dict[str, Any] = data.get("aliases") or {}
    for _ in range(4):  # aliases may point at aliases; a few rounds resolve every real chain
        for name, raw in aliases.items():
            parent = icons.get(str(raw.get("parent", "")))
            if name not in icons and parent is not None and not raw.get("hidden") and not raw.get("rotate"):
                icons[name] = _icon(raw, data, parent)
    chars, info = {}, {}
    if (package / "chars.json").is_file():
        chars = {str(n): norm_code(c) for c, n in json.loads((package / "chars.json").read_text()).items()}
    if (package / "info.json").is_file():
        info = json.loads((package / "info.json").read_text(encoding="utf-8"))
    return IconifySet(str(data.get("prefix", package.name)), icons, chars, info)


def read_svgmoji_sprite(path: Path) -> dict[str, str]:
    """normalised code → standalone SVG document, from an svgmoji ``sprites/*.svg`` (one nested ``<svg id>`` each)."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        raise InvalidInputError(f"{path}: not a readable SVG sprite ({e})") from e
    ET.register_namespace("", _SVG_NS)
    ET.register_namespace("xlink", "http://www.w3.org/1999/xlink")
    out: dict[str, str] = {}
    for child in root:
        if child.tag == f"{{{_SVG_NS}}}svg" and child.get("id"):
            code = norm_code(str(child.get("id")))
            child.attrib.pop("id")
            child.set("color", "black")
            out.setdefault(code, ET.tostring(child, encoding="unicode"))
    return out


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower().replace("&", " and ")).strip("-")


class NameIndex:
    """Icon name → normalised emoji code, learnt from reliable sources and used for sets without ``chars.json``.

    Sources, in order of trust: the ``chars.json`` of Iconify sets that have one (their names follow one
    convention across sets), then emoji-datasource's ``name`` and ``short_names``. A name that two sources give
    different codes is ambiguous and maps to nothing. Lookup tries the name, ``flag-for-X`` as ``flag-X``
    (Emoji One), and the name without hyphens (Firefox OS's ``alarmclock``).
    """

    def __init__(self, chars_maps: Iterable[Mapping[str, str]], datasource: Iterable[Mapping[str, Any]]) -> None:
        first: dict[str, set[str]] = {}
        for chars in chars_maps:
            for name, code in chars.items():
                first.setdefault(name, set()).add(code)
        second: dict[str, set[str]] = {}
        for entry in datasource:
            code = norm_code(str(entry.get("unified", "")))
            names = [str(entry.get("name") or "")] + [str(s) for s in entry.get("short_names") or []]
            for n in names:
                if n:
                    second.setdefault(_slug(n), set()).add(code)
        self._exact: dict[str, str] = {}
        for table in (first, second):  # the first table wins where both know a name
            for name, codes in table.items():
                if name not in self._exact and len(codes) == 1:
                    self._exact[name] = next(iter(codes))
        squashed: dict[str, set[str]] = {}
        for name, code in self._exact.items():
            squashed.setdefault(name.replace("-", ""), set()).add(code)
        self._squashed = {n: next(iter(c)) for n, c in squashed.items() if len(c) == 1}

    def __len__(self) -> int:
        return len(self._exact)

    def code(self, name: str) -> str | None:
        """The normalised code of icon ``name``, or None when no source names it unambiguously."""
        for n in (name, _FLAG_FOR.sub("flag-", name)):
            if n in self._exact:
                return self._exact[n]
        return self._squashed.get(name.replace("-", ""))


def codes_of(icon_set: IconifySet, index: NameIndex) -> dict[str, str]:
    """normalised code → icon name for every icon of the set that maps to a code (the set's own ``chars.json``
    first, then ``index``); of several names for one code, a name from ``chars.json`` wins, then the first sorted."""
    out: dict[str, str] = {}
    for name in sorted(icon_set.icons, key=lambda n: (n not in icon_set.chars, n)):
        code = icon_set.chars.get(name) or index.code(name)
        if code and code not in out:
            out[code] = name
    return out
