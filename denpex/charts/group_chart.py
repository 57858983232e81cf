"""One stuck process group: which member sits at which collective sequence id.

Each member is a vertical bar from its last completed to its last enqueued id; the dashed line is
the stuck op. Members below the line never reached it; the culprits are red and named.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from denpex.analysis.models import StuckCollective, TriageResult
from denpex.charts.progress import JobProgress, RankMark, RankState, rank_marks
from denpex.charts.style import DPI, STATE_COLORS, STATE_LABELS, png_bytes

__all__ = ["GroupChart", "MAX_GROUP_CHARTS", "GROUP_CHART_SIZE", "group_charts", "render_group_chart"]

# The direct blockages explain the hang; chained ones repeat it. A few pictures are enough.
MAX_GROUP_CHARTS = 4
GROUP_CHART_SIZE = (900, 420)
_MAX_LABELLED_MEMBERS = 32
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


def group_charts(result: TriageResult, progress: JobProgress,
                 limit: int = MAX_GROUP_CHARTS) -> list[GroupChart]:
    """The stuck groups worth a picture: those waiting directly on a candidate first."""
    culprits = {c.rank for c in result.candidates}
    is_direct = [not culprits.isdisjoint((*s.behind_ranks, *s.unknown_ranks)) for s in result.stuck]
    direct = [s for s, d in zip(result.stuck, is_direct, strict=True) if d]
    chained = [s for s, d in zip(result.stuck, is_direct, strict=True) if not d]
    marks = {m.rank: m for m in rank_marks(result, progress)}
    charts = []
    for stuck in (direct + chained)[:limit]:
        ranks = set(stuck.waiting_ranks) | set(stuck.behind_ranks) | set(stuck.unknown_ranks)
        ranks |= {r for r, groups in progress.positions.items() if stuck.process_group in groups}
        members = tuple(_member(marks[r], stuck, progress) for r in sorted(ranks) if r in marks)
        charts.append(GroupChart(stuck=stuck, verdict=result.verdict.value, members=members))
    return charts


def _member(mark: RankMark, stuck: StuckCollective, progress: JobProgress) -> RankMark:
    """The rank's mark with its counters in *this* group (its overall mark may place it elsewhere)."""
    position = progress.positions.get(mark.rank, {}).get(stuck.process_group)
    state = mark.state
    if state is RankState.WAITING and mark.rank not in stuck.waiting_ranks:
        state = RankState.CLEAR
    return mark.model_copy(update={
        "state": state, "process_group": stuck.process_group,
        "last_enqueued": position.last_enqueued if position else None,
        "last_completed": position.last_completed if position else None,
        "offset": position.last_enqueued - stuck.collective_seq_id if position else None,
    })


def render_group_chart(chart: GroupChart) -> bytes:
    """PNG bytes, GROUP_CHART_SIZE pixels."""
    width, height = GROUP_CHART_SIZE
    figure = Figure(figsize=(width / DPI, height / DPI), dpi=DPI)
    axes = figure.add_subplot()
    stuck = chart.stuck
    known = [m for m in chart.members if m.last_enqueued is not None]
    values = [stuck.collective_seq_id] + [v for m in known for v in (m.last_enqueued, m.last_completed)
                                          if v is not None]
    low, high = min(values) - 1.5, max(values) + 1.5
    # One draw call per state, not per member: a world group has thousands of members.
    for state in (RankState.CLEAR, RankState.NO_EVIDENCE, RankState.WAITING, RankState.CULPRIT):
        placed = [(x, m) for x, m in enumerate(chart.members) if m.state is state and m.last_enqueued is not None]
        unplaced = [x for x, m in enumerate(chart.members) if m.state is state and m.last_enqueued is None]
        color = STATE_COLORS[state]
        if placed:
            xs = [x for x, _ in placed]
            tops = [m.last_enqueued or 0 for _, m in placed]
            bottoms = [m.last_completed if m.last_completed is not None else m.last_enqueued or 0 for _, m in placed]
            axes.vlines(xs, bottoms, tops, color=color, linewidth=6 if len(chart.members) <= 64 else 1, alpha=0.6)
            axes.scatter(xs, tops, color=color, s=60 if len(chart.members) <= 64 else 6, zorder=3,
                         edgecolors="black" if len(chart.members) <= 64 else "none")
        if unplaced:
            axes.scatter(unplaced, [low + 0.4] * len(unplaced), marker="x", color=color, s=60, zorder=3)
    for index, (x, member) in enumerate((x, m) for x, m in enumerate(chart.members)
                                        if m.state is RankState.CULPRIT):
        y = member.last_enqueued if member.last_enqueued is not None else low + 0.4
        axes.scatter([x], [y], marker="o", s=400, facecolors="none", edgecolors=STATE_COLORS[member.state],
                     linewidths=3, zorder=4)
        if index < _MAX_NAMED:
            kind = member.culprit_kind.value if member.culprit_kind else "culprit"
            axes.annotate(f"rank {member.rank}\n{kind}", (x, y), xytext=(12, -4), textcoords="offset points",
                          color=STATE_COLORS[member.state], fontweight="bold", fontsize=9, zorder=5)
    what = f"p2p #{stuck.collective_seq_id}" if stuck.is_p2p else f"#{stuck.collective_seq_id}"
    axes.axhline(stuck.collective_seq_id, color="#444444", linestyle="--", linewidth=1)
    axes.text(1.0, stuck.collective_seq_id, f" stuck {what}\n {stuck.op}", transform=axes.get_yaxis_transform(),
              va="center", ha="left", fontsize=8, color="#444444")
    axes.set_ylim(low, high)
    axes.set_xlim(-0.7, len(chart.members) - 0.3)
    axes.yaxis.set_major_locator(MaxNLocator(integer=True))
    if len(chart.members) <= _MAX_LABELLED_MEMBERS:
        axes.set_xticks(range(len(chart.members)), [str(m.rank) for m in chart.members], fontsize=8)
        axes.set_xlabel("member rank")
    else:
        axes.set_xlabel(f"member index (ranks {chart.members[0].rank}..{chart.members[-1].rank} in order)")
    axes.set_ylabel("collective sequence id")
    desc = f" ({stuck.group_desc})" if stuck.group_desc else ""
    axes.set_title(f"process group {stuck.process_group!r}{desc}: stuck at {what} {stuck.op}", fontsize=10)
    handles = [axes.scatter([], [], color=STATE_COLORS[s], label=STATE_LABELS[s])
               for s in RankState if any(m.state is s for m in chart.members)]
    axes.legend(handles=handles, loc="upper left", fontsize=8, framealpha=0.8)
    figure.subplots_adjust(left=0.08, right=0.84, top=0.9, bottom=0.13)
    return png_bytes(figure)
