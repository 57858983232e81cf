"""Incidents as the service records them: uploads (per rank, per version), telemetry, alerts, run.

Everything here is bookkeeping in the state database; the evidence itself is in the store. A row
is written only after its objects are in the store, so the database never points at nothing.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel

from denpex.evidence.fr_dump import DumpEncoding
from denpex.evidence.stacks import StackSource
from denpex.ingest.database import Database
from denpex.ingest.errors import ConflictError

__all__ = ["IncidentKey", "RunState", "StoredUpload", "StoredTelemetry", "StoredStacks", "IncidentRecord", "IncidentBook",
           "alert_id_for"]

# An alert that claimed the run but never confirmed it (the server died mid-way) is retried after this.
_STALE_CLAIM_S = 60.0


class RunState(StrEnum):
    """Whether the incident's flow run was started by this service."""

    NOT_STARTED = "not_started"
    """No alert has started it yet."""
    STARTING = "starting"
    """An alert is emitting the event right now."""
    STARTED = "started"
    """The event was accepted by the flow engine; repeats start nothing."""


@dataclass(frozen=True, slots=True)
class IncidentKey:
    """An incident within one tenant and cluster."""

    tenant: str
    cluster: str
    incident_id: str


class StoredUpload(BaseModel):
    """One accepted dump file."""

    rank: int
    version: int
    encoding: DumpEncoding
    sha256: str
    object_name: str
    key_id: str
    identity: str
    uploaded_at: float


class StoredTelemetry(BaseModel):
    """One accepted telemetry file and whether it may support a drain."""

    sha256: str
    object_name: str
    trusted: bool
    host: str | None
    key_id: str | None = None
    """The key that sent it (None for one not yet recorded)."""
    size: int | None = None
    """Its bytes (None for a file recorded before sizes were)."""


class StoredStacks(BaseModel):
    """One accepted stacks file: which rank's dump version it came with, and from which source."""

    rank: int
    version: int
    source: StackSource
    sha256: str
    object_name: str
    """The version's own object (``versions/rank_<r>/v<N>.stacks.json``), never overwritten."""


class IncidentRecord(BaseModel):
    """An incident's row."""

    job_id: str
    world_size: int | None
    alert_id: str | None
    alert_time: str | None
    reported_by_rank: int | None
    run_state: RunState
    deliveries: int
    resolved_at: str | None


def alert_id_for(key: IncidentKey) -> str:
    """The idempotency key of an incident's run: the same for every alert about it."""
    digest = hashlib.sha256(f"{key.tenant}/{key.cluster}/{key.incident_id}".encode()).hexdigest()
    return f"alert-{digest[:32]}"


class IncidentBook:
    """Reads and writes incident bookkeeping."""

    def __init__(self, db: Database) -> None:
        self._db = db

    # -- uploads -------------------------------------------------------------------------------

    def uploads(self, key: IncidentKey, rank: int | None = None) -> list[StoredUpload]:
        """Every accepted dump of the incident (of one rank), oldest version first."""
        query = ("SELECT rank, version, encoding, sha256, object_name, key_id, identity, uploaded_at FROM uploads "
                 "WHERE tenant = ? AND cluster = ? AND incident_id = ?")
        args: list[object] = [key.tenant, key.cluster, key.incident_id]
        if rank is not None:
            query += " AND rank = ?"
            args.append(rank)
        with self._db.connect() as db:
            rows = db.execute(query + " ORDER BY rank, version, encoding", args).fetchall()
        return [StoredUpload(rank=r[0], version=r[1], encoding=DumpEncoding(r[2]), sha256=r[3], object_name=r[4],
                             key_id=r[5], identity=r[6], uploaded_at=r[7]) for r in rows]

    def stacks(self, key: IncidentKey, rank: int) -> list[StoredStacks]:
        """Every accepted stacks file of one rank of the incident, oldest version first."""
        with self._db.connect() as db:
            rows = db.execute("SELECT rank, version, source, sha256, object_name FROM stacks WHERE tenant = ? AND "
                              "cluster = ? AND incident_id = ? AND rank = ? ORDER BY version, source",
                              (key.tenant, key.cluster, key.incident_id, rank)).fetchall()
        return [StoredStacks(rank=r[0], version=r[1], source=StackSource(r[2]), sha256=r[3], object_name=r[4])
                for r in rows]

    def record_stacks(self, key: IncidentKey, stacks: list[StoredStacks], key_id: str, now: float) -> None:
        """Stacks rows for a dump already recorded (an identical re-upload that brought them).

        A row another process recorded meanwhile is an :class:`sqlite3.IntegrityError`, and nothing
        of this call stands (the intake undoes its objects and asks for a retry)."""
        with self._db.connect() as db:
            self._insert_stacks(db, key, stacks, key_id, now)

    @staticmethod
    def _insert_stacks(db: sqlite3.Connection, key: IncidentKey, stacks: Sequence[StoredStacks], key_id: str,
                       now: float) -> None:
        for item in stacks:
            db.execute("INSERT INTO stacks (tenant, cluster, incident_id, rank, version, source, sha256, "
                       "object_name, key_id, uploaded_at) VALUES (?,?,?,?,?,?,?,?,?,?)",
                       (key.tenant, key.cluster, key.incident_id, item.rank, item.version, item.source.value,
                        item.sha256, item.object_name, key_id, now))

    def record_upload(self, key: IncidentKey, job_id: str, upload: StoredUpload, world_size: int,
                      telemetry: list[StoredTelemetry], stacks: Sequence[StoredStacks] = ()) -> bool:
        """Record an upload whose objects are stored (with the stacks that came with it); False
        when an identical one got there first."""
        with self._db.connect() as db:
            self._ensure(db, key, job_id, world_size)
            try:
                db.execute("INSERT INTO uploads (tenant, cluster, incident_id, job_id, rank, version, encoding, "
                           "sha256, object_name, key_id, identity, uploaded_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                           (key.tenant, key.cluster, key.incident_id, job_id, upload.rank, upload.version,
                            upload.encoding.value, upload.sha256, upload.object_name, upload.key_id,
                            upload.identity, upload.uploaded_at))
            except sqlite3.IntegrityError:
                return False
            self._insert_stacks(db, key, stacks, upload.key_id, upload.uploaded_at)
            for item in telemetry:
                db.execute("INSERT OR IGNORE INTO telemetry (tenant, cluster, incident_id, sha256, object_name, "
                           "trusted, host, key_id, uploaded_at, size) VALUES (?,?,?,?,?,?,?,?,?,?)",
                           (key.tenant, key.cluster, key.incident_id, item.sha256, item.object_name,
                            int(item.trusted), item.host, upload.key_id, upload.uploaded_at, item.size))
        return True

    def telemetry(self, key: IncidentKey) -> list[StoredTelemetry]:
        """Every accepted telemetry file of the incident."""
        with self._db.connect() as db:
            rows = db.execute("SELECT sha256, object_name, trusted, host, key_id, size FROM telemetry WHERE tenant = ? "
                              "AND cluster = ? AND incident_id = ? ORDER BY object_name",
                              (key.tenant, key.cluster, key.incident_id)).fetchall()
        return [StoredTelemetry(sha256=r[0], object_name=r[1], trusted=bool(r[2]), host=r[3], key_id=r[4], size=r[5])
                for r in rows]

    # -- incidents -----------------------------------------------------------------------------

    def record(self, key: IncidentKey) -> IncidentRecord | None:
        """The incident's row, or None when the service never heard of it."""
        with self._db.connect() as db:
            row = db.execute("SELECT job_id, world_size, alert_id, alert_time, reported_by_rank, run_state, "
                             "deliveries, resolved_at FROM incidents WHERE tenant = ? AND cluster = ? AND "
                             "incident_id = ?", (key.tenant, key.cluster, key.incident_id)).fetchone()
        if row is None:
            return None
        return IncidentRecord(job_id=row[0], world_size=row[1], alert_id=row[2], alert_time=row[3],
                              reported_by_rank=row[4], run_state=RunState(row[5]), deliveries=row[6],
                              resolved_at=row[7])

    def ensure_incident(self, key: IncidentKey, job_id: str) -> None:
        """The incident's row, made for ``job_id`` if new (409 when it belongs to another job)."""
        with self._db.connect() as db:
            self._ensure(db, key, job_id, None)

    def created_at(self, key: IncidentKey) -> float | None:
        """When the service first heard of the incident (server time), or None."""
        with self._db.connect() as db:
            row = db.execute("SELECT created_at FROM incidents WHERE tenant = ? AND cluster = ? AND incident_id = ?",
                             (key.tenant, key.cluster, key.incident_id)).fetchone()
        return row[0] if row else None

    def incidents_of_job(self, tenant: str, cluster: str, job_id: str, limit: int = 64) -> list[str]:
        """The job's unresolved incidents, newest first (bounded: a registration refreshes these)."""
        with self._db.connect() as db:
            rows = db.execute("SELECT incident_id FROM incidents WHERE tenant = ? AND cluster = ? AND job_id = ? "
                              "AND resolved_at IS NULL ORDER BY created_at DESC LIMIT ?",
                              (tenant, cluster, job_id, limit)).fetchall()
        return [r[0] for r in rows]

    def open_incident(self, tenant: str, cluster: str, job_id: str) -> str | None:
        """The newest unresolved incident of the job, which an alert without an incident id joins."""
        with self._db.connect() as db:
            row = db.execute("SELECT incident_id FROM incidents WHERE tenant = ? AND cluster = ? AND job_id = ? "
                             "AND resolved_at IS NULL ORDER BY created_at DESC LIMIT 1",
                             (tenant, cluster, job_id)).fetchone()
        return row[0] if row else None

    def claim_run(self, key: IncidentKey, job_id: str, *, world_size: int | None, alert_time: str,
                  reported_by_rank: int | None) -> str | None:
        """Count one alert delivery; return the alert id when this delivery must start the run.

        Exactly one delivery per incident gets the claim (the transaction holds the write lock),
        unless the claimant failed to start it (:meth:`release_run`) or died mid-way.
        """
        now = time.time()
        alert_id = alert_id_for(key)
        with self._db.connect() as db:
            self._ensure(db, key, job_id, world_size)
            db.execute("UPDATE incidents SET deliveries = deliveries + 1, alert_id = ?, "
                       "alert_time = COALESCE(alert_time, ?), reported_by_rank = COALESCE(reported_by_rank, ?), "
                       "world_size = COALESCE(world_size, ?) WHERE tenant = ? AND cluster = ? AND incident_id = ?",
                       (alert_id, alert_time, reported_by_rank, world_size, key.tenant, key.cluster,
                        key.incident_id))
            claimed = db.execute(
                "UPDATE incidents SET run_state = ?, run_started_at = ? WHERE tenant = ? AND cluster = ? AND "
                "incident_id = ? AND (run_state = ? OR (run_state = ? AND run_started_at < ?))",
                (RunState.STARTING.value, now, key.tenant, key.cluster, key.incident_id,
                 RunState.NOT_STARTED.value, RunState.STARTING.value, now - _STALE_CLAIM_S)).rowcount
        return alert_id if claimed else None

    def runs_started_since(self, tenant: str, cluster: str, since: float) -> list[float]:
        """When this tenant's cluster started incident runs from ``since`` on, oldest first."""
        with self._db.connect() as db:
            rows = db.execute("SELECT started_at FROM run_starts WHERE tenant = ? AND cluster = ? AND started_at >= ? "
                              "ORDER BY started_at", (tenant, cluster, since)).fetchall()
        return [r[0] for r in rows]

    def record_refusal(self, tenant: str, cluster: str, *, status: int, alerts: int, reason: str) -> None:
        """A refused alert delivery, kept so that an operator sees what was not started and why."""
        with self._db.connect() as db:
            db.execute("INSERT INTO refusals (tenant, cluster, refused_at, status, alerts, reason) "
                       "VALUES (?, ?, ?, ?, ?, ?)", (tenant, cluster, time.time(), status, alerts, reason))

    def refusals(self, tenant: str, cluster: str) -> list[tuple[float, int, int, str]]:
        """Refused deliveries of a tenant's cluster: (when, status, alerts, reason), oldest first."""
        with self._db.connect() as db:
            return [(r[0], r[1], r[2], r[3]) for r in db.execute(
                "SELECT refused_at, status, alerts, reason FROM refusals WHERE tenant = ? AND cluster = ? "
                "ORDER BY refused_at", (tenant, cluster)).fetchall()]

    def finish_run_claim(self, key: IncidentKey, started: bool) -> None:
        """The event was accepted (STARTED), or it failed and the next delivery may try again."""
        state = RunState.STARTED if started else RunState.NOT_STARTED
        with self._db.connect() as db:
            db.execute("UPDATE incidents SET run_state = ? WHERE tenant = ? AND cluster = ? AND incident_id = ?",
                       (state.value, key.tenant, key.cluster, key.incident_id))
            if started:
                db.execute("INSERT INTO run_starts (tenant, cluster, incident_id, started_at) VALUES (?, ?, ?, ?)",
                           (key.tenant, key.cluster, key.incident_id, time.time()))

    def record_resolved(self, key: IncidentKey, job_id: str, resolved_at: str) -> None:
        """A ``resolved`` notification: recorded on the incident (the run, if any, is left alone)."""
        with self._db.connect() as db:
            self._ensure(db, key, job_id, None)
            db.execute("UPDATE incidents SET resolved_at = ?, deliveries = deliveries + 1 WHERE tenant = ? AND "
                       "cluster = ? AND incident_id = ?", (resolved_at, key.tenant, key.cluster, key.incident_id))

    def world_size(self, key: IncidentKey) -> int | None:
        """The world size the identities (or the alert) gave."""
        record = self.record(key)
        if record is None:
            return None
        if record.world_size is not None:
            return record.world_size
        sizes = {json.loads(u.identity)["world_size"] for u in self.uploads(key)}
        return max(sizes) if sizes else None

    @staticmethod
    def _ensure(db: sqlite3.Connection, key: IncidentKey, job_id: str, world_size: int | None) -> None:
        """The incident's row, made for ``job_id`` if new; a row of another job is a conflict (409).

        Checked inside the caller's write transaction: a check made before it would let an alert
        for another job open the incident in between, and the upload or alert would then land in
        (or start the run of) the wrong job's incident.
        """
        db.execute("INSERT OR IGNORE INTO incidents (tenant, cluster, incident_id, job_id, world_size, created_at) "
                   "VALUES (?, ?, ?, ?, ?, ?)", (key.tenant, key.cluster, key.incident_id, job_id, world_size,
                                                time.time()))
        owner = db.execute("SELECT job_id FROM incidents WHERE tenant = ? AND cluster = ? AND incident_id = ?",
                           (key.tenant, key.cluster, key.incident_id)).fetchone()[0]
        if owner != job_id:
            raise ConflictError(f"incident {key.incident_id!r} belongs to job {owner!r}, not {job_id!r}; each "
                                "hang of each job has its own incident id, and nothing was recorded")
