"""PNG plots of the adaptation benchmark (matplotlib, the ``plots`` extra; headless Agg backend)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from t3ar.bench.adaptation_protocol import AVERAGE, lookup

log = logging.getLogger(__name__)

LABELS = {"source": "source only", "tent": "TENT", "shot-im": "SHOT-IM",
          "adacontrast": "AdaContrast", "t3ar-noretrieval": "T3AR without retrieval",
          "t3ar-random": "T3AR, random retrieval", "t3ar": "T3AR"}
STYLE = {"source": ("grey", ":"), "tent": ("tab:orange", "--"), "shot-im": ("tab:green", "--"),
         "adacontrast": ("tab:cyan", "-"), "t3ar-noretrieval": ("tab:blue", "-"),
         "t3ar-random": ("tab:purple", "-."), "t3ar": ("tab:red", "-")}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_fractions(rows: Sequence[Mapping[str, Any]], methods: Sequence[str], fractions: Sequence[float],
                   shifts: Sequence[str], path: Path) -> None:
    """Accuracy vs fraction of T, one line per method (± std over seeds); the shift average, then each shift."""
    plt = _pyplot()
    panels = [AVERAGE, *shifts] if len(shifts) > 1 else list(shifts)
    ncols = min(3, len(panels))
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.4 * ncols, 3.6 * nrows), sharey=True, squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax, shift in zip(flat, panels, strict=False):
        for m in methods:
            cells = [(f, r) for f in fractions
                     if (r := lookup(rows, variant="main", method=m, fraction=f, shift=shift))]
            if not cells:
                continue
            colour, ls = STYLE.get(m, ("black", "-"))
            ax.errorbar([100 * f for f, _ in cells], [100 * r["mean"] for _, r in cells],
                        yerr=[100 * r["std"] for _, r in cells], label=LABELS.get(m, m), color=colour, linestyle=ls,
                        marker="o", markersize=4, capsize=3)
        ax.set_xscale("log")
        ax.set_xticks([100 * f for f in fractions], [f"{100 * f:g}%" for f in fractions])
        ax.set_title("average over shifts" if shift == AVERAGE else f"google → {shift}")
        ax.set_xlabel("fraction of the adaptation part")
        ax.grid(alpha=0.3)
    for row in axes:
        row[0].set_ylabel("top-1 on held-out images (%)")
    handles, labels = flat[0].get_legend_handles_labels()
    if len(flat) > len(panels):  # a spare panel holds the legend
        for ax in flat[len(panels):]:
            ax.axis("off")
        flat[-1].legend(handles, labels, loc="center", fontsize=10)
    else:
        flat[len(panels) - 1].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_retrievals(points: Sequence[tuple[str, Mapping[str, Any] | None]],
                    per_shift: Mapping[str, Sequence[float | None]], fraction: float, path: Path) -> None:
    """Accuracy vs nearest neighbours per target image (k = 1, 2, 5...), shift average ± std over seeds; AdaContrast
    (``'0'``, no retrieval) and random retrieval (``'random'``) are drawn as horizontal reference lines."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    numeric = [(int(label), i) for i, (label, _) in enumerate(points) if label.isdigit() and int(label) > 0]
    for shift, vals in per_shift.items():
        pts = [(k, vals[i]) for k, i in numeric if vals[i] is not None]
        ax.plot([k for k, _ in pts], [100 * float(v) for _, v in pts if v is not None], color="grey", alpha=0.35,
                linewidth=1, marker=".")
        if pts and pts[-1][1] is not None:
            ax.annotate(shift, (pts[-1][0], 100 * float(pts[-1][1])), fontsize=7, color="grey", xytext=(3, 0),
                        textcoords="offset points")
    ok = [(k, r) for k, i in numeric if (r := points[i][1]) is not None]
    ax.errorbar([k for k, _ in ok], [100 * r["mean"] for _, r in ok], yerr=[100 * r["std"] for _, r in ok],
                color="tab:red", marker="o", capsize=3, label="T3AR, nearest neighbours (shift average)")
    refs = {"0": ("tab:blue", "AdaContrast (no retrieval)"), "random": ("tab:purple", "random retrieval")}
    for label, row in points:
        if label in refs and row is not None:
            colour, name = refs[label]
            ax.axhline(100 * row["mean"], color=colour, linestyle="--", linewidth=1.2, label=name)
    ax.set_xticks([k for k, _ in numeric])
    ax.set_xlabel("retrieved pool neighbours per target image (k)")
    ax.set_ylabel("top-1 (%)")
    ax.set_title(f"T3AR at {100 * fraction:g}% of the adaptation part")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
