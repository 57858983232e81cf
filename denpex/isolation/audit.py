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
import io
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from denpex.evidence.errors import EvidenceError
from denpex.evidence.store import EvidenceStore
from denpex.isolation.errors import AuditError, BusyError, StoreError
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
    DECISION = "decision"
    """A plan was not carried out, and why: rejected, unanswered, refused answer, job recovered."""


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
    last: AuditRecord | None = None
    """The last valid record: a log cut at a record boundary still verifies, so its head is shown."""

    @property
    def ok(self) -> bool:
        return not self.problems


class AuditLog:
    """The log at ``path``. Appends are serialized with an exclusive lock and fsynced."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def append(self, entry: AuditEntry, *, at: datetime) -> AuditRecord:
        """Chain ``entry`` onto the last record and write it durably before returning.

        A failed write (a full disk) is undone, so the log never keeps half a record.
        """
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
            data = memoryview((canonical_json(record.model_dump(mode="json")) + "\n").encode())
            end = handle.seek(0, os.SEEK_END)
            try:
                while data:
                    data = data[handle.write(data) or 0:]
                os.fsync(handle.fileno())
            except OSError as exc:
                raise AuditError(self._write_failed(handle, end, record, exc)) from exc
        return record

    def _write_failed(self, handle: io.FileIO, end: int, record: AuditRecord, exc: OSError) -> str:
        """Cut the log back to its last whole record; the message says what that means."""
        try:
            handle.truncate(end)
            os.fsync(handle.fileno())
            state = "the log is left as it was"
        except OSError:
            state = f"the log may end with part of it; see `denpex audit verify {self.path}`"
        consequence = {
            AuditKind.INTENT: "nothing was sent",
            AuditKind.RESULT: "the command was sent; the next run settles its intent from the node's state",
        }.get(record.kind, "nothing else was done")
        node = f" for {record.node}" if record.node else ""
        return (f"{self.path}: cannot write the {record.kind.value} record{node} "
                f"({exc.strerror or exc}); {state} and {consequence}. Free space, then run again")

    @contextmanager
    def run_lock(self) -> Iterator[None]:
        """Hold the log's run lock for one executing run, or raise BusyError at once.

        Two runs acting on one log at the same time would each take the other's fresh intent for
        one left by a crash, "recover" it and send the command again. The lock lives in
        ``<log>.lock`` (not the log itself, whose lock each append takes briefly) and names the
        holder's pid. It is an flock: the kernel releases it when the holder dies.
        """
        lock_path = self.path.with_name(self.path.name + ".lock")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle = lock_path.open("a+")
        except OSError as exc:
            raise AuditError(f"{lock_path}: cannot open the run lock: {exc.strerror or exc}") from exc
        with handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip() or "unknown"
                raise BusyError(
                    f"another run (pid {holder}) is acting on the audit log {self.path} right now; "
                    "nothing was done. Wait for it to finish, then run again: the re-run reads each "
                    "node's state and skips what is already done"
                ) from None
            try:
                handle.truncate(0)
                handle.write(f"{os.getpid()}\n")
                handle.flush()
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def records(self) -> list[AuditRecord]:
        """Every record, validated; a damaged or torn line raises AuditError naming it."""
        raw = _read_log(self.path) if self.path.exists() else b""
        lines, intact = _split_lines(raw)
        if intact < len(raw):
            raise AuditError(_torn_message(self.path, intact, len(raw)))
        records = []
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
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

    @contextmanager
    def _locked(self) -> Iterator[io.FileIO]:
        # Unbuffered: a failed write must not linger in a buffer that closing would flush later.
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle = self.path.open("a+b", buffering=0)
        except OSError as exc:
            raise AuditError(f"{self.path}: cannot open audit log for writing: {exc.strerror or exc}") from exc
        with handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield handle
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _last_record(self, handle: io.FileIO) -> AuditRecord | None:
        """Read only the file's tail (growing the window for a long record): appends stay cheap."""
        size = handle.seek(0, os.SEEK_END)
        if size == 0:
            return None
        window = _TAIL_CHUNK
        while True:
            start = max(0, size - window)
            handle.seek(start)
            tail = handle.readall()
            if not tail.endswith(b"\n"):
                cut = tail.rfind(b"\n")
                if cut < 0 and start > 0:
                    window *= 4
                    continue
                raise AuditError(_torn_message(self.path, start + cut + 1, size))
            cut = tail.rfind(b"\n", 0, len(tail) - 1)
            if cut >= 0 or start == 0:
                line = tail[cut + 1:-1]
                break
            window *= 4
        try:
            last = AuditRecord.model_validate_json(line)
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


def _read_log(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise AuditError(f"{path}: cannot read audit log: {exc.strerror or exc}") from exc


def _split_lines(raw: bytes) -> tuple[list[bytes], int]:
    """Complete lines, split at ``\\n`` only, and the offset where they end.

    The writer ends records with ``\\n`` alone; ``str.splitlines`` would also split at U+2028
    or U+0085, which JSON leaves unescaped inside strings (remote output may hold them).
    """
    intact = raw.rfind(b"\n") + 1
    return raw[:intact].split(b"\n")[:-1], intact


def _torn_message(path: Path, intact: int, size: int) -> str:
    return (
        f"{path} ends with {size - intact} bytes of a record cut short (a crash or a full disk "
        f"while writing). Removing them is safe: a command is only sent once its intent record "
        f"is complete, and an intent left without its result is settled from the node's state on "
        f"the next run. Run `truncate -s {intact} {path}`, then `denpex audit verify {path}`"
    )


def verify_audit_log(path: Path, *, reference: Path | None = None) -> AuditVerification:
    """Check every line's hash and the chain; report every problem with its line number.

    A log cut at a record boundary still chains, so ``last`` names its head, and ``reference``
    (a copy from the evidence store) catches the cut: every record of the copy must be in the
    log, unchanged.
    """
    raw = _read_log(path)
    lines, intact = _split_lines(raw)
    problems: list[str] = []
    if intact < len(raw):
        problems.append(_torn_message(path, intact, len(raw)))
    previous_hash = GENESIS_HASH
    previous_seq = 0
    count = 0
    last: AuditRecord | None = None
    hashes: dict[int, str] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            problems.append(f"line {number}: empty line")
            continue
        count += 1
        try:
            record = AuditRecord.model_validate_json(line)
        except ValidationError as exc:
            problems.append(f"line {number}: not an audit record ({exc.error_count()} problems)")
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
        hashes[record.seq] = record.hash
        last = record
    if reference is not None:
        problems += _compare_with_copy(hashes, reference)
    return AuditVerification(path=str(path), records=count, problems=problems, last=last)


def _compare_with_copy(hashes: dict[int, str], reference: Path) -> list[str]:
    theirs: dict[int, AuditRecord] = {}
    for line in _split_lines(_read_log(reference))[0]:
        try:
            record = AuditRecord.model_validate_json(line)
        except ValidationError:
            continue  # the copy's own damage is for `denpex audit verify COPY` to report
        theirs[record.seq] = record
    problems = []
    missing = sorted(seq for seq in theirs if seq not in hashes)
    if missing:
        span = f"seq {missing[0]}" if len(missing) == 1 else f"seq {missing[0]} to {missing[-1]}"
        problems.append(
            f"{span} ({len(missing)} record(s), the last at {theirs[missing[-1]].time.isoformat()}) "
            f"are in the copy at {reference} but not in this log: it was truncated or rolled back"
        )
    differs = sorted(seq for seq in theirs if seq in hashes and hashes[seq] != theirs[seq].expected_hash())
    if differs:
        problems.append(f"seq {', '.join(map(str, differs))} differs from the copy at {reference}: "
                        "one of the two was edited")
    return problems


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
