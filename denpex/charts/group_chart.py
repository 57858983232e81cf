"""One stuck process group: which member sits at which collective sequence id.

Each member is a vertical bar from its last completed to its last enqueued id; the dashed line is
the stuck op. Each member's colour is its role in *this* stuck op as the triage JSON lists it
(``progress.role_in``): a rank that waits in another group's op but never entered this one is
"never entered", not "in no stuck op". The culprits are red and named. Drawn for the ~470 px
dialog beside the approval form.
"""

from __future__ import annotations

import textwrap

from pydantic import BaseModel, ConfigDict

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from denpex.analysis.models import StuckCollective, TriageResult
from denpex.charts.progress import JobProgress, RankMark, RankState, rank_marks, role_in
from denpex.charts.style import STATE_COLORS, STATE_LABELS, figure_of, png_bytes

__all__ = ["GroupChart", "MAX_GROUP_CHARTS", "UNPLACED_LABEL", "GROUP_CHART_SIZE", "chart_order", "group_charts",
           "group_figure", "render_group_chart"]

# Every stuck group gets a chart up to this many; the report names the rest.
MAX_GROUP_CHARTS = 6
GROUP_CHART_SIZE = (960, 640)  # pixels at style.DPI: 4.8 x 3.2 inches
_MAX_LABELLED_MEMBERS = 16
_MAX_NAMED = 8


class GroupChart(BaseModel):
    """What one group's chart shows: the stuck op and every member's counters in that group."""

    model_config = ConfigDict(frozen=True)

    stuck: StuckCollective
    verdict: str
    members: tuple[RankMark, ...]

    @property
    def culprits(self) -> tuple[RankMark, ...]:
        return tuple(m for m in self.members if m.state is RankState.CULPRIT)


def chart_order(result: TriageResult) -> list[StuckCollective]:
    """Every stuck op, those waiting directly on a candidate first (the order charts are drawn in)."""
    culprits = {c.rank for c in result.candidates}
    is_direct = [not culprits.isdisjoint((*s.behind_ranks, *s.unknown_ranks)) for s in result.stuck]
    direct = [s for s, d in zip(result.stuck, is_direct, strict=True) if d]
    chained = [s for s, d in zip(result.stuck, is_direct, strict=True) if not d]
    return direct + chained


def group_charts(result: TriageResult, progress: JobProgress,
                 limit: int = MAX_GROUP_CHARTS) -> list[GroupChart]:
    """One chart per stuck group, the first ``limit`` of ``chart_order``."""
    marks = {m.rank: m for m in rank_marks(result, progress)}
    culprits = {c.rank for c in result.candidates}
    no_evidence = set(result.missing_ranks) | set(result.stale_ranks)
    charts = []
    for stuck in chart_order(result)[:limit]:
        ranks = set(stuck.waiting_ranks) | set(stuck.behind_ranks) | set(stuck.unknown_ranks)
        ranks |= {r for r, groups in progress.positions.items() if stuck.process_group in groups}
        members = tuple(_member(marks[r], stuck, progress,
                                role_in(r, [stuck], candidates=culprits, no_evidence=no_evidence))
                        for r in sorted(ranks) if r in marks)
        charts.append(GroupChart(stuck=stuck, verdict=result.verdict.value, members=members))
    return charts


def _member(mark: RankMark, stuck: StuckCollective, progress: JobProgress, state: RankState) -> RankMark:
    """The rank's mark with its role and counters in *this* group (its overall mark may place it
    elsewhere)."""
    position = progress.positions.get(mark.rank, {}).get(stuck.process_group)
    return mark.model_copy(update={
        "state": state, "process_group": stuck.process_group,
        "last_enqueued": position.last_enqueued if position else None,
        "last_completed": position.last_completed if position else None,
        "offset": position.last_enqueued - stuck.collective_seq_id if position else None,
    })


def render_group_chart(chart: GroupChart) -> bytes:
    """PNG bytes, GROUP_CHART_SIZE pixels."""
    return png_bytes(group_figure(chart))


def group_figure(chart: GroupChart) -> Figure:
    """The chart as a matplotlib figure (tests read its artists' colours and text extents)."""
    figure = figure_of(GROUP_CHART_SIZE)
    axes = figure.add_subplot()
    stuck = chart.stuck
    known = [m for m in chart.members if m.last_enqueued is not None]
    values = [stuck.collective_seq_id] + [v for m in known for v in (m.last_enqueued, m.last_completed)
                                          if v is not None]
    low, high = min(values) - 1.5, max(values) + 1.5
    few = len(chart.members) <= 64
    # One draw call per state, not per member: a world group has thousands of members.
    for state in (RankState.CLEAR, RankState.NO_EVIDENCE, RankState.UNKNOWN, RankState.BEHIND, RankState.WAITING,
                  RankState.CULPRIT):
        placed = [(x, m) for x, m in enumerate(chart.members) if m.state is state and m.last_enqueued is not None]
        unplaced = [x for x, m in enumerate(chart.members) if m.state is state and m.last_enqueued is None]
        color = STATE_COLORS[state]
        if placed:
            xs = [x for x, _ in placed]
            tops = [m.last_enqueued or 0 for _, m in placed]
            bottoms = [m.last_completed if m.last_completed is not None else m.last_enqueued or 0 for _, m in placed]
            axes.vlines(xs, bottoms, tops, color=color, linewidth=4 if few else 1, alpha=0.6)
            axes.scatter(xs, tops, color=color, s=30 if few else 4, zorder=3,
                         edgecolors="black" if few else "none", linewidths=0.5)
        if unplaced:
            axes.scatter(unplaced, [low + 0.4] * len(unplaced), marker="x", color=color, s=30, zorder=3)
    for index, (x, member) in enumerate((x, m) for x, m in enumerate(chart.members)
                                        if m.state is RankState.CULPRIT):
        y = member.last_enqueued if member.last_enqueued is not None else low + 0.4
        if index < _MAX_NAMED:
            kind = member.culprit_kind.value if member.culprit_kind else "culprit"
            right = x > len(chart.members) / 2
            # Below the point in the upper half, above it in the lower half: a label hung below a
            # point at the foot (a member with nothing recorded) crossed the frame.
            low_half = y < (low + high) / 2
            axes.annotate(f"rank {member.rank}\n{kind}", (x, y), xytext=(-8 if right else 8, 4 if low_half else -2),
                          textcoords="offset points", ha="right" if right else "left",
                          va="bottom" if low_half else "top",
                          color=STATE_COLORS[member.state], fontweight="bold", fontsize=7, zorder=5)
    what = f"p2p #{stuck.collective_seq_id}" if stuck.is_p2p else f"#{stuck.collective_seq_id}"
    axes.axhline(stuck.collective_seq_id, color="#444444", linestyle="--", linewidth=0.8)
    axes.set_ylim(low, high)
    axes.set_xlim(-0.7, len(chart.members) - 0.3)
    axes.yaxis.set_major_locator(MaxNLocator(integer=True, nbins=5))
    axes.tick_params(labelsize=7)
    if len(chart.members) <= _MAX_LABELLED_MEMBERS:
        axes.set_xticks(range(len(chart.members)), [str(m.rank) for m in chart.members], fontsize=7)
        axes.set_xlabel("member rank", fontsize=7)
    else:
        axes.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=6))
        axes.set_xlabel(f"member index (ranks {chart.members[0].rank}..{chart.members[-1].rank})", fontsize=7)
    axes.set_ylabel("collective seq id", fontsize=7)
    desc = f" ({stuck.group_desc[:40]})" if stuck.group_desc else ""
    title = f"group {stuck.process_group[:40]!r}{desc} stuck at {what} {stuck.op[:40]} (dashed line)"
    axes.set_title(textwrap.fill(title, 56), fontsize=8)
    handles = [Line2D([], [], linestyle="", marker="o", markersize=6, color=STATE_COLORS[s],
                      label=_GROUP_LABELS.get(s, STATE_LABELS[s]))
               for s in RankState if any(m.state is s for m in chart.members)]
    if any(m.last_enqueued is None for m in chart.members):
        # The × at the foot is drawn in its member's colour; the legend says what the mark means.
        handles.append(Line2D([], [], linestyle="", marker="x", markersize=6, color="#444444",
                              label=UNPLACED_LABEL))
    figure.legend(handles=handles, loc="outside lower center", ncols=2, fontsize=7, frameon=False)
    return figure


UNPLACED_LABEL = "nothing of this group recorded (at the foot)"
# Labels for one group's op: "it" is the op the chart is about.
_GROUP_LABELS = {
    RankState.WAITING: "waiting in it",
    RankState.BEHIND: "never entered it",
    RankState.UNKNOWN: "may be a member behind it",
    RankState.CLEAR: "not held by it",
}
