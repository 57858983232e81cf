"""Publish the report (verdict, candidates, plan, charts) and the decision as artifacts."""

from __future__ import annotations

from prefect import task
from prefect.artifacts import create_markdown_artifact

from denpex.workflow.markdown import decision_markdown
from tasks.options import NOT_CACHED

__all__ = ["publish_report", "publish_decision"]


def publish_report(markdown: str, key_prefix: str) -> None:
    """The report, as the run's own artifact. Called from the flow, not from a task: the run's
    Artifacts tab lists the run's own artifacts first (under "Flow run", which read "None" while
    every artifact came from a task) and its tasks' artifacts after, each group in no fixed order.
    So the report is the first thing there; the coverage and the decision follow. It holds the
    candidates and every chart, which were once artifacts of their own."""
    create_markdown_artifact(markdown=markdown, key=f"{key_prefix}-report",
                             description="The report: verdict, candidates, proposed actions, charts")


@task(name="publish-decision", **NOT_CACHED)
def publish_decision(incident_id: str, outcome: str, reason: str, key_prefix: str) -> None:
    create_markdown_artifact(markdown=decision_markdown(incident_id, outcome, reason),
                             key=f"{key_prefix}-decision", description=f"Outcome: {outcome}")
