"""Render the triage's PNG charts and publish them as image artifacts (core: ``denpex.charts``)."""

from __future__ import annotations

from prefect import task
from prefect.artifacts import create_image_artifact

from denpex.analysis.batch import RankOutcome
from denpex.analysis.job_progress import job_progress
from denpex.analysis.models import TriageResult
from denpex.markdown_text import inline
from denpex.charts import Chart, png_data_uri, png_markdown, triage_charts

__all__ = ["render_charts", "publish_charts", "charts_markdown", "CHARTS_BESIDE_FORM"]

# The overview and the chart of the group waiting directly on the culprit; the rest are artifacts.
CHARTS_BESIDE_FORM = 2


@task(name="render-charts")
def render_charts(result: TriageResult, batches: list[list[RankOutcome]], world_size: int) -> list[Chart]:
    """The overview and one chart per stuck group, from the fan-out's summaries."""
    progress = job_progress((o for batch in batches for o in batch), world_size)
    return triage_charts(result, progress)


@task(name="publish-charts")
def publish_charts(charts: list[Chart], key_prefix: str) -> None:
    """One image artifact per chart (a data-URI PNG renders in the UI)."""
    for chart in charts:
        create_image_artifact(image_url=png_data_uri(chart.png), key=f"{key_prefix}-chart-{chart.name}",
                              description=chart.title)


def charts_markdown(charts: list[Chart], limit: int = CHARTS_BESIDE_FORM) -> str:
    """Markdown images for the report artifact and the approval form."""
    return "\n\n".join(f"**{inline(c.title, limit=200)}**\n\n{png_markdown(c.png, c.title)}" for c in charts[:limit])
