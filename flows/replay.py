"""The scheduled replay: triage every stored incident again and fail on drift.

It never plans or executes an isolation. It publishes the drift table as artifacts, lists the
isolations older than the review age (from the audit log), and ends Failed when a recorded
verdict or culprit set changed, so that a regression in the analyzer pages someone.
"""

# No `from __future__ import annotations`: see flows/triage.py.

from datetime import UTC, datetime, timedelta
from pathlib import Path

from prefect import flow
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from denpex.isolation.drain_review import overdue_markdown
from denpex.replay import ReplayReport, drift_markdown, load_catalog
from denpex.replay.bounds import bounded_replay_files
from denpex.state_dir import StateDirError, resolve_state_dir
from flows.run_settings import check_this_runs_settings
from tasks.replay import overdue_isolations_task, replay_incident_task
from tasks.options import NOT_PERSISTED

__all__ = ["ReplayDrift", "replay", "DEFAULT_CATALOG", "DEFAULT_REVIEW_AGE_HOURS"]

DEFAULT_CATALOG = "incidents/catalog.json"
# How long a drain may stand before someone must look at it again (a week).
DEFAULT_REVIEW_AGE_HOURS = 168.0


CODE_ROOT = Path(__file__).resolve().parent.parent
"""The folder that holds the running ``flows`` package (the repository root)."""


def _state_dir() -> Path | None:
    try:
        return resolve_state_dir()
    except StateDirError:
        return None


class ReplayDrift(RuntimeError):
    """A stored incident no longer triages as recorded; the run fails with the list."""


@flow(name="denpex-replay", log_prints=False, **NOT_PERSISTED)
def replay(catalog: str = DEFAULT_CATALOG, audit_log: str | None = None,
           review_age_hours: float = DEFAULT_REVIEW_AGE_HOURS) -> ReplayReport:
    """Replay every incident in ``catalog``; list drains in ``audit_log`` older than the review age.
    Both are bounded (``denpex.replay.bounds``): the bundled catalog or files under the state directory."""
    check_this_runs_settings()  # its settings are its worker's, as for every flow
    catalog_file, audit_file = bounded_replay_files(catalog, audit_log, code_root=CODE_ROOT, state_dir=_state_dir())
    loaded = load_catalog(catalog_file)
    futures = [replay_incident_task.submit(incident, loaded) for incident in loaded.incidents]
    report = ReplayReport(outcomes=[f.result() for f in futures])
    create_markdown_artifact(key="replay-drift", markdown=drift_markdown(report),
                             description="Stored incidents triaged again")
    create_table_artifact(key="replay-drift-table", description="One row per stored incident", table=[
        {"incident": o.incident_id, "drift": o.drift.value, "recorded": o.recorded_verdict.value,
         "replayed": o.replayed_verdict.value if o.replayed_verdict else "-", "detail": o.detail}
        for o in report.outcomes])
    if audit_file is not None:
        now = datetime.now(UTC)
        review_age = timedelta(hours=review_age_hours)
        overdue = overdue_isolations_task(audit_file, now, review_age)
        create_markdown_artifact(key="isolations-due-for-review",
                                 markdown=overdue_markdown(overdue, now=now, review_age=review_age))
    if report.failed:
        names = ", ".join(f"{o.incident_id} ({o.detail or o.drift.value})" for o in report.failed)
        raise ReplayDrift(f"{len(report.failed)} stored incident(s) drifted: {names}")
    return report
