"""Colours and sizes shared by the charts, so a culprit looks the same in every picture."""

from __future__ import annotations

import io

from matplotlib.figure import Figure

from denpex.charts.progress import RankState

__all__ = ["STATE_COLORS", "STATE_LABELS", "DPI", "figure_of", "png_bytes"]

STATE_COLORS: dict[RankState, str] = {
    RankState.CULPRIT: "#d62728",
    RankState.WAITING: "#ff9f1c",
    RankState.BEHIND: "#1f5fbf",
    RankState.UNKNOWN: "#9467bd",
    RankState.CLEAR: "#8fd19e",
    RankState.NO_EVIDENCE: "#9e9e9e",
}
STATE_LABELS: dict[RankState, str] = {
    RankState.CULPRIT: "culprit (candidate)",
    RankState.WAITING: "waiting in a stuck op",
    RankState.BEHIND: "never entered a stuck op",
    RankState.UNKNOWN: "part in a stuck op unknown",
    RankState.CLEAR: "in no stuck op",
    RankState.NO_EVIDENCE: "no usable dump",
}
# Two pixels per CSS pixel: drawn for a 4.8-inch (about 470 px) dialog and sharp when shrunk to it.
DPI = 200


def figure_of(size: tuple[int, int]) -> Figure:
    """A figure of ``size`` pixels whose layout engine keeps every label inside it."""
    width, height = size
    return Figure(figsize=(width / DPI, height / DPI), dpi=DPI, layout="constrained")


def png_bytes(figure: Figure) -> bytes:
    """Render with Agg (a plain ``Figure`` never touches pyplot's global state)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()
