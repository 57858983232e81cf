"""Render the triage's PNG charts (core: ``denpex.charts``); the report artifact shows them."""

from __future__ import annotations

from prefect import task

from denpex.analysis.batch import RankOutcome
from denpex.analysis.job_progress import job_progress
from denpex.analysis.models import TriageResult
from denpex.charts import Chart, triage_charts
from tasks.options import NOT_CACHED

__all__ = ["render_charts"]


@task(name="render-charts", **NOT_CACHED)
def render_charts(result: TriageResult, batches: list[list[RankOutcome]], world_size: int) -> list[Chart]:
    """The overview and one chart per stuck group, from the fan-out's summaries."""
    progress = job_progress((o for batch in batches for o in batch), world_size)
    return triage_charts(result, progress)
