"""PNG pictures of a triage: one per stuck process group and one overview of the whole job.

Plain matplotlib (Agg, no pyplot state), fed from the triage result and the ranks' counters::

    progress = job_progress(summaries, world_size)
    for chart in triage_charts(result, progress):
        chart.name, chart.png          # "overview", b"\\x89PNG..."
    png_markdown(chart.png, "overview")  # "![overview](data:image/png;base64,...)"
"""

from __future__ import annotations

import base64

from pydantic import BaseModel, ConfigDict

from denpex.markdown_text import inline
from denpex.analysis.models import TriageResult
from denpex.charts.group_chart import GroupChart, group_charts, render_group_chart
from denpex.charts.overview_chart import JobOverview, job_overview, render_overview
from denpex.analysis.job_progress import JobProgress, job_progress
from denpex.charts.progress import RankMark, RankState, rank_marks

__all__ = ["Chart", "GroupChart", "JobOverview", "JobProgress", "RankMark", "RankState",
           "group_charts", "job_overview", "job_progress", "png_data_uri", "png_markdown",
           "rank_marks", "render_group_chart", "render_overview", "triage_charts"]


class Chart(BaseModel):
    """One rendered picture: a name fit for an artifact key and the PNG bytes."""

    model_config = ConfigDict(frozen=True)

    name: str
    title: str
    png: bytes


def triage_charts(result: TriageResult, progress: JobProgress) -> list[Chart]:
    """The overview first, then one chart per stuck group worth showing (none for no_hang)."""
    charts = [Chart(name="overview", title=f"Job overview ({result.world_size} ranks)",
                    png=render_overview(job_overview(result, progress)))]
    for group in group_charts(result, progress):
        stuck = group.stuck
        charts.append(Chart(
            name=f"group-{_slug(stuck.process_group)}-{stuck.collective_seq_id}",
            title=f"Process group {stuck.process_group!r} stuck at #{stuck.collective_seq_id} {stuck.op}",
            png=render_group_chart(group)))
    return charts


def png_data_uri(png: bytes) -> str:
    """``data:image/png;base64,...``: renders in Prefect's UI, in artifacts and beside a form."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def png_markdown(png: bytes, alt: str) -> str:
    """A markdown image of ``png`` inlined as a data URI."""
    return f"![{inline(alt, limit=200)}]({png_data_uri(png)})"


def _slug(text: str) -> str:
    """Lowercase letters, digits and dashes (Prefect artifact keys)."""
    slug = "".join(c if c.isascii() and c.isalnum() else "-" for c in text.lower()).strip("-")
    return slug or "group"
