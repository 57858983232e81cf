"""Publish the report: markdown (verdict, reasons, plan) and a table of candidates and actions."""

from __future__ import annotations

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from denpex.isolation.plan import IsolationPlan
from denpex.report import TriageReport
from denpex.workflow.markdown import candidate_rows, decision_markdown
from tasks.options import NOT_CACHED

__all__ = ["publish_report", "publish_decision"]


@task(name="publish-report", **NOT_CACHED)
def publish_report(report: TriageReport, plan: IsolationPlan | None, markdown: str, key_prefix: str) -> None:
    create_markdown_artifact(markdown=markdown, key=f"{key_prefix}-report",
                             description="Verdict, reasons and proposed actions")
    rows = candidate_rows(report, plan)
    if rows:
        create_table_artifact(table=rows, key=f"{key_prefix}-candidates",
                              description="Candidates and planned actions")


@task(name="publish-decision", **NOT_CACHED)
def publish_decision(incident_id: str, outcome: str, reason: str, key_prefix: str) -> None:
    create_markdown_artifact(markdown=decision_markdown(incident_id, outcome, reason),
                             key=f"{key_prefix}-decision", description=f"Outcome: {outcome}")
