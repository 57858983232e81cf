"""The audit log: append-only JSON lines, each record holding the hash of the one before.

One record per line. ``hash`` is SHA-256 over the canonical JSON of the record without ``hash``
and ``mac``; ``prev_hash`` is the previous record's ``hash`` (64 zeros for the first). Editing,
deleting or reordering a line breaks the chain, and ``verify_audit_log`` names the line.

A chain alone can be rebuilt by anyone who can write the file. So each record also carries
``mac``, HMAC-SHA256 of its ``hash`` under a key kept outside the log (``audit.key`` in the state
directory, readable by the service user only): a log edited and re-chained by hand fails the
keyed check. Execution verifies the whole keyed chain before acting.

A chain cut at a record boundary, or a log removed, still verifies: what catches it is a copy
kept elsewhere (``denpex.isolation.audit_store``). There is one log per machine (the state
directory's), written by every cluster's runs, and one stored copy per cluster, in the audit
store the operator's configuration names. Every writer appends here, then extends its cluster's
copy to the whole log; every action (isolate, requeue, rollback) first checks that the log
*extends* its cluster's copy, and refuses, recording why, when it does not.

"Extends" means: the log holds the copy's last record (its head) at the same seq with the same
hash. The chain verifies, so every record before it is the copy's too. The log may be longer:
a writer died between its append and its copy (the crash window), or another cluster's run
wrote since. It may not be shorter, nor hold another record at the head's seq. Since each
copy is the whole log, not only its cluster's records, a cut that removes another cluster's
later records is caught by that cluster's next action (and ``denpex audit verify LOG --against
COPY`` shows it), not by this cluster's; no record a cluster's writer copied can go missing
unnoticed by that cluster. The head carries its record's mac, so an edited head is refused; a
cluster with no copy yet passes (its first write), so the store must be one the service user
cannot delete from or roll back (S3 versioning or object lock), or a copy can be cut with the log.

Every action is bracketed: an ``intent`` record is written (and fsynced) before the command is
sent, a ``result`` record after it with the rc, the output and the verified state. An intent with
no result means the executor died in between; the executor resolves it by reading the node's
real state (``pending_intents``), never by repeating the command blindly.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import os
import secrets
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from denpex.evidence.files import read_at_most
from denpex.isolation.errors import AuditChainError, AuditError, BusyError, ConfigError
from denpex.isolation.file_lock import LockHeld, file_lock
from denpex.isolation.plan import Operation, canonical_json
from denpex.isolation.private_files import shared_file_problem

__all__ = [
    "GENESIS_HASH",
    "AuditKind",
    "Outcome",
    "AuditEntry",
    "AuditRecord",
    "AuditVerification",
    "AuditLog",
    "verify_audit_log",
    "load_or_create_audit_key",
    "read_audit_key",
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
    mac: str | None = None
    """HMAC-SHA256 of ``hash`` under the log's key; None in a log written without one."""

    def expected_hash(self) -> str:
        body = self.model_dump(mode="json", exclude={"hash", "mac"})
        return hashlib.sha256(canonical_json(body).encode()).hexdigest()

    def expected_mac(self, key: bytes) -> str:
        return hmac.new(key, self.hash.encode(), hashlib.sha256).hexdigest()


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
    """The log at ``path``. Appends are serialized with an exclusive lock and fsynced.

    With ``key``, every appended record carries its ``mac``, and ``verify`` checks them.
    """

    def __init__(self, path: Path, key: bytes | None = None) -> None:
        self.path = path
        self._key = key

    @property
    def key(self) -> bytes | None:
        """The HMAC key (None: an unkeyed log)."""
        return self._key

    def verify(self) -> None:
        """Raise AuditChainError naming every problem when the chain (and keys) do not verify."""
        if not self.path.exists():
            return
        verification = verify_audit_log(self.path, key=self._key)
        if not verification.ok:
            raise AuditChainError(
                f"the audit log {self.path} does not verify ({'; '.join(verification.problems[:3])}); "
                f"nothing was done. Inspect it with `denpex audit verify {self.path}`"
            )

    def append(self, entry: AuditEntry, *, at: datetime) -> AuditRecord:
        """Chain ``entry`` onto the last record and write it durably before returning.

        A failed write (a full disk) is undone, so the log never keeps half a record.
        """
        if entry.output is not None and len(entry.output) > MAX_OUTPUT_CHARS:
            entry = entry.model_copy(update={"output": entry.output[:MAX_OUTPUT_CHARS] + "...[cut]"})
        with self._locked() as handle:
            last = self._last_record(handle)
            if self._key is None and last is not None and last.mac is not None:
                # An unkeyed record after keyed ones would make every later execution refuse the log.
                raise AuditChainError(f"the audit log {self.path} is keyed; append through the state "
                                      "directory's audit key, never without it; nothing was written")
            record = AuditRecord(
                **entry.model_dump(),
                seq=last.seq + 1 if last else 1,
                time=at,
                prev_hash=last.hash if last else GENESIS_HASH,
                hash="",
            )
            record = record.model_copy(update={"hash": record.expected_hash()})
            if self._key is not None:
                record = record.model_copy(update={"mac": record.expected_mac(self._key)})
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
        with ExitStack() as held:
            try:
                handle = held.enter_context(file_lock(self.path.with_name(self.path.name + ".lock"),
                                                      what="the run lock", error=AuditError, wait=False, mode="a+"))
            except LockHeld as busy:
                raise BusyError(
                    f"another run (pid {busy.note or 'unknown'}) is acting on the audit log {self.path} right now; "
                    "nothing was done. Wait for it to finish, then run again: the re-run reads each "
                    "node's state and skips what is already done"
                ) from None
            handle.truncate(0)
            handle.write(f"{os.getpid()}\n")
            handle.flush()
            yield

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
        with file_lock(self.path, what="audit log for writing", error=AuditError, mode="a+b", buffering=0) as handle:
            yield cast(io.FileIO, handle)

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


def verify_audit_log(path: Path, *, reference: Path | None = None,
                     key: bytes | None = None) -> AuditVerification:
    """Check every line's hash and the chain; report every problem with its line number.

    A log cut at a record boundary still chains, so ``last`` names its head, and ``reference``
    (a stored copy, ``denpex.isolation.audit_store``) catches the cut: every record of the copy must be in the
    log, unchanged. With ``key``, each record's ``mac`` must verify too: a log re-chained by hand
    does not.
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
        if key is not None and record.mac is None:
            problems.append(f"line {number} (seq {record.seq}): it carries no mac: it was written "
                            "without the log's key (by hand, or by a writer that did not use the state "
                            "directory's audit.key), so nothing vouches for it")
        elif key is not None and not hmac.compare_digest(record.mac or "", record.expected_mac(key)):
            problems.append(f"line {number} (seq {record.seq}): its mac does not verify with the log's "
                            "key; the record was forged or re-chained by hand")
        if previous_hash and record.prev_hash != previous_hash:
            problems.append(f"line {number} (seq {record.seq}): prev_hash does not match the line "
                            "before; a line was removed, inserted or reordered")
        if record.seq != previous_seq + 1:
            problems.append(f"line {number}: seq {record.seq} follows seq {previous_seq}")
        previous_hash, previous_seq = record.hash, record.seq
        hashes[record.seq] = record.hash
        last = record
    if reference is not None:
        problems += _compare_with_copy(hashes, _read_log(reference), str(reference))
    return AuditVerification(path=str(path), records=count, problems=problems, last=last)


def _compare_with_copy(hashes: dict[int, str], raw: bytes, reference: str) -> list[str]:
    theirs: dict[int, AuditRecord] = {}
    for line in _split_lines(raw)[0]:
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


def load_or_create_audit_key(path: Path) -> bytes:
    """The audit log's HMAC key at ``path``: created (32 random bytes, mode 0600) on first use.

    A key file that others can read or write is refused: whoever reads it can forge the chain.
    """
    if not path.exists():
        _create_audit_key(path)
    try:
        mode = path.stat().st_mode
        text = _key_text(path)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise AuditError(f"{path}: cannot read the audit key: {exc}") from exc
    problem = shared_file_problem(path, mode, "audit key")
    if problem:
        raise AuditChainError(problem)
    try:
        key = bytes.fromhex(text)
    except ValueError as exc:
        raise AuditChainError(f"{path}: the audit key is damaged (not hex)") from exc
    if len(key) < 16:
        raise AuditChainError(f"{path}: the audit key is too short ({len(key)} bytes)")
    return key


def _create_audit_key(path: Path) -> None:
    """Write a new key whole, then put it in place only if none is there yet.

    Two first runs at once (two operators, or the CLI and the flow) must not read each other's
    key file half-written: it is written under a private name and linked into place (``link``
    fails when the name exists), so the key file is either absent or complete.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # mode 0600
    except OSError as exc:
        raise AuditError(f"{path}: cannot create the audit key: {exc.strerror or exc}") from exc
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_hex(32) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.link(tmp, path)
    except FileExistsError:
        pass  # another run made it first; theirs is the key
    except OSError as exc:
        raise AuditError(f"{path}: cannot create the audit key: {exc.strerror or exc}") from exc
    finally:
        os.unlink(tmp)


def read_audit_key(path: Path) -> bytes:
    """The key in an audit key file an operator names (``denpex audit verify --key``), read as is.

    Unlike ``load_or_create_audit_key``, nothing is created and the file's mode is not judged:
    verifying only reads, and the operator may keep a copy of the key anywhere.
    """
    try:
        return bytes.fromhex(_key_text(path))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read the audit key: {exc}") from exc


_MAX_KEY_BYTES = 4096  # a key is 64 hex digits; a path named by mistake (a log, a device) is not read whole


def _key_text(path: Path) -> str:
    raw = read_at_most(path, _MAX_KEY_BYTES)
    if len(raw) > _MAX_KEY_BYTES:
        raise ValueError(f"the file is over {_MAX_KEY_BYTES} bytes, not a key")
    return raw.decode("ascii").strip()
