"""The charts as a markdown section: every chart drawn, and the stuck groups without one named.

The report artifact shows the overview and every group chart (``MAX_GROUP_CHARTS`` of them at
most); the approval dialog, about 470 px wide, shows fewer and says where the rest are::

    charts_section(charts, result, groups=1, rest_at="the report artifact")
    -> **Job overview (4 ranks)** ![...](data:...)
       **Process group '2' stuck at #3 gloo:all_reduce** ![...](data:...)
       2 more group charts (group '3' #3, group '4' #3) are in the report artifact.
"""

from __future__ import annotations

from denpex.analysis.models import StuckCollective, TriageResult
from denpex.charts.group_chart import chart_order
from denpex.charts.image import Chart, png_markdown
from denpex.markdown_text import inline

__all__ = ["charts_section", "MAX_NAMED_GROUPS"]

# Beyond this many, the groups without a chart are counted, not named.
MAX_NAMED_GROUPS = 12


def charts_section(charts: list[Chart], result: TriageResult, *, groups: int | None = None,
                   rest_at: str = "") -> str:
    """The overview and the first ``groups`` group charts (None: all of ``charts``); then the
    group charts left out (``rest_at`` says where they are, markdown), then the stuck groups that
    have no chart at all."""
    overview = [c for c in charts if c.name == "overview"]
    drawn = [c for c in charts if c.name != "overview"]
    shown = drawn if groups is None else drawn[:groups]
    parts = [f"**{inline(c.title, limit=200)}**\n\n{png_markdown(c.png, c.title)}" for c in (*overview, *shown)]
    order = chart_order(result)
    left_out = order[len(shown):len(drawn)]
    if left_out:
        where = f" are in {rest_at}" if rest_at else " are in the report artifact"
        parts.append(f"{len(left_out)} more group chart{'s' if len(left_out) != 1 else ''} "
                     f"({_names(left_out)}){where}.")
    undrawn = order[len(drawn):]
    if undrawn and drawn:
        parts.append(f"{len(undrawn)} more stuck group{'s' if len(undrawn) != 1 else ''} without a chart "
                     f"(the first {len(drawn)} are drawn): {_names(undrawn)}.")
    return "\n\n".join(parts)


def _names(stuck: list[StuckCollective]) -> str:
    named = ", ".join(inline(f"group {s.process_group!r} #{s.collective_seq_id}", limit=80)
                      for s in stuck[:MAX_NAMED_GROUPS])
    more = len(stuck) - MAX_NAMED_GROUPS
    return named + (f" and {more} more" if more > 0 else "")
