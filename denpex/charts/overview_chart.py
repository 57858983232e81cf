"""The whole job in one picture, readable at thousands of ranks.

Top: every rank at its position relative to the stuck op of its group (0 = in the stuck op,
below 0 = never reached it). Bottom: every rank as one cell of a grid, coloured by state. The
culprits are drawn last, large and red, and named, so that one rank among 4,096 stands out.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict

from matplotlib.axes import Axes
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from denpex.analysis.models import TriageResult
from denpex.charts.progress import JobProgress, RankMark, RankState, rank_marks
from denpex.charts.style import DPI, STATE_COLORS, STATE_LABELS, png_bytes

__all__ = ["JobOverview", "OVERVIEW_SIZE", "MAX_NAMED_CULPRITS", "job_overview", "render_overview",
           "grid_shape"]

OVERVIEW_SIZE = (1200, 860)
MAX_NAMED_CULPRITS = 8


class JobOverview(BaseModel):
    """What the overview shows: every rank's mark and the verdict."""

    model_config = ConfigDict(frozen=True)

    verdict: str
    world_size: int
    marks: tuple[RankMark, ...]

    @property
    def culprits(self) -> tuple[RankMark, ...]:
        return tuple(m for m in self.marks if m.state is RankState.CULPRIT)


def job_overview(result: TriageResult, progress: JobProgress) -> JobOverview:
    """Join the triage's answer with every rank's counters."""
    return JobOverview(verdict=result.verdict.value, world_size=result.world_size,
                       marks=tuple(rank_marks(result, progress)))


def grid_shape(world_size: int) -> tuple[int, int]:
    """(rows, columns) of the rank grid: about twice as wide as tall, 4,096 ranks -> (46, 91)."""
    columns = max(1, math.ceil(math.sqrt(world_size * 2)))
    return math.ceil(world_size / columns), columns


def render_overview(overview: JobOverview) -> bytes:
    """PNG bytes, OVERVIEW_SIZE pixels."""
    width, height = OVERVIEW_SIZE
    figure = Figure(figsize=(width / DPI, height / DPI), dpi=DPI)
    top, bottom = figure.subplots(2, 1, height_ratios=[1, 1.15])
    _positions(top, overview)
    _grid(bottom, overview)
    names = ", ".join(_culprit_label(m) for m in overview.culprits[:MAX_NAMED_CULPRITS])
    more = len(overview.culprits) - MAX_NAMED_CULPRITS
    names += f" and {more} more" if more > 0 else ""
    figure.suptitle(f"{overview.world_size} ranks, verdict {overview.verdict}"
                    + (f": {names}" if names else ""), fontsize=12, color="#b00000" if names else "black")
    figure.subplots_adjust(left=0.1, right=0.8, top=0.92, bottom=0.04, hspace=0.25)
    return png_bytes(figure)


def _culprit_label(mark: RankMark) -> str:
    kind = mark.culprit_kind.value if mark.culprit_kind else "culprit"
    return f"rank {mark.rank} ({kind}{', ' + mark.host if mark.host else ''})"


def _positions(axes: Axes, overview: JobOverview) -> None:
    placed = [m for m in overview.marks if m.offset is not None]
    offsets = [m.offset for m in placed if m.offset is not None]
    floor = min([*offsets, 0]) - 1
    for state in (RankState.CLEAR, RankState.WAITING, RankState.NO_EVIDENCE):
        xs = [m.rank for m in placed if m.state is state]
        ys = [m.offset or 0 for m in placed if m.state is state]
        unplaced = [m.rank for m in overview.marks if m.offset is None and m.state is state]
        if xs:
            axes.scatter(xs, ys, s=8, color=STATE_COLORS[state], label=STATE_LABELS[state], zorder=2)
        if unplaced:
            axes.scatter(unplaced, [floor] * len(unplaced), s=8, marker="x", color=STATE_COLORS[state],
                         label=None if xs else STATE_LABELS[state], zorder=2)
    culprits = overview.culprits
    for index, mark in enumerate(culprits):
        y = mark.offset if mark.offset is not None else floor
        axes.scatter([mark.rank], [y], s=260, marker="*", color=STATE_COLORS[RankState.CULPRIT],
                     edgecolors="black", linewidths=0.8, zorder=5,
                     label=STATE_LABELS[RankState.CULPRIT] if index == 0 else None)
        if index < MAX_NAMED_CULPRITS:
            axes.annotate(f"rank {mark.rank}", (mark.rank, y), xytext=(8, -14 - 10 * (index % 3)),
                          textcoords="offset points", color=STATE_COLORS[RankState.CULPRIT],
                          fontweight="bold", fontsize=9, zorder=6)
    axes.axhline(0, color="#444444", linestyle="--", linewidth=0.8)
    axes.set_xlim(-0.5 - overview.world_size * 0.01, overview.world_size - 0.5 + overview.world_size * 0.01)
    axes.set_ylim(floor - 1, max([*offsets, 0]) + 1)
    axes.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    if any(m.offset is None for m in overview.marks):
        # Ranks in no stuck op have no position relative to one: a labelled band, not a number.
        ticks = [t for t in axes.get_yticks() if floor < t <= max([*offsets, 0]) + 1]
        axes.set_yticks([floor, *ticks], ["no stuck op", *(f"{t:+.0f}" if t else "0" for t in ticks)])
        axes.axhline(floor + 0.5, color="#bbbbbb", linewidth=0.6)
    axes.set_xlabel("rank")
    axes.set_ylabel("last enqueued id\n- stuck op's id")
    axes.set_title("which rank sits at which collective sequence id (0 = in its group's stuck op)",
                   fontsize=10)
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)


def _grid(axes: Axes, overview: JobOverview) -> None:
    rows, columns = grid_shape(overview.world_size)
    states = list(RankState)
    cells = [[math.nan] * columns for _ in range(rows)]
    for mark in overview.marks:
        cells[mark.rank // columns][mark.rank % columns] = states.index(mark.state)
    colormap = ListedColormap([STATE_COLORS[s] for s in states])
    axes.imshow(cells, cmap=colormap, vmin=-0.5, vmax=len(states) - 0.5, aspect="auto",
                interpolation="nearest")
    culprits = overview.culprits
    axes.scatter([m.rank % columns for m in culprits], [m.rank // columns for m in culprits],
                 s=220, facecolors="none", edgecolors="black", linewidths=2.2, zorder=4)
    axes.scatter([m.rank % columns for m in culprits], [m.rank // columns for m in culprits],
                 s=90, color=STATE_COLORS[RankState.CULPRIT], zorder=5)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_title(f"rank grid: rank = row x {columns} + column", fontsize=10)
    axes.set_xlabel("column")
    axes.set_ylabel("row")
