"""The approval page's database: the runs waiting for a decision, the one decision each run gets,
and every answer given on the page.

One SQLite file in the state directory (``approvals.sqlite3``, mode 0600), shared by the flow's
workers (they write a pending row before they pause) and the page (it writes decisions and
answers). Nothing here is reachable through the Prefect API, which is why the flow reads the
decision from here before it acts, never only from the run's input::

    book = ApprovalBook(state_dir)
    book.add_pending(PendingApproval(run_id=..., ...))      # the flow, before it pauses
    book.record_decision(run_id, signed_record)              # the page: True once per run
    book.decision(run_id)                                     # the flow, after it resumes
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from denpex.isolation.approval import Approval
from denpex.isolation.plan import Operation

__all__ = ["BOOK_NAME", "MAX_ANSWERS_PER_RUN", "PendingApproval", "StoredAnswer", "ApprovalBook"]

BOOK_NAME = "approvals.sqlite3"
MAX_ANSWERS_PER_RUN = 1000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS pending (
    run_id TEXT PRIMARY KEY, tenant TEXT, cluster TEXT NOT NULL, incident_id TEXT NOT NULL,
    operation TEXT NOT NULL, plan_path TEXT NOT NULL, plan_hash TEXT NOT NULL, runbook TEXT NOT NULL,
    brief_path TEXT NOT NULL, created_at REAL NOT NULL, expires_at REAL NOT NULL);
-- One decision per run: the primary key makes a second one fail, whichever page process tries.
CREATE TABLE IF NOT EXISTS decisions (
    run_id TEXT PRIMARY KEY, decision TEXT NOT NULL, approver TEXT NOT NULL, record TEXT NOT NULL,
    decided_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS answers (
    id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, at REAL NOT NULL, address TEXT NOT NULL,
    approver TEXT NOT NULL, decision TEXT NOT NULL, outcome TEXT NOT NULL, reason TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS answers_by_address ON answers (address, at);
-- One question per incident at a time, whatever the operation: they share the incident's plan file.
-- The run that claimed it holds it until it ends, or until its claim expires (tenant '' for none).
CREATE TABLE IF NOT EXISTS claims (
    tenant TEXT NOT NULL, cluster TEXT NOT NULL, incident_id TEXT NOT NULL, run_id TEXT NOT NULL,
    expires_at REAL NOT NULL, PRIMARY KEY (tenant, cluster, incident_id));
CREATE INDEX IF NOT EXISTS answers_by_run ON answers (run_id, at);
"""


class PendingApproval(BaseModel):
    """A paused run waiting for its decision, as the flow's worker wrote it (paths inside the
    state directory, relative to it)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: str
    tenant: str | None
    cluster: str
    incident_id: str
    operation: Operation
    plan_path: str
    plan_hash: str
    runbook: str
    """The operator's runbook file the run executes (absolute): who may approve, which factor."""
    brief_path: str
    created_at: float
    expires_at: float
    """When the run's pause times out: no decision is taken after it."""


class StoredAnswer(BaseModel):
    """One answer given on the page, accepted or not."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    at: float
    address: str
    approver: str
    decision: str
    outcome: str
    reason: str


class ApprovalBook:
    """Reads and writes the approval page's database under one state directory."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / BOOK_NAME
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not self.path.exists():
            # Created before SQLite opens it, so it is never readable by others, not even briefly.
            os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
        with self._connect() as db:
            db.executescript(_SCHEMA)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=30)
        try:
            db.execute("PRAGMA busy_timeout=30000")
            with db:  # one transaction, committed at the end of the block
                yield db
        finally:
            db.close()

    # -- pending runs -------------------------------------------------------------------------

    def add_pending(self, pending: PendingApproval) -> None:
        """Register (or, for the same run, replace) a run that waits for its decision."""
        with self._connect() as db:
            db.execute("INSERT OR REPLACE INTO pending VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                       (pending.run_id, pending.tenant, pending.cluster, pending.incident_id,
                        pending.operation.value, pending.plan_path, pending.plan_hash, pending.runbook,
                        pending.brief_path, pending.created_at, pending.expires_at))

    def pending(self, run_id: str) -> PendingApproval | None:
        with self._connect() as db:
            row = db.execute("SELECT * FROM pending WHERE run_id = ?", (run_id,)).fetchone()
        return _pending(row) if row else None

    def waiting(self, now: float | None = None, limit: int = 200) -> list[PendingApproval]:
        """Runs still waiting (not decided, not expired), newest first."""
        with self._connect() as db:
            rows = db.execute("SELECT * FROM pending WHERE expires_at > ? AND run_id NOT IN (SELECT run_id FROM "
                              "decisions) ORDER BY created_at DESC LIMIT ?",
                              (time.time() if now is None else now, limit)).fetchall()
        return [_pending(row) for row in rows]

    # -- decisions ----------------------------------------------------------------------------

    def record_decision(self, record: Approval, *, at: float) -> bool:
        """Keep ``record`` as its run's one decision; False when the run already has one."""
        if record.flow_run_id is None or record.decision is None:
            raise ValueError("a decision record names its run and its decision")
        try:
            with self._connect() as db:
                db.execute("INSERT INTO decisions VALUES (?,?,?,?,?)",
                           (record.flow_run_id, record.decision, record.approver, record.model_dump_json(), at))
        except sqlite3.IntegrityError:
            return False
        return True

    def decision(self, run_id: str) -> Approval | None:
        """The run's recorded decision; None when it has none. A row that no longer parses is
        refused loudly (ValueError): the decision store is the operator's, and damage must show."""
        with self._connect() as db:
            row = db.execute("SELECT record FROM decisions WHERE run_id = ?", (run_id,)).fetchone()
        if row is None:
            return None
        try:
            return Approval.model_validate_json(row[0])
        except ValidationError as exc:
            raise ValueError(f"the decision recorded for run {run_id} in {self.path} does not parse: {exc}") from exc

    def forget_decision(self, run_id: str) -> None:
        """Remove a decision the page could not write to the audit log (it never stood)."""
        with self._connect() as db:
            db.execute("DELETE FROM decisions WHERE run_id = ?", (run_id,))

    # -- claims: one run per incident at a time -------------------------------------------------

    def claim(self, tenant: str | None, cluster: str, incident_id: str, run_id: str, *, expires_at: float,
              replacing: str | None = None, now: float | None = None) -> str | None:
        """Claim the incident for ``run_id`` until ``expires_at``: None once it is this run's, else
        the run that holds it. An expired claim, the run's own, or ``replacing``'s (a run the
        caller found ended) is taken over. One transaction that takes the write lock first, so of
        two runs claiming at once, across processes, exactly one gets it."""
        key = (tenant or "", cluster, incident_id)
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            row = db.execute("SELECT run_id, expires_at FROM claims WHERE tenant = ? AND cluster = ? AND "
                             "incident_id = ?", key).fetchone()
            current = time.time() if now is None else now
            if row is not None and row[0] not in (run_id, replacing) and row[1] > current:
                return str(row[0])
            db.execute("INSERT OR REPLACE INTO claims VALUES (?,?,?,?,?)", (*key, run_id, expires_at))
        return None

    def release(self, tenant: str | None, cluster: str, incident_id: str, run_id: str) -> None:
        """Let go of the incident, if ``run_id`` holds it."""
        with self._connect() as db:
            db.execute("DELETE FROM claims WHERE tenant = ? AND cluster = ? AND incident_id = ? AND run_id = ?",
                       (tenant or "", cluster, incident_id, run_id))

    # -- answers ------------------------------------------------------------------------------

    def record_answer(self, answer: StoredAnswer) -> None:
        """Keep one answer. Whoever reaches the page may post any number, and the file must not grow
        without bound: answers refused before any code was checked are kept up to
        ``MAX_ANSWERS_PER_RUN`` per run. A wrong code and the decision itself are always kept: the
        address lockout counts the wrong codes, so filling the run's log first must not switch it
        off (red team, issue 30), and the approver's own lockout bounds how many there can be."""
        with self._connect() as db:
            db.execute("INSERT INTO answers (run_id, at, address, approver, decision, outcome, reason) "
                       "SELECT ?,?,?,?,?,?,? WHERE ? IN ('wrong_code', 'recorded') OR "
                       "(SELECT COUNT(*) FROM answers WHERE run_id = ?) < ?",
                       (answer.run_id, answer.at, answer.address, answer.approver[:200], answer.decision[:20],
                        answer.outcome, answer.reason[:2000], answer.outcome, answer.run_id, MAX_ANSWERS_PER_RUN))

    def answers(self, run_id: str) -> list[StoredAnswer]:
        """Every answer given for ``run_id``, oldest first."""
        with self._connect() as db:
            rows = db.execute("SELECT run_id, at, address, approver, decision, outcome, reason FROM answers "
                              "WHERE run_id = ? ORDER BY id", (run_id,)).fetchall()
        return [StoredAnswer(run_id=r[0], at=r[1], address=r[2], approver=r[3], decision=r[4], outcome=r[5],
                             reason=r[6]) for r in rows]

    def refused_from(self, address: str, since: float) -> int:
        """How many answers from ``address`` were refused for a wrong code since ``since``."""
        with self._connect() as db:
            row = db.execute("SELECT COUNT(*) FROM answers WHERE address = ? AND at > ? AND outcome = 'wrong_code'",
                             (address, since)).fetchone()
        return int(row[0])


def _pending(row: tuple[object, ...]) -> PendingApproval:
    names = list(PendingApproval.model_fields)
    return PendingApproval.model_validate(dict(zip(names, row)))
