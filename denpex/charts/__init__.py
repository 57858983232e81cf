"""PNG pictures of a triage: one per stuck process group and one overview of the whole job.

Plain matplotlib (Agg, no pyplot state), fed from the triage result and the ranks' counters::

    progress = job_progress(summaries, world_size)
    for chart in triage_charts(result, progress):
        chart.name, chart.png          # "overview", b"\\x89PNG..."
    png_markdown(chart.png, "overview")  # "![overview](data:image/png;base64,...)"
    charts_section(charts, result, groups=1, rest_at="the report")  # markdown, the rest named
"""

from __future__ import annotations

from denpex.analysis.job_progress import JobProgress, job_progress
from denpex.analysis.models import TriageResult
from denpex.charts.group_chart import MAX_GROUP_CHARTS, GroupChart, group_charts, render_group_chart
from denpex.charts.image import Chart, png_data_uri, png_markdown
from denpex.charts.overview_chart import JobOverview, job_overview, render_overview
from denpex.charts.progress import RankMark, RankState, rank_marks, role_in
from denpex.charts.section import charts_section

__all__ = ["Chart", "GroupChart", "JobOverview", "JobProgress", "MAX_GROUP_CHARTS", "RankMark", "RankState",
           "charts_section", "group_charts", "job_overview", "job_progress", "png_data_uri", "png_markdown",
           "rank_marks", "render_group_chart", "render_overview", "role_in", "triage_charts"]


def triage_charts(result: TriageResult, progress: JobProgress) -> list[Chart]:
    """The overview first, then one chart per stuck group, the first ``MAX_GROUP_CHARTS`` of them
    (none for no_hang)."""
    charts = [Chart(name="overview", title=f"Job overview ({result.world_size} ranks)",
                    png=render_overview(job_overview(result, progress)))]
    for group in group_charts(result, progress):
        stuck = group.stuck
        charts.append(Chart(
            name=f"group-{_slug(stuck.process_group)}-{stuck.collective_seq_id}",
            title=f"Process group {stuck.process_group!r} stuck at #{stuck.collective_seq_id} {stuck.op}",
            png=render_group_chart(group)))
    return charts


def _slug(text: str) -> str:
    """Lowercase letters, digits and dashes (Prefect artifact keys)."""
    slug = "".join(c if c.isascii() and c.isalnum() else "-" for c in text.lower()).strip("-")
    return slug or "group"
