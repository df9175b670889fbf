"""Server-side charts: numbers in, the coordinates an SVG template draws out (no client library).

:func:`line_chart` scales one or more series into a ``width`` x ``height`` box with axes; the template
(``_charts.html``) draws polylines from the point strings. Only numbers we format reach the SVG.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

W, H, PAD_L, PAD_R, PAD_T, PAD_B = 420, 180, 48, 12, 12, 28
COLOURS = ("#2563eb", "#dc2626", "#16a34a", "#9333ea")


@dataclass
class Series:
    name: str
    points: str  # "x,y x,y ..." in SVG coordinates
    colour: str
    last: float


@dataclass
class Chart:
    title: str
    series: list[Series] = field(default_factory=list)
    y_ticks: list[tuple[float, str]] = field(default_factory=list)  # (y coordinate, label)
    x_ticks: list[tuple[float, str]] = field(default_factory=list)
    width: int = W
    height: int = H
    empty: bool = True


def _finite(v: object) -> float | None:
    try:
        f = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _fmt(v: float) -> str:
    return f"{v:.3g}"


def line_chart(title: str, xs: Sequence[float], series: dict[str, Sequence[object]],
               y_range: tuple[float, float] | None = None) -> Chart:
    """``series``: name -> values (same length as ``xs``; NaN / None are skipped)."""
    chart = Chart(title)
    clean = {name: [(float(x), f) for x, v in zip(xs, vals, strict=False) if (f := _finite(v)) is not None]
             for name, vals in series.items()}
    clean = {k: v for k, v in clean.items() if v}
    if not clean:
        return chart
    all_x = [x for pts in clean.values() for x, _ in pts]
    all_y = [y for pts in clean.values() for _, y in pts]
    x0, x1 = min(all_x), max(all_x)
    y0, y1 = y_range if y_range is not None else (min(all_y), max(all_y))
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        y0, y1 = y0 - 0.5, y1 + 0.5

    def sx(x: float) -> float:
        return PAD_L + (x - x0) / (x1 - x0) * (W - PAD_L - PAD_R)

    def sy(y: float) -> float:
        return H - PAD_B - (y - y0) / (y1 - y0) * (H - PAD_T - PAD_B)

    for i, (name, pts) in enumerate(clean.items()):
        chart.series.append(Series(name, " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts),
                                   COLOURS[i % len(COLOURS)], pts[-1][1]))
    chart.y_ticks = [(sy(v), _fmt(v)) for v in (y0 + (y1 - y0) * t / 4 for t in range(5))]
    chart.x_ticks = [(sx(v), _fmt(v)) for v in (x0 + (x1 - x0) * t / 4 for t in range(5))]
    chart.empty = False
    return chart
