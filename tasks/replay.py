"""Thin Prefect tasks over the replay core (``denpex.replay``) and the drain review."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from prefect import task

from denpex.isolation.audit import AuditLog
from denpex.isolation.drain_review import StandingIsolation, overdue_isolations
from denpex.replay import IncidentCatalog, RecordedIncident, ReplayOutcome, replay_incident
from tasks.options import NOT_CACHED

__all__ = ["replay_incident_task", "overdue_isolations_task"]


@task(name="replay-incident", task_run_name="replay {incident.incident_id}", **NOT_CACHED)
def replay_incident_task(incident: RecordedIncident, catalog: IncidentCatalog) -> ReplayOutcome:
    """Triage one stored incident again (never remediation) and compare."""
    return replay_incident(incident, catalog)


@task(name="isolations-due-for-review", **NOT_CACHED)
def overdue_isolations_task(audit_log: Path, now: datetime, review_age: timedelta) -> list[StandingIsolation]:
    """Isolations in the audit log older than the review age; an absent log has none."""
    if not audit_log.exists():
        return []
    return overdue_isolations(AuditLog(audit_log).records(), now=now, review_age=review_age)
