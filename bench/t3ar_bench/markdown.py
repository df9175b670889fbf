"""Markdown tables for the benchmarks' reports."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def row(cells: Iterable[object]) -> str:
    """One line of a markdown table: ``| a | b |`` (each cell as ``str``)."""
    return "| " + " | ".join(map(str, cells)) + " |"


def table(header: Sequence[object], rows: Iterable[Iterable[object]]) -> list[str]:
    """A markdown table's lines: ``header``, its rule (``|---|`` a column), a line per row."""
    return [row(header), "|" + "---|" * len(header), *map(row, rows)]
