"""Dump Flight Recorder from inside a training job when a rank hangs, and make every rank dump.

torch 2.13 dumps FR on a collective timeout only on NCCL builds. On Gloo (and to get a dump
*before* a timeout turns into an exception anywhere) each rank runs a :class:`HangDumper`:

- a watchdog thread polls the rank's own FR progress (``pg_status``, microseconds per poll);
- once one collective has been in flight for ``trigger_fraction`` (0.75) of its timeout, the rank
  dumps and raises a :class:`DumpRequest` through a shared :class:`DumpSignal` (a file in a
  shared folder, or the c10d store);
- every other live rank sees the request on its next poll and dumps too, while its own collective
  still blocks (a dump taken after a collective raised is unreliable on Gloo: whether the failed
  op reads ``retired`` is a race);
- used as a context manager it also dumps (and signals) when the body raises.

Files, all written atomically (temporary name, then rename)::

    <out>/rank_<global rank>.pkl          FR pickle, with stack traces
    <out>/rank_<global rank>.json         FR JSON (when DumpFormat.JSON is asked for)
    <out>/collector/rank_<r>.record.json  who dumped, where, when and why (DumpRecord)
    <out>/collector/dump-request.json     the shared request (FileDumpSignal)

Evidence readers list only the files directly in ``<out>``, so the ``collector/`` folder never
looks like a dump. :func:`read_dump_records` and :func:`rank_identities` turn the records into
the manifest's ``ranks``.

Usage, in every rank after ``init_process_group``::

    dumper = HangDumper(Path("/shared/job-123/fr"), rank=dist.get_rank(),
                        collective_timeout=timedelta(minutes=10),
                        host=socket.gethostname(), local_rank=int(os.environ["LOCAL_RANK"]))
    with dumper:
        dumper.warm_up()   # optional: after the first collective; the first dump is slow
        train()

torch is imported lazily, only by :class:`TorchFlightRecorder`.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from types import TracebackType
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from denpex.evidence.manifest import RankIdentity

__all__ = [
    "DumpFormat",
    "DumpTrigger",
    "GroupProgress",
    "InFlightOp",
    "FlightRecorderSource",
    "TorchFlightRecorder",
    "BlockedOp",
    "StallWatch",
    "stall_threshold",
    "DumpRequest",
    "DumpSignal",
    "FileDumpSignal",
    "StoreDumpSignal",
    "DumpRecord",
    "HangDumper",
    "dump_path",
    "record_path",
    "request_path",
    "request_dump",
    "read_dump_records",
    "rank_identities",
    "write_atomic",
]

_log = logging.getLogger(__name__)

COLLECTOR_DIR = "collector"
REQUEST_NAME = "dump-request.json"


class DumpFormat(StrEnum):
    """An encoding of the FR dump."""

    PICKLE = "pickle"
    """torch's pickle (protocol 2, plain containers): the full dump, stack traces included."""
    JSON = "json"
    """torch's JSON dump: no stack traces, and a few encoding differences from the pickle."""

    @property
    def suffix(self) -> str:
        return ".pkl" if self is DumpFormat.PICKLE else ".json"


class DumpTrigger(StrEnum):
    """Why a rank dumped."""

    STALL = "stall"
    """This rank had one collective in flight for the trigger fraction of its timeout."""
    REQUEST = "request"
    """Another rank, or an operator, asked through the shared signal."""
    ERROR = "error"
    """Code run under the dumper raised (e.g. a collective failed)."""
    MANUAL = "manual"
    """The job called :meth:`HangDumper.dump_now` itself."""


@dataclass(frozen=True, slots=True)
class GroupProgress:
    """One process group's counters from FR ``pg_status`` (keyed by the rank-local ``pg_id``)."""

    last_enqueued: int
    last_completed: int

    @property
    def in_flight(self) -> int | None:
        """The sequence id of the newest op enqueued but not completed, if any.

        >>> GroupProgress(last_enqueued=5, last_completed=4).in_flight
        5
        >>> GroupProgress(last_enqueued=5, last_completed=5).in_flight is None
        True
        """
        return self.last_enqueued if self.last_enqueued > self.last_completed else None


@dataclass(frozen=True, slots=True)
class InFlightOp:
    """What FR says about one op still in flight: enough to name it and to know its timeout."""

    pg_id: str
    seq: int
    group_name: str
    profiling_name: str
    timeout_ms: int | None


class FlightRecorderSource(Protocol):
    """The rank's own Flight Recorder. :class:`TorchFlightRecorder` is the real one."""

    def progress(self) -> Mapping[str, GroupProgress]:
        """``pg_status`` per rank-local ``pg_id``; cheap enough to call every second."""
        ...

    def in_flight_op(self, pg_id: str, seq: int) -> InFlightOp | None:
        """The unretired collective ``seq`` of group ``pg_id``, or None when FR has no such entry."""
        ...

    def dump(self, fmt: DumpFormat) -> bytes:
        """The whole dump, encoded as ``fmt``."""
        ...


class TorchFlightRecorder:
    """Reads this process's Flight Recorder through ``torch._C._distributed_c10d``."""

    def __init__(self) -> None:
        # Imported here so that the collector module loads where torch is not installed.
        from torch._C import _distributed_c10d as c10d

        self._c10d = c10d

    def progress(self) -> Mapping[str, GroupProgress]:
        # Without collectives the JSON dump is only pg_config and pg_status: ~0.1 ms.
        status = json.loads(self._c10d._dump_fr_trace_json(includeCollectives=False, onlyActive=False))
        return {
            str(pg_id): GroupProgress(
                last_enqueued=int(counters["last_enqueued_collective"]),
                last_completed=int(counters["last_completed_collective"]),
            )
            for pg_id, counters in status.get("pg_status", {}).items()
        }

    def in_flight_op(self, pg_id: str, seq: int) -> InFlightOp | None:
        # onlyActive filters on "completed" state, which Gloo never sets, so read all entries.
        dump = json.loads(self._c10d._dump_fr_trace_json(includeCollectives=True, onlyActive=False))
        for entry in reversed(dump.get("entries", [])):
            if (str(entry.get("pg_id")) == pg_id and entry.get("collective_seq_id") == seq
                    and not entry.get("is_p2p") and not entry.get("retired")):
                group = entry.get("process_group") or ["?"]
                return InFlightOp(pg_id=pg_id, seq=seq, group_name=str(group[0]),
                                  profiling_name=str(entry.get("profiling_name", "?")),
                                  timeout_ms=entry.get("timeout_ms"))
        return None

    def dump(self, fmt: DumpFormat) -> bytes:
        if fmt is DumpFormat.PICKLE:
            return bytes(self._c10d._dump_fr_trace(
                includeCollectives=True, includeStackTraces=True, onlyActive=False))
        return bytes(self._c10d._dump_fr_trace_json(includeCollectives=True, onlyActive=False))


@dataclass(frozen=True, slots=True)
class BlockedOp:
    """An op seen in flight on consecutive polls, since ``first_seen`` (monotonic seconds)."""

    pg_id: str
    seq: int
    first_seen: float
    polls: int


class StallWatch:
    """Remembers since when each in-flight op has been seen, across polls of ``pg_status``.

    An op is identified by (rank-local ``pg_id``, sequence id). It is forgotten as soon as a poll
    no longer shows it in flight, so a job that keeps progressing never accumulates a stall.

    >>> watch = StallWatch()
    >>> watch.observe({"0": GroupProgress(3, 2)}, now=10.0)
    [BlockedOp(pg_id='0', seq=3, first_seen=10.0, polls=1)]
    >>> watch.observe({"0": GroupProgress(3, 2)}, now=11.0)
    [BlockedOp(pg_id='0', seq=3, first_seen=10.0, polls=2)]
    >>> watch.observe({"0": GroupProgress(4, 3)}, now=12.0)
    [BlockedOp(pg_id='0', seq=4, first_seen=12.0, polls=1)]
    """

    def __init__(self) -> None:
        self._seen: dict[tuple[str, int], BlockedOp] = {}

    def observe(self, progress: Mapping[str, GroupProgress], now: float) -> list[BlockedOp]:
        """Record one poll; return the ops in flight now, longest blocked first."""
        current: dict[tuple[str, int], BlockedOp] = {}
        for pg_id, counters in progress.items():
            seq = counters.in_flight
            if seq is None:
                continue
            before = self._seen.get((pg_id, seq))
            current[(pg_id, seq)] = (
                BlockedOp(pg_id, seq, now, 1) if before is None
                else BlockedOp(pg_id, seq, before.first_seen, before.polls + 1)
            )
        self._seen = current
        return sorted(current.values(), key=lambda op: (op.first_seen, op.pg_id))


def stall_threshold(fraction: float, configured: timedelta | None,
                    op_timeout_ms: int | None) -> timedelta | None:
    """How long an op may stay in flight before the rank dumps; None when no timeout is known.

    The shorter of the configured timeout and the op's own (FR ``timeout_ms``) wins, so that a
    group created with a shorter timeout still dumps before its collective raises.

    >>> stall_threshold(0.75, timedelta(seconds=8), 4000)
    datetime.timedelta(seconds=3)
    >>> stall_threshold(0.75, None, None) is None
    True
    """
    candidates = [t for t in (configured, timedelta(milliseconds=op_timeout_ms) if op_timeout_ms
                              else None) if t is not None]
    return fraction * min(candidates) if candidates else None


class DumpRequest(BaseModel):
    """A request for every live rank to dump now."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    requested_by: str = Field(description="'rank 3', or who else asked (e.g. 'operator')")
    reason: str
    requested_at: datetime


class DumpSignal(Protocol):
    """Carries one :class:`DumpRequest` to every rank of the job."""

    def send(self, request: DumpRequest) -> None:
        """Publish the request; the first request of an incident stays, later ones are dropped."""
        ...

    def receive(self) -> DumpRequest | None:
        """The published request, or None. Called from each rank's watchdog on every poll."""
        ...


class FileDumpSignal:
    """A request file in a folder every rank can read (a shared file system)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def send(self, request: DumpRequest) -> None:
        if self.path.exists():
            return
        write_atomic(self.path, request.model_dump_json().encode())

    def receive(self) -> DumpRequest | None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            return DumpRequest.model_validate_json(data)
        except ValidationError:
            # Someone wrote something else there: still a request to dump, say what it was.
            return DumpRequest(requested_by="unknown", reason=f"unreadable request at {self.path}",
                               requested_at=datetime.now(UTC))


class _Store(Protocol):
    """The part of ``torch.distributed.Store`` that :class:`StoreDumpSignal` uses."""

    def set(self, key: str, value: str | bytes) -> None: ...

    def get(self, key: str) -> bytes: ...

    def check(self, keys: list[str]) -> bool: ...

    def add(self, key: str, amount: int) -> int: ...


class StoreDumpSignal:
    """A request key in the job's c10d store (TCPStore, FileStore), for jobs without a shared folder.

    The store must outlive the ranks that may fail: a TCPStore served by rank 0 dies with rank 0.
    """

    def __init__(self, store: _Store, key: str = "denpex/dump-request") -> None:
        self._store = store
        self._key = key

    def send(self, request: DumpRequest) -> None:
        # add() is atomic in every c10d store: only the first sender writes the request.
        if self._store.add(f"{self._key}/senders", 1) == 1:
            self._store.set(self._key, request.model_dump_json())

    def receive(self) -> DumpRequest | None:
        # check() never blocks; get() would wait for the key until the store timeout.
        if not self._store.check([self._key]):
            return None
        return DumpRequest.model_validate_json(self._store.get(self._key))


class DumpRecord(BaseModel):
    """The sidecar each rank writes next to its dump; merged into the job manifest."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rank: int = Field(ge=0)
    host: str | None = None
    local_rank: int | None = Field(default=None, ge=0)
    pid: int = Field(ge=0)
    dumped_at: datetime
    trigger: DumpTrigger
    reason: str
    files: list[str]
    dump_seconds: float = Field(ge=0.0, description="how long taking and writing the dumps took")

    def identity(self) -> RankIdentity:
        """This rank's manifest entry."""
        return RankIdentity(host=self.host, local_rank=self.local_rank, pid=self.pid,
                            dumped_at=self.dumped_at)


def dump_path(out_dir: Path, rank: int, fmt: DumpFormat) -> Path:
    """``<out>/rank_<rank>.pkl`` or ``.json``."""
    return out_dir / f"rank_{rank}{fmt.suffix}"


def record_path(out_dir: Path, rank: int) -> Path:
    """``<out>/collector/rank_<rank>.record.json``."""
    return out_dir / COLLECTOR_DIR / f"rank_{rank}.record.json"


def request_path(out_dir: Path) -> Path:
    """Where :class:`FileDumpSignal` keeps the request by default."""
    return out_dir / COLLECTOR_DIR / REQUEST_NAME


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` so that readers see the whole file or none of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with tmp.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def request_dump(out_dir: Path, reason: str, requested_by: str = "operator") -> DumpRequest:
    """Ask every rank whose :class:`HangDumper` watches ``out_dir`` to dump (e.g. from a shell)."""
    request = DumpRequest(requested_by=requested_by, reason=reason, requested_at=datetime.now(UTC))
    FileDumpSignal(request_path(out_dir)).send(request)
    return request


def read_dump_records(out_dir: Path) -> dict[int, DumpRecord]:
    """Every rank's :class:`DumpRecord` under ``out_dir``, by rank. Unreadable records are skipped."""
    records: dict[int, DumpRecord] = {}
    for path in sorted((out_dir / COLLECTOR_DIR).glob("rank_*.record.json")):
        try:
            record = DumpRecord.model_validate_json(path.read_bytes())
        except (OSError, ValidationError) as exc:
            _log.warning("skipping dump record %s: %s", path, exc)
            continue
        records[record.rank] = record
    return records


def rank_identities(records: Iterable[DumpRecord],
                    known: Mapping[int, RankIdentity] | None = None) -> dict[int, RankIdentity]:
    """Manifest ``ranks``: what the launcher knew (``known``), updated by what each rank recorded."""
    merged = dict(known or {})
    for record in records:
        before = merged.get(record.rank)
        fields = record.identity().model_dump(exclude_none=True)
        merged[record.rank] = before.model_copy(update=fields) if before else RankIdentity(**fields)
    return dict(sorted(merged.items()))


class HangDumper:
    """Per-rank watchdog: dumps FR on a stall, on a request from any rank, or on an error.

    It dumps at most once. Nothing here is process-global: create one per rank and pass in the
    signal and recorder to use (defaults: a :class:`FileDumpSignal` in ``out_dir`` and the real
    :class:`TorchFlightRecorder`).
    """

    def __init__(
        self,
        out_dir: Path,
        *,
        rank: int,
        collective_timeout: timedelta | None,
        host: str | None = None,
        local_rank: int | None = None,
        formats: tuple[DumpFormat, ...] = (DumpFormat.PICKLE,),
        trigger_fraction: float | None = 0.75,
        poll_interval: timedelta = timedelta(seconds=1),
        signal: DumpSignal | None = None,
        recorder: FlightRecorderSource | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``trigger_fraction=None`` turns stall detection off: the rank dumps only on request,
        on error or by :meth:`dump_now`."""
        if rank < 0:
            raise ValueError(f"rank must be >= 0, got {rank}")
        if trigger_fraction is not None and not 0.0 < trigger_fraction < 1.0:
            raise ValueError(f"trigger_fraction must be in (0, 1) so the dump precedes the timeout, "
                             f"got {trigger_fraction}")
        if not formats:
            raise ValueError("formats is empty: ask for DumpFormat.PICKLE, DumpFormat.JSON or both")
        if poll_interval <= timedelta(0):
            raise ValueError(f"poll_interval must be positive, got {poll_interval}")
        self.out_dir = out_dir
        self.rank = rank
        self.host = host
        self.local_rank = local_rank
        self.formats = formats
        self._timeout = collective_timeout
        self._fraction = trigger_fraction
        self._poll_s = poll_interval.total_seconds()
        self._signal = signal if signal is not None else FileDumpSignal(request_path(out_dir))
        self._recorder = recorder
        self._clock = clock
        self._watch = StallWatch()
        self._op_details: dict[tuple[str, int], InFlightOp | None] = {}
        self._lock = threading.Lock()
        self._record: DumpRecord | None = None
        self._warm = False
        self._dumped = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the watchdog thread. Refused twice: one dumper watches one run."""
        if self._thread is not None:
            raise RuntimeError(f"HangDumper for rank {self.rank} is already started")
        self._thread = threading.Thread(target=self._run, name=f"denpex-hang-dumper-{self.rank}",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout: timedelta = timedelta(seconds=5)) -> None:
        """Stop the watchdog thread (it finishes a dump in progress first)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout.total_seconds())

    def __enter__(self) -> HangDumper:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if isinstance(exc, Exception):
                self.request(DumpTrigger.ERROR, f"{type(exc).__name__}: {exc}")
        except Exception:  # noqa: BLE001 - the body's exception is the one the job must see
            _log.exception("rank %d: dumping after %s failed", self.rank, type(exc).__name__)
        finally:
            self.stop()

    # -- dumping ------------------------------------------------------------------------------

    @property
    def record(self) -> DumpRecord | None:
        """The record of this rank's dump, once it dumped."""
        return self._record

    def wait_dumped(self, timeout: timedelta) -> DumpRecord | None:
        """Block until this rank dumped (by any trigger), or ``timeout`` passed."""
        self._dumped.wait(timeout.total_seconds())
        return self._record

    def warm_up(self) -> float:
        """Take one throwaway dump of every format; return the seconds it took.

        The first pickle dump with stack traces takes seconds (1.6-5.9 s measured with 4 ranks on
        2 cores); later ones take milliseconds. Call it after the first collective so that the
        real dump lands before the timeout. The watchdog does it by itself otherwise.
        """
        started = self._clock()
        recorder = self._source()
        for fmt in self.formats:
            recorder.dump(fmt)
        self._warm = True
        return self._clock() - started

    def dump_now(self, trigger: DumpTrigger, reason: str) -> DumpRecord:
        """Dump this rank (once; later calls return the first record)."""
        with self._lock:
            if self._record is not None:
                return self._record
            started = self._clock()
            dumped_at = datetime.now(UTC)
            recorder = self._source()
            # Take every encoding before writing any, so they describe the same moment.
            blobs = {fmt: recorder.dump(fmt) for fmt in self.formats}
            files = []
            for fmt, data in blobs.items():
                path = dump_path(self.out_dir, self.rank, fmt)
                write_atomic(path, data)
                files.append(path.name)
            record = DumpRecord(rank=self.rank, host=self.host, local_rank=self.local_rank,
                                pid=os.getpid(), dumped_at=dumped_at, trigger=trigger,
                                reason=reason, files=files,
                                dump_seconds=round(self._clock() - started, 6))
            write_atomic(record_path(self.out_dir, self.rank), record.model_dump_json(indent=1).encode())
            self._record = record
            self._dumped.set()
            _log.warning("rank %d dumped Flight Recorder (%s: %s) to %s", self.rank, trigger.value,
                         reason, ", ".join(files))
            return record

    def request(self, trigger: DumpTrigger, reason: str) -> DumpRecord:
        """Dump this rank, then ask every other rank to dump too."""
        record = self.dump_now(trigger, reason)
        self._signal.send(DumpRequest(requested_by=f"rank {self.rank}", reason=reason,
                                      requested_at=record.dumped_at))
        return record

    # -- watchdog -----------------------------------------------------------------------------

    def poll_once(self) -> DumpRecord | None:
        """One watchdog step: answer a pending request, else look for a stall. Returns a new dump."""
        if self._record is not None:
            return None
        incoming = self._signal.receive()
        if incoming is not None:
            return self.dump_now(DumpTrigger.REQUEST, f"{incoming.requested_by}: {incoming.reason}")
        progress = self._source().progress()
        if not self._warm and any(p.last_enqueued > 0 for p in progress.values()):
            self.warm_up()
        blocked = self._watch.observe(progress, self._clock())
        reason = self._stall_reason(blocked)
        return self.request(DumpTrigger.STALL, reason) if reason is not None else None

    def _stall_reason(self, blocked: list[BlockedOp]) -> str | None:
        if self._fraction is None:
            return None
        now = self._clock()
        # Forget the details of ops that finished, so a long job does not accumulate them.
        current = {(op.pg_id, op.seq) for op in blocked}
        self._op_details = {k: v for k, v in self._op_details.items() if k in current}
        for op in blocked:
            if op.polls < 2:
                continue  # a collective that finishes between two polls is no stall
            detail = self._detail(op)
            threshold = stall_threshold(self._fraction, self._timeout,
                                        detail.timeout_ms if detail else None)
            waited = now - op.first_seen
            if threshold is not None and waited >= threshold.total_seconds():
                what = (f"{detail.profiling_name} in group {detail.group_name!r}" if detail
                        else f"a collective in local group {op.pg_id}")
                return (f"blocked {waited:.1f}s in {what} (collective_seq_id {op.seq}), "
                        f"past {threshold.total_seconds():.1f}s = {self._fraction} x timeout")
        return None

    def _detail(self, op: BlockedOp) -> InFlightOp | None:
        # One full read per op that outlived a poll; short collectives never pay for it.
        key = (op.pg_id, op.seq)
        if key not in self._op_details:
            self._op_details[key] = self._source().in_flight_op(op.pg_id, op.seq)
        return self._op_details[key]

    def _source(self) -> FlightRecorderSource:
        if self._recorder is None:
            self._recorder = TorchFlightRecorder()
        return self._recorder

    def _run(self) -> None:
        while not self._stop.is_set() and self._record is None:
            try:
                self.poll_once()
            except Exception:  # noqa: BLE001 - the watchdog must never take the training down
                _log.exception("rank %d: hang dumper poll failed; will retry", self.rank)
            self._stop.wait(self._poll_s)
