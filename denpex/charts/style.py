"""Colours and sizes shared by the charts, so a culprit looks the same in every picture."""

from __future__ import annotations

import io

from matplotlib.figure import Figure

from denpex.charts.progress import RankState

__all__ = ["STATE_COLORS", "STATE_LABELS", "DPI", "png_bytes"]

STATE_COLORS: dict[RankState, str] = {
    RankState.CULPRIT: "#d62728",
    RankState.WAITING: "#ff9f1c",
    RankState.CLEAR: "#8fd19e",
    RankState.NO_EVIDENCE: "#9e9e9e",
}
STATE_LABELS: dict[RankState, str] = {
    RankState.CULPRIT: "culprit (candidate)",
    RankState.WAITING: "waiting in a stuck op",
    RankState.CLEAR: "in no stuck op",
    RankState.NO_EVIDENCE: "no usable dump",
}
DPI = 100


def png_bytes(figure: Figure) -> bytes:
    """Render with Agg (a plain ``Figure`` never touches pyplot's global state)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()
