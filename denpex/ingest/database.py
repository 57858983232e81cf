"""The ingest service's SQLite database in ``$DENPEX_STATE_DIR``, readable by the service user only.

One short-lived connection per unit of work (SQLite connections are cheap, and this keeps the
server's worker threads from sharing one). WAL mode lets readers run beside the one writer.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from denpex.state_paths import INGEST_DATABASE

__all__ = ["Database"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tenants (
    name TEXT PRIMARY KEY, plan TEXT NOT NULL, created_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS keys (
    key_id TEXT PRIMARY KEY, tenant TEXT NOT NULL REFERENCES tenants(name), cluster TEXT NOT NULL,
    host TEXT, secret_encrypted BLOB NOT NULL, created_at REAL NOT NULL, revoked_at REAL);
CREATE TABLE IF NOT EXISTS tokens (
    token_sha256 TEXT PRIMARY KEY, token_id TEXT NOT NULL UNIQUE,
    tenant TEXT NOT NULL REFERENCES tenants(name), cluster TEXT NOT NULL,
    created_at REAL NOT NULL, revoked_at REAL);
CREATE TABLE IF NOT EXISTS nonces (
    key_id TEXT NOT NULL, nonce TEXT NOT NULL, expires_at REAL NOT NULL, PRIMARY KEY (key_id, nonce));
CREATE TABLE IF NOT EXISTS incidents (
    tenant TEXT NOT NULL, cluster TEXT NOT NULL, incident_id TEXT NOT NULL, job_id TEXT NOT NULL,
    world_size INTEGER, alert_id TEXT, alert_time TEXT, reported_by_rank INTEGER,
    run_state TEXT NOT NULL DEFAULT 'not_started', run_started_at REAL, deliveries INTEGER NOT NULL DEFAULT 0,
    resolved_at TEXT, created_at REAL NOT NULL,
    PRIMARY KEY (tenant, cluster, incident_id));
-- A job's incidents, newest first: a registration asks whether one opened since a rank's process started.
CREATE INDEX IF NOT EXISTS incidents_by_job ON incidents (tenant, cluster, job_id, created_at);
CREATE TABLE IF NOT EXISTS uploads (
    tenant TEXT NOT NULL, cluster TEXT NOT NULL, incident_id TEXT NOT NULL, job_id TEXT NOT NULL,
    rank INTEGER NOT NULL, version INTEGER NOT NULL, encoding TEXT NOT NULL, sha256 TEXT NOT NULL,
    object_name TEXT NOT NULL, key_id TEXT NOT NULL, identity TEXT NOT NULL, uploaded_at REAL NOT NULL,
    PRIMARY KEY (tenant, cluster, incident_id, rank, version, encoding));
CREATE TABLE IF NOT EXISTS run_starts (
    tenant TEXT NOT NULL, cluster TEXT NOT NULL, incident_id TEXT NOT NULL, started_at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS run_starts_by_cluster ON run_starts (tenant, cluster, started_at);
CREATE TABLE IF NOT EXISTS refusals (
    tenant TEXT NOT NULL, cluster TEXT NOT NULL, refused_at REAL NOT NULL, status INTEGER NOT NULL,
    alerts INTEGER NOT NULL, reason TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS telemetry (
    tenant TEXT NOT NULL, cluster TEXT NOT NULL, incident_id TEXT NOT NULL, sha256 TEXT NOT NULL,
    object_name TEXT NOT NULL, trusted INTEGER NOT NULL, host TEXT, key_id TEXT NOT NULL,
    uploaded_at REAL NOT NULL, PRIMARY KEY (tenant, cluster, incident_id, sha256, trusted));
-- Stacks files that came with a dump (denpex.ingest.stacks_check), one per source per dump version.
CREATE TABLE IF NOT EXISTS stacks (
    tenant TEXT NOT NULL, cluster TEXT NOT NULL, incident_id TEXT NOT NULL, rank INTEGER NOT NULL,
    version INTEGER NOT NULL, source TEXT NOT NULL, sha256 TEXT NOT NULL, object_name TEXT NOT NULL,
    key_id TEXT NOT NULL, uploaded_at REAL NOT NULL,
    PRIMARY KEY (tenant, cluster, incident_id, rank, version, source));
-- Job layouts registered by collectors at start (denpex.ingest.registration), per tenant and cluster.
CREATE TABLE IF NOT EXISTS jobs_registered (
    tenant TEXT NOT NULL, cluster TEXT NOT NULL, job_id TEXT NOT NULL, world_size INTEGER NOT NULL,
    process_groups TEXT NOT NULL, updated_at REAL NOT NULL, PRIMARY KEY (tenant, cluster, job_id));
CREATE TABLE IF NOT EXISTS job_ranks (
    tenant TEXT NOT NULL, cluster TEXT NOT NULL, job_id TEXT NOT NULL, rank INTEGER NOT NULL, host TEXT,
    identity TEXT NOT NULL, key_id TEXT NOT NULL, registered_at REAL NOT NULL,
    PRIMARY KEY (tenant, cluster, job_id, rank));
CREATE TABLE IF NOT EXISTS job_rank_moves (
    tenant TEXT NOT NULL, cluster TEXT NOT NULL, job_id TEXT NOT NULL, rank INTEGER NOT NULL,
    from_host TEXT NOT NULL, to_host TEXT NOT NULL, from_identity TEXT NOT NULL, key_id TEXT NOT NULL,
    moved_at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS job_rank_moves_by_job ON job_rank_moves (tenant, cluster, job_id, moved_at);
CREATE INDEX IF NOT EXISTS job_rank_moves_by_rank ON job_rank_moves (tenant, cluster, job_id, rank, moved_at);
-- Every identity a rank's registration replaced (a restart, on its node or another), with the time:
-- an incident opened before takes the identity of the process that died (JobRegistry.placement_at).
CREATE TABLE IF NOT EXISTS job_rank_history (
    tenant TEXT NOT NULL, cluster TEXT NOT NULL, job_id TEXT NOT NULL, rank INTEGER NOT NULL,
    identity TEXT NOT NULL, key_id TEXT NOT NULL, replaced_at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS job_rank_history_by_rank ON job_rank_history (tenant, cluster, job_id, rank, replaced_at);
CREATE INDEX IF NOT EXISTS job_rank_history_by_time ON job_rank_history (tenant, cluster, job_id, replaced_at);
-- What a job's world size and process groups were before a registration changed them, so that an
-- incident opened before the change keeps the layout it had (JobRegistry.placement_at).
CREATE TABLE IF NOT EXISTS job_layout_changes (
    tenant TEXT NOT NULL, cluster TEXT NOT NULL, job_id TEXT NOT NULL, from_world_size INTEGER NOT NULL,
    from_groups TEXT NOT NULL, key_id TEXT NOT NULL, changed_at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS job_layout_changes_by_job ON job_layout_changes (tenant, cluster, job_id, changed_at);
CREATE TABLE IF NOT EXISTS registrations (
    tenant TEXT NOT NULL, cluster TEXT NOT NULL, registered_at REAL NOT NULL, ranks INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS registrations_by_cluster ON registrations (tenant, cluster, registered_at);
-- One row per cluster, keyed by its block-name slug (denpex.tenancy.cluster_slug) so that two
-- spellings of one block name cannot both be held. tenant is NULL while contested (keys made
-- before ownership named it for several tenants; contested_by says who).
CREATE TABLE IF NOT EXISTS clusters (
    slug TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, tenant TEXT REFERENCES tenants(name),
    contested_by TEXT, claimed_at REAL NOT NULL);
"""


class Database:
    """The SQLite file under the state directory, created with mode 0600 on first use."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.path = state_dir / INGEST_DATABASE
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not self.path.exists():
            # Created before SQLite opens it, so it is never readable by others, not even briefly.
            os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
        db = sqlite3.connect(self.path, timeout=30)
        try:
            db.executescript(_SCHEMA)  # runs its own transaction
            _add_columns(db)
        finally:
            db.close()

    @contextmanager
    def connect(self, *, read_only: bool = False) -> Iterator[sqlite3.Connection]:
        """A connection in one transaction: committed when the block ends, rolled back on error.

        ``read_only``: a deferred transaction that takes no write lock, so a long read (a 16,384-rank
        layout) never holds other tenants' writes back (WAL readers see one snapshot).
        """
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA busy_timeout=30000")
            db.execute("BEGIN DEFERRED" if read_only else "BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        finally:
            db.close()


# Columns added after a table was first made: (table, column, its SQL). A state directory from
# before gets them when it is opened; rows already there hold NULL.
_ADDED_COLUMNS = (
    ("telemetry", "size", "INTEGER"),  # issue 30: the bytes each key added to an incident are capped
)


def _add_columns(db: sqlite3.Connection) -> None:
    for table, column, kind in _ADDED_COLUMNS:
        present = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}  # noqa: S608 - names above
        if column not in present:
            try:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
            except sqlite3.OperationalError as exc:  # another process opening the state added it meanwhile
                if "duplicate column" not in str(exc):
                    raise
            db.commit()
