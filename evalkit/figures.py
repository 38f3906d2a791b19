"""Figures as evalkit writes them (PNG and SVG, atomically), for every command that draws: the
leaderboard and compare (results/), ppl and the probe, which sit below results/ in the import
layers and so cannot import its plots."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from evalkit.files import atomic_write_bytes, atomic_write_text


def new_figure(width: float = 6.4, height: float = 4.2, columns: int = 1):
    """A figure and its axes (one per column): matplotlib's Figure rather than pyplot's, so no
    global state is touched, no backend chosen and nothing needs closing (savefig picks Agg/SVG)."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height))
    return figure, figure.subplots(1, columns)


def write_figure(figure: Any, stem: Path) -> list[Path]:
    png, svg = io.BytesIO(), io.StringIO()
    figure.tight_layout()
    figure.savefig(png, format="png", dpi=150)
    figure.savefig(svg, format="svg")
    atomic_write_bytes(stem.with_suffix(".png"), png.getvalue())
    atomic_write_text(stem.with_suffix(".svg"), svg.getvalue())
    return [stem.with_suffix(".png"), stem.with_suffix(".svg")]
