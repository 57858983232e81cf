"""The whole job in one picture, readable at 4 ranks and at 4,096, in Prefect's ~470 px dialog.

Top: every rank at its position relative to the stuck op of its group (0 = in the stuck op,
below 0 = never reached it). Bottom: every rank as one cell of a grid, coloured by its role. The
culprits are drawn last, large and red, and named, so that one rank among 4,096 stands out.
Small jobs get one row of cells, each labelled with its rank; large ones a grid about twice as
wide as tall, the culprits ringed (the legend says so). The layout engine keeps every label
inside the figure; the legend sits below the plots, in rows, at a size that reads once the
picture is shrunk to the dialog's width.
"""

from __future__ import annotations

import math
import textwrap

from pydantic import BaseModel, ConfigDict

from matplotlib.axes import Axes
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from denpex.analysis.models import TriageResult
from denpex.charts.progress import JobProgress, RankMark, RankState, rank_marks
from denpex.charts.style import STATE_COLORS, STATE_LABELS, figure_of, png_bytes

__all__ = ["JobOverview", "OVERVIEW_SIZE", "MAX_NAMED_CULPRITS", "LABELLED_GRID_RANKS", "job_overview",
           "overview_figure", "render_overview", "grid_shape"]

# Pixels: 4.8 x 4.5 inches at style.DPI, shown about 470 px wide beside the approval form.
OVERVIEW_SIZE = (960, 900)
MAX_NAMED_CULPRITS = 8
# Up to this many ranks, the grid is one row of cells with each rank's number written in it.
LABELLED_GRID_RANKS = 32


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
    """(rows, columns) of the rank grid: one row for a small job (4 ranks -> (1, 4)), else about
    twice as wide as tall (4,096 ranks -> (46, 91))."""
    if world_size <= LABELLED_GRID_RANKS:
        return 1, max(1, world_size)
    columns = math.ceil(math.sqrt(world_size * 2))
    return math.ceil(world_size / columns), columns


def render_overview(overview: JobOverview) -> bytes:
    """PNG bytes, OVERVIEW_SIZE pixels."""
    return png_bytes(overview_figure(overview))


def overview_figure(overview: JobOverview) -> Figure:
    """The overview as a matplotlib figure (tests read its artists and text extents)."""
    figure = figure_of(OVERVIEW_SIZE)
    rows, _ = grid_shape(overview.world_size)
    top, bottom = figure.subplots(2, 1, height_ratios=[1, 0.35 if rows == 1 else 0.9])
    _positions(top, overview)
    _grid(bottom, overview)
    names = ", ".join(_culprit_label(m) for m in overview.culprits[:MAX_NAMED_CULPRITS])
    more = len(overview.culprits) - MAX_NAMED_CULPRITS
    names += f" and {more} more" if more > 0 else ""
    title = f"{overview.world_size} ranks, verdict {overview.verdict}" + (f": {names}" if names else "")
    figure.suptitle(textwrap.fill(title, 48), fontsize=9, color="#b00000" if names else "black")
    shown = [s for s in RankState if any(m.state is s for m in overview.marks)]
    handles = [Line2D([], [], linestyle="", marker="*" if s is RankState.CULPRIT else "s", markersize=7,
                      color=STATE_COLORS[s], label=STATE_LABELS[s]) for s in shown]
    if overview.culprits and rows > 1:
        handles.append(Line2D([], [], linestyle="", marker="o", markersize=7, markerfacecolor="none",
                              markeredgecolor="black", label="ring: a culprit's cell"))
    figure.legend(handles=handles, loc="outside lower center", ncols=2, fontsize=7, frameon=False)
    return figure


def _culprit_label(mark: RankMark) -> str:
    kind = mark.culprit_kind.value if mark.culprit_kind else "culprit"
    return f"rank {mark.rank} ({kind}{', ' + mark.host if mark.host else ''})"


def _positions(axes: Axes, overview: JobOverview) -> None:
    placed = [m for m in overview.marks if m.offset is not None]
    offsets = [m.offset for m in placed if m.offset is not None]
    floor = min([*offsets, 0]) - 1
    small = overview.world_size <= LABELLED_GRID_RANKS
    size = 30 if small else 4
    for state in (RankState.CLEAR, RankState.UNKNOWN, RankState.BEHIND, RankState.WAITING, RankState.NO_EVIDENCE):
        xs = [m.rank for m in placed if m.state is state]
        ys = [m.offset or 0 for m in placed if m.state is state]
        unplaced = [m.rank for m in overview.marks if m.offset is None and m.state is state]
        if xs:
            axes.scatter(xs, ys, s=size, color=STATE_COLORS[state], zorder=2)
        if unplaced:
            axes.scatter(unplaced, [floor] * len(unplaced), s=size, marker="x", color=STATE_COLORS[state], zorder=2)
    for index, mark in enumerate(overview.culprits):
        y = mark.offset if mark.offset is not None else floor
        axes.scatter([mark.rank], [y], s=160, marker="*", color=STATE_COLORS[RankState.CULPRIT],
                     edgecolors="black", linewidths=0.6, zorder=5)
        if index < MAX_NAMED_CULPRITS:
            # Named on the side with room, so that a culprit near the right edge stays inside.
            right = mark.rank > overview.world_size / 2
            axes.annotate(f"rank {mark.rank}", (mark.rank, y), xytext=(-8 if right else 8, 6 + 8 * (index % 3)),
                          textcoords="offset points", ha="right" if right else "left",
                          color=STATE_COLORS[RankState.CULPRIT], fontweight="bold", fontsize=7, zorder=6,
                          annotation_clip=False)
    axes.axhline(0, color="#444444", linestyle="--", linewidth=0.8)
    pad = max(0.5, overview.world_size * 0.02)
    axes.set_xlim(-pad, overview.world_size - 1 + pad)
    top = max([*offsets, 0]) + 1
    axes.set_ylim(floor - 1, top + (1 if overview.culprits else 0))
    axes.yaxis.set_major_locator(MaxNLocator(integer=True, nbins=5))
    axes.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=6))
    if any(m.offset is None for m in overview.marks):
        # Ranks in no stuck op have no position relative to one: a labelled band, not a number.
        ticks = [t for t in axes.get_yticks() if floor < t <= top]
        axes.set_yticks([floor, *ticks], ["none", *(f"{t:+.0f}" if t else "0" for t in ticks)])
        axes.axhline(floor + 0.5, color="#bbbbbb", linewidth=0.6)
    axes.tick_params(labelsize=7)
    axes.set_xlabel("rank", fontsize=7)
    axes.set_ylabel("position vs stuck op", fontsize=7)
    axes.set_title("0 = in its group's stuck op, below = never reached it", fontsize=7)


def _grid(axes: Axes, overview: JobOverview) -> None:
    rows, columns = grid_shape(overview.world_size)
    states = list(RankState)
    cells = [[math.nan] * columns for _ in range(rows)]
    for mark in overview.marks:
        cells[mark.rank // columns][mark.rank % columns] = states.index(mark.state)
    colormap = ListedColormap([STATE_COLORS[s] for s in states])
    axes.imshow(cells, cmap=colormap, vmin=-0.5, vmax=len(states) - 0.5, aspect="auto", interpolation="nearest")
    if rows == 1:
        # Each cell says which rank it is; the colour is its role (the legend below).
        for mark in overview.marks:
            axes.text(mark.rank, 0, str(mark.rank), ha="center", va="center", fontsize=7 if columns <= 16 else 5,
                      color="white" if mark.state in (RankState.CULPRIT, RankState.BEHIND) else "black")
        axes.set_xticks([])
        axes.set_yticks([])
        axes.set_title("every rank, coloured by its role", fontsize=7)
        return
    culprits = overview.culprits
    axes.scatter([m.rank % columns for m in culprits], [m.rank // columns for m in culprits],
                 s=90, facecolors="none", edgecolors="black", linewidths=1.6, zorder=4)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=6))
    axes.yaxis.set_major_locator(MaxNLocator(integer=True, nbins=5))
    axes.tick_params(labelsize=7)
    axes.set_title(f"every rank: rank = row x {columns} + column", fontsize=7)
    axes.set_xlabel("column", fontsize=7)
    axes.set_ylabel("row", fontsize=7)

