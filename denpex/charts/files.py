"""Write a triage's charts as PNG files: the overview at the given path, the groups beside it."""

from __future__ import annotations

from pathlib import Path

from denpex.analysis.job_progress import JobProgress
from denpex.analysis.models import TriageResult
from denpex.charts import triage_charts

__all__ = ["write_charts"]


def write_charts(result: TriageResult, progress: JobProgress, overview_path: Path) -> list[Path]:
    """``out.png`` gets the overview, ``out.group-2-3.png`` the chart of group "2" stuck at #3."""
    written = []
    for chart in triage_charts(result, progress):
        path = overview_path if chart.name == "overview" else overview_path.with_name(
            f"{overview_path.stem}.{chart.name}{overview_path.suffix or '.png'}")
        path.write_bytes(chart.png)
        written.append(path)
    return written
