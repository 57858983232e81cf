"""The alert's facts come from the ingest service's record of the incident, never from the run's
parameters, which anyone who reaches the Prefect API chooses.

``alert_time`` decides which ranks are stale, ``world_size`` which are missing, and ``job_id``
which folder is the incident's and which job the scheduler is asked about. For a cluster the
operator's registry gives to a tenant, the ingest service has the incident's row in the state
directory (``ingest.sqlite3``: the job, the world size, the first alert's time); it is read here,
read-only:

    bind_incident(state, tenant="acme", cluster="gpu-prod", incident_id="inc-7",
                  job_id="job-1", alert_time=<param>, world_size=<param>)
      row (job-1, 4, 2026-11-29T20:29:50Z)        -> BoundIncident(job-1, 20:29:50, 4, note if a parameter differed)
      row of another job                           -> FlowParameterError
      no row (the service never heard of it)       -> FlowParameterError
      cluster nobody registered (single-tenant)    -> the parameters, with a note saying so
      cluster of another tenant (or contested)     -> the parameters: the run is refused at its target

Without an alert time on the row (uploads came, no alert yet), the time the service first heard
of the incident stands in: the service's own clock, never the caller's.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from denpex.state_paths import INGEST_DATABASE
from denpex.tenancy import OwnershipState, read_ownership
from denpex.workflow.flow_parameters import FlowParameterError

__all__ = ["BoundIncident", "bind_incident"]


@dataclass(frozen=True, slots=True)
class BoundIncident:
    """What the run triages with."""

    job_id: str
    alert_time: datetime
    world_size: int | None
    note: str = ""
    """Said in the run's log: where the facts came from, and which parameters were set aside."""


def bind_incident(state_dir: Path, *, tenant: str, cluster: str, incident_id: str, job_id: str,
                  alert_time: datetime, world_size: int | None) -> BoundIncident:
    """The incident's job, alert time and world size (see the module docstring)."""
    ownership = read_ownership(state_dir, cluster)
    if ownership.state is OwnershipState.UNREGISTERED:
        return BoundIncident(job_id, alert_time, world_size, note=f"cluster {cluster!r} has no registered owner: "
                             "the run's own alert time, world size and job id are used")
    if ownership.state is not OwnershipState.OWNED or ownership.tenant != tenant:
        # Not this tenant's cluster (or nobody's for sure): the run is refused at its target, and
        # no record of another tenant's incident is read for it.
        return BoundIncident(job_id, alert_time, world_size, note=f"cluster {cluster!r} is not tenant {tenant!r}'s "
                             "in the operator's registry: nothing will be acted on")
    row = _incident_row(state_dir, tenant, cluster, incident_id)
    if row is None:
        raise FlowParameterError(f"the ingest service has no incident {incident_id!r} of tenant {tenant!r} on cluster "
                                 f"{cluster!r}: an incident run of a registered cluster starts from the service's "
                                 "alert or uploads; nothing was done")
    recorded_job, recorded_size, recorded_time, created_at, upload_sizes = row
    if recorded_job != job_id:
        raise FlowParameterError(f"incident {incident_id!r} belongs to job {recorded_job!r} in the ingest service's "
                                 f"record, not {job_id!r}; nothing was done")
    when = _parse_time(recorded_time) if recorded_time else datetime.fromtimestamp(created_at, UTC)
    size = recorded_size if recorded_size is not None else (max(upload_sizes) if upload_sizes else None)
    differs = [f"{name} {given} (recorded {kept})" for name, given, kept in
               (("alert_time", _iso(alert_time), _iso(when)), ("world_size", world_size, size)) if given != kept]
    note = "alert time and world size from the ingest service's record"
    if differs:
        note += "; the run's parameters said " + ", ".join(differs) + ", set aside"
    return BoundIncident(recorded_job, when, size, note=note)


def _incident_row(state_dir: Path, tenant: str, cluster: str,
                  incident_id: str) -> tuple[str, int | None, str | None, float, list[int]] | None:
    path = state_dir / INGEST_DATABASE
    if not path.exists():
        return None
    db = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=30)
    try:
        row = db.execute("SELECT job_id, world_size, alert_time, created_at FROM incidents WHERE tenant = ? AND "
                         "cluster = ? AND incident_id = ?", (tenant, cluster, incident_id)).fetchone()
        if row is None:
            return None
        sizes = [] if row[1] is not None else [
            int(json.loads(identity)["world_size"]) for (identity,) in db.execute(
                "SELECT identity FROM uploads WHERE tenant = ? AND cluster = ? AND incident_id = ?",
                (tenant, cluster, incident_id))]
    finally:
        db.close()
    return str(row[0]), row[1], row[2], float(row[3]), sizes


def _parse_time(text: str) -> datetime:
    parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat()
