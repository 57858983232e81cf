"""The audit log: append-only JSON lines, each record holding the hash of the one before.

One record per line. ``hash`` is SHA-256 over the canonical JSON of the record without ``hash``;
``prev_hash`` is the previous record's ``hash`` (64 zeros for the first). Editing, deleting or
reordering a line breaks the chain, and ``verify_audit_log`` names the line.

Every action is bracketed: an ``intent`` record is written (and fsynced) before the command is
sent, a ``result`` record after it with the rc, the output and the verified state. An intent with
no result means the executor died in between; the executor resolves it by reading the node's
real state (``pending_intents``), never by repeating the command blindly.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import BinaryIO

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from denpex.evidence.errors import EvidenceError
from denpex.evidence.store import EvidenceStore
from denpex.isolation.errors import AuditError, StoreError
from denpex.isolation.plan import Operation, canonical_json

__all__ = [
    "GENESIS_HASH",
    "AuditKind",
    "Outcome",
    "AuditEntry",
    "AuditRecord",
    "AuditVerification",
    "AuditLog",
    "verify_audit_log",
    "copy_audit_log",
]

GENESIS_HASH = "0" * 64
MAX_OUTPUT_CHARS = 4000
_TAIL_CHUNK = 65536


class AuditKind(StrEnum):
    """What a record says."""

    INTENT = "intent"
    """About to send a command that changes a node. Written before sending."""
    RESULT = "result"
    """What happened to an intent: rc, output, verified state. Points at the intent."""
    SKIP = "skip"
    """No command was sent for a node (already done, or a gate blocked it at execution time)."""
    BREAKER = "breaker"
    """The circuit breaker was tripped by this execution."""


class Outcome(StrEnum):
    """How a node ended up, as recorded in ``result`` and ``skip`` records."""

    APPLIED = "applied"
    """The command ran and the post-checks passed."""
    FAILED = "failed"
    """The command failed, or the post-checks did not pass."""
    RECOVERED_APPLIED = "recovered_applied"
    """A dangling intent whose action the node's state shows as done."""
    RECOVERED_NOT_APPLIED = "recovered_not_applied"
    """A dangling intent whose action the node's state shows as not done."""
    ALREADY_DONE = "already_done"
    """Nothing to do: the node is already in the wanted state under this incident."""
    BLOCKED = "blocked"
    """A gate refused the node at execution time."""


class AuditEntry(BaseModel):
    """The caller's part of a record; the log adds seq, time and the chain."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: AuditKind
    incident_id: str
    plan_hash: str
    operation: Operation
    approver: str | None = None
    node: str | None = None
    action: str | None = None
    command: str | None = None
    rc: int | None = None
    output: str | None = None
    outcome: Outcome | None = None
    message: str = ""
    intent_seq: int | None = None
    state: str | None = None
    running_jobs: tuple[str, ...] = ()


class AuditRecord(AuditEntry):
    """One line of the log."""

    seq: int = Field(ge=1)
    time: datetime
    prev_hash: str
    hash: str

    def expected_hash(self) -> str:
        body = self.model_dump(mode="json", exclude={"hash"})
        return hashlib.sha256(canonical_json(body).encode()).hexdigest()


class AuditVerification(BaseModel):
    """The answer of ``denpex audit verify``."""

    model_config = ConfigDict(frozen=True)

    path: str
    records: int
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems


class AuditLog:
    """The log at ``path``. Appends are serialized with an exclusive lock and fsynced."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def append(self, entry: AuditEntry, *, at: datetime) -> AuditRecord:
        """Chain ``entry`` onto the last record and write it durably before returning."""
        if entry.output is not None and len(entry.output) > MAX_OUTPUT_CHARS:
            entry = entry.model_copy(update={"output": entry.output[:MAX_OUTPUT_CHARS] + "...[cut]"})
        with self._locked() as handle:
            last = self._last_record(handle)
            record = AuditRecord(
                **entry.model_dump(),
                seq=last.seq + 1 if last else 1,
                time=at,
                prev_hash=last.hash if last else GENESIS_HASH,
                hash="",
            )
            record = record.model_copy(update={"hash": record.expected_hash()})
            handle.seek(0, os.SEEK_END)
            handle.write((canonical_json(record.model_dump(mode="json")) + "\n").encode())
            handle.flush()
            os.fsync(handle.fileno())
        return record

    def records(self) -> list[AuditRecord]:
        """Every record, validated; a damaged line raises AuditError naming it."""
        records = []
        for number, line in self._lines():
            try:
                records.append(AuditRecord.model_validate_json(line))
            except ValidationError as exc:
                raise AuditError(
                    f"{self.path} line {number} is not an audit record ({exc.error_count()} problems); "
                    f"run `denpex audit verify {self.path}`"
                ) from exc
        return records

    def pending_intents(self, plan_hash: str, operation: Operation) -> list[AuditRecord]:
        """Intents of this plan and operation that have no result: the executor died in between."""
        records = [r for r in self.records() if r.plan_hash == plan_hash and r.operation is operation]
        answered = {r.intent_seq for r in records if r.kind is AuditKind.RESULT}
        return [r for r in records if r.kind is AuditKind.INTENT and r.seq not in answered]

    def _lines(self) -> Iterator[tuple[int, str]]:
        try:
            with self.path.open("r", encoding="utf-8") as handle:
                for number, line in enumerate(handle, start=1):
                    if line.strip():
                        yield number, line
        except FileNotFoundError:
            return
        except OSError as exc:
            raise AuditError(f"{self.path}: cannot read audit log: {exc.strerror or exc}") from exc

    @contextmanager
    def _locked(self) -> Iterator[BinaryIO]:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle = self.path.open("a+b")
        except OSError as exc:
            raise AuditError(f"{self.path}: cannot open audit log for writing: {exc.strerror or exc}") from exc
        with handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield handle
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _last_record(self, handle: BinaryIO) -> AuditRecord | None:
        """Read only the file's tail: the log grows for ever, appends stay cheap."""
        size = handle.seek(0, os.SEEK_END)
        if size == 0:
            return None
        start = max(0, size - _TAIL_CHUNK)
        handle.seek(start)
        tail = handle.read()
        if not tail.endswith(b"\n"):
            raise AuditError(
                f"{self.path} ends with a partial record (a crash mid-write?); run "
                f"`denpex audit verify {self.path}` and repair it before acting again"
            )
        lines = tail.rstrip(b"\n").split(b"\n")
        if start > 0 and len(lines) < 2:
            raise AuditError(f"{self.path}: last record is longer than {_TAIL_CHUNK} bytes")
        try:
            last = AuditRecord.model_validate_json(lines[-1])
        except ValidationError as exc:
            raise AuditError(
                f"{self.path}: the last line is not an audit record; run `denpex audit verify {self.path}`"
            ) from exc
        if last.hash != last.expected_hash():
            raise AuditError(
                f"{self.path}: the last record (seq {last.seq}) was altered; run "
                f"`denpex audit verify {self.path}` before acting again"
            )
        return last


def verify_audit_log(path: Path) -> AuditVerification:
    """Check every line's hash and the chain; report every problem with its line number."""
    problems: list[str] = []
    previous_hash = GENESIS_HASH
    previous_seq = 0
    count = 0
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise AuditError(f"{path}: cannot read audit log: {exc.strerror or exc}") from exc
    if raw and not raw.endswith(b"\n"):
        problems.append("the file ends with a partial line (a crash mid-write, or a truncation)")
    for number, line in enumerate(raw.decode("utf-8", "replace").splitlines(), start=1):
        if not line.strip():
            problems.append(f"line {number}: empty line")
            continue
        count += 1
        try:
            record = AuditRecord.model_validate(json.loads(line))
        except (json.JSONDecodeError, ValidationError) as exc:
            problems.append(f"line {number}: not an audit record ({type(exc).__name__})")
            previous_hash, previous_seq = "", previous_seq + 1
            continue
        if record.hash != record.expected_hash():
            problems.append(f"line {number} (seq {record.seq}): content does not match its hash; "
                            "the line was edited")
        if previous_hash and record.prev_hash != previous_hash:
            problems.append(f"line {number} (seq {record.seq}): prev_hash does not match the line "
                            "before; a line was removed, inserted or reordered")
        if record.seq != previous_seq + 1:
            problems.append(f"line {number}: seq {record.seq} follows seq {previous_seq}")
        previous_hash, previous_seq = record.hash, record.seq
    return AuditVerification(path=str(path), records=count, problems=problems)


def copy_audit_log(log: AuditLog, store: EvidenceStore, incident_id: str) -> str:
    """Copy the whole log into the evidence store under ``audit/<incident>/``; returns its URI."""
    name = f"audit/{incident_id}/{log.path.name}"
    try:
        data = log.path.read_bytes()
    except OSError as exc:
        raise StoreError(f"{log.path}: cannot read audit log to copy: {exc.strerror or exc}") from exc
    try:
        store.write(name, data)
    except EvidenceError as exc:
        raise StoreError(f"cannot copy the audit log to {store.uri}: {exc}; the local copy at "
                         f"{log.path} is intact") from exc
    return f"{store.uri.rstrip('/')}/{name}"
