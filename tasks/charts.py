"""Render the triage's PNG charts and publish them as artifacts (core: ``denpex.charts``)."""

from __future__ import annotations

from prefect import task
from prefect.artifacts import create_markdown_artifact

from denpex.analysis.batch import RankOutcome
from denpex.analysis.job_progress import job_progress
from denpex.analysis.models import TriageResult
from denpex.charts import Chart, png_markdown, triage_charts
from denpex.markdown_text import inline
from tasks.options import NOT_CACHED

__all__ = ["render_charts", "publish_charts"]


@task(name="render-charts", **NOT_CACHED)
def render_charts(result: TriageResult, batches: list[list[RankOutcome]], world_size: int) -> list[Chart]:
    """The overview and one chart per stuck group, from the fan-out's summaries."""
    progress = job_progress((o for batch in batches for o in batch), world_size)
    return triage_charts(result, progress)


@task(name="publish-charts", **NOT_CACHED)
def publish_charts(charts: list[Chart], key_prefix: str) -> None:
    """One artifact per chart. A markdown image, not an image artifact: Prefect prints an image
    artifact's URL as its link text, which for a data-URI PNG is the whole picture in base64."""
    for chart in charts:
        image = png_markdown(chart.png, chart.title)
        create_markdown_artifact(markdown=f"**{inline(chart.title, limit=200)}**\n\n{image}\n",
                                 key=f"{key_prefix}-chart-{chart.name}", description=chart.title)
