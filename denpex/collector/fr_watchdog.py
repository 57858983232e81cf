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
- used as a context manager it also dumps (and signals) when the body raises;
- after its dump it keeps watching the ops it had in flight then; once all of them completed
  and a newer op then completed in time, in any group (the job recovered, e.g. a stopped rank
  was continued), it dumps once more, trigger ``recovered``, over the first dump, so that a flow
  waiting for approval sees the recovery. Gloo counts an op that ended in an error (its
  timeout, a dead peer) as completed, hence the newer op (:mod:`denpex.collector.moved_past`);
  a body that returns cleanly under ``with`` after the ops completed counts too;
- a rank that answered a request with nothing in flight may be the one the others wait for (it
  had not entered their collective yet: a stopped rank continued, whose watchdog thread won the
  race to the first poll); it dumps once more once it completes a collective it had not
  enqueued at its dump, confirmed the same way. Without that, its dump would say "behind" for good.

Files (see :mod:`denpex.collector.layout`): ``<out>/rank_<global rank>.pkl`` and ``.json``,
a :class:`~denpex.evidence.dump_record.DumpRecord` and the rank's Python stacks
(:mod:`denpex.collector.stacks`) per rank under ``<out>/collector/``; the record
:func:`~denpex.evidence.dump_record.rank_identities` turns into the manifest's ``ranks``.

Usage, in every rank after ``init_process_group``::

    dumper = HangDumper(Path("/shared/job-123/fr"), rank=dist.get_rank(),
                        collective_timeout=timedelta(minutes=10),
                        host=node_name(), local_rank=int(os.environ["LOCAL_RANK"]))  # the scheduler's name
    with dumper:
        dumper.warm_up()   # optional: after the first collective; the first dump is slow
        train()

torch is imported lazily, only by :class:`TorchFlightRecorder`.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType

from denpex.collector.dump_signal import DumpRequest, DumpSignal, FileDumpSignal
from denpex.collector.flight_recorder import (
    DumpFormat,
    FlightRecorderSource,
    InFlightOp,
    TorchFlightRecorder,
)
from denpex.collector.job_identity import JobIdentity, read_job_identity
from denpex.collector.layout import dump_path, record_path, request_path, write_atomic
from denpex.collector.moved_past import MovedPast
from denpex.collector.stacks import write_rank_stacks
from denpex.collector.stall import BlockedOp, StallWatch, stall_threshold
from denpex.evidence.dump_record import DumpRecord, DumpTrigger

__all__ = ["HangDumper"]

_log = logging.getLogger(__name__)


class HangDumper:
    """Per-rank watchdog: dumps FR on a stall, on a request from any rank, or on an error.

    It dumps once, and once more if the ops in flight at that dump all complete and a newer op
    confirms it (or, for a dump that answered a request between collectives, once the rank
    completes a new one, confirmed the same way). Nothing here
    is process-global: create one per rank and pass in the
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
        wall_clock: Callable[[], float] = time.time,
        identity: Callable[[], JobIdentity] = read_job_identity,
        after_dump: Callable[[DumpRecord, DumpRequest], None] | None = None,
    ) -> None:
        """``trigger_fraction=None`` turns stall detection off: the rank dumps only on request,
        on error or by :meth:`dump_now`.

        ``after_dump`` is called once, with this rank's record and the incident's shared request,
        after the dump files are written and before the record is (e.g. ``EvidenceUploader.submit``)."""
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
        self._wall_clock = wall_clock
        self._identity = identity
        self._after_dump = after_dump
        self._incident: DumpRequest | None = None
        self._watch = StallWatch()
        self._op_details: dict[tuple[str, int], InFlightOp | None] = {}
        self._lock = threading.Lock()
        self._record: DumpRecord | None = None
        self._moved_past: MovedPast | None = None
        """What this rank must complete to dump again (see :class:`MovedPast`); None: no re-dump."""
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
        start_symbolizer_import()

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
            else:
                self._after_clean_exit()
        except Exception:  # noqa: BLE001 - the body's exception is the one the job must see
            _log.exception("rank %d: dumping at the end of the job's body failed", self.rank)
        finally:
            self.stop()

    def _after_clean_exit(self) -> None:
        """The body returned after the ops the watch waited for completed, and no newer op confirmed
        it (the stuck op was the job's last collective): returning without an error is the proof."""
        with self._lock:
            watch = self._moved_past
            if watch is not None and (watch.confirming or watch.completed(self._source().progress())):
                self._moved_past = None
                self._write_dump(DumpTrigger.RECOVERED, "the stuck ops completed and the job's body returned "
                                                        "without an error")

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

    def dump_now(self, trigger: DumpTrigger, reason: str, request: DumpRequest | None = None) -> DumpRecord:
        """Dump this rank (once; later calls return the first record). ``request``: the one answered."""
        return self._dump(trigger, reason, request, publish=False)

    def _dump(self, trigger: DumpTrigger, reason: str, request: DumpRequest | None, *, publish: bool) -> DumpRecord:
        if self._record is not None:
            return self._record  # without the lock: the watchdog may hold it reading the ring
        with self._lock:
            if self._record is not None:
                return self._record
            self._moved_past = MovedPast.at_dump(self._source().progress(),
                                                 answered_request=trigger is DumpTrigger.REQUEST)
            return self._write_dump(trigger, reason, request, publish=publish)

    def _write_dump(self, trigger: DumpTrigger, reason: str, request: DumpRequest | None = None, *,
                    publish: bool = False) -> DumpRecord:
        """Take and write every format, hand them over, then write the record (the caller holds the lock)."""
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
        write_rank_stacks(self.out_dir, self.rank, taken_at=dumped_at)  # where each thread is; never raises
        job = self._identity()
        record = DumpRecord(rank=self.rank, host=self.host, local_rank=self.local_rank,
                            pid=os.getpid(), dumped_at=dumped_at, trigger=trigger,
                            reason=reason, files=files,
                            dump_seconds=round(self._clock() - started, 6),
                            world_size=job.world_size, process_groups=job.process_groups,
                            gpu_uuid=job.gpu_uuid, gpu_pci_bus_id=job.gpu_pci_bus_id,
                            torch_version=_torch_version())
        self._hand_over(record, request, publish=publish)
        write_atomic(record_path(self.out_dir, self.rank), record.model_dump_json(indent=1).encode())
        self._record = record
        self._dumped.set()
        _log.warning("rank %d dumped Flight Recorder (%s: %s) to %s", self.rank, trigger.value,
                     reason, ", ".join(files))
        return record

    def request(self, trigger: DumpTrigger, reason: str) -> DumpRecord:
        """Dump this rank, then ask every other rank to dump too."""
        record = self._dump(trigger, reason, None, publish=True)
        self._signal.send(DumpRequest(requested_by=f"rank {self.rank}", reason=reason,
                                      requested_at=record.dumped_at))
        return record

    def _hand_over(self, record: DumpRecord, request: DumpRequest | None, *, publish: bool) -> None:
        """Give the dump to ``after_dump`` with the incident's request, before the record is written.

        The record tells launchers and operators that this rank has dumped, and they may kill it
        then (torchrun tears the job down once a rank fails): the hand-over (spooling an upload)
        must be done by that time. The incident's request is the one this rank answers, else the
        first one published: a rank that is about to ask publishes its request now, and every rank
        asking in the same instant (they all fail together when a peer dies) reads the one that
        stood, so that all of them name one incident.
        """
        if self._after_dump is None:
            return
        own = DumpRequest(requested_by=f"rank {self.rank}", reason=record.reason, requested_at=record.dumped_at)
        if request is None and publish:
            self._signal.send(own)
        # A re-dump (trigger recovered) belongs to the incident of the first dump: a new version there.
        incident = request or self._incident or self._signal.receive() or own
        self._incident = incident
        try:
            self._after_dump(record, incident)
        except Exception:  # noqa: BLE001 - an upload problem must never take the training down
            _log.exception("rank %d: handing the dump over (after_dump) failed", self.rank)

    # -- watchdog -----------------------------------------------------------------------------

    def poll_once(self) -> DumpRecord | None:
        """One watchdog step: answer a pending request, else look for a stall; after the dump,
        look for the recovery. Returns a new dump."""
        if self._record is not None:
            return self._redump_if_recovered()
        incoming = self._signal.receive()
        if incoming is not None:
            return self.dump_now(DumpTrigger.REQUEST, f"{incoming.requested_by}: {incoming.reason}", incoming)
        progress = self._source().progress()
        if not self._warm and any(p.last_enqueued > 0 for p in progress.values()):
            self.warm_up()
        blocked = self._watch.observe(progress, self._clock())
        reason = self._stall_reason(blocked)
        return self.request(DumpTrigger.STALL, reason) if reason is not None else None

    def _redump_if_recovered(self) -> DumpRecord | None:
        # Under the lock: a dump in progress on another thread is finished, its watch set.
        with self._lock:
            if self._moved_past is None:
                return None
            progress = self._source().progress()
            completed = self._moved_past.completed(progress)
            if not completed:
                return None
            if not self._moved_past.confirming:
                # Gloo counts an op that ended in an error (its timeout, a dead peer) as completed:
                # only a newer op completed in time shows the job moved on (moved_past.py).
                _log.info("rank %d: %s completed since the dump; a recovered dump follows once a newer op "
                          "completes in time", self.rank, _ops(completed))
                self._moved_past = MovedPast.confirm_by_next(progress)
                return None
            late = self._maybe_timed_out(completed)
            if late is None:
                self._moved_past = None  # cannot be judged: the hang's dump stands, and the watch ends
                return None
            in_time = {pg: seq for pg, seq in completed.items() if pg not in late}
            if not in_time:
                _log.warning("rank %d: local group(s) %s completed at or past the op's deadline, perhaps by "
                             "its timeout; no recovered dump until a newer op completes in time",
                             self.rank, ", ".join(late))
                self._moved_past = MovedPast.confirm_by_next(progress)
                return None
            self._moved_past = None
            return self._write_dump(DumpTrigger.RECOVERED, f"completed since the first dump: {_ops(in_time)}")

    def _maybe_timed_out(self, completed: dict[str, int]) -> list[str] | None:
        """The groups whose op in ``completed`` was seen complete at or past its deadline, or whose
        deadline FR does not give; None when the ring cannot be read (said once, in the log)."""
        default_ms = int(self._timeout.total_seconds() * 1000) if self._timeout else None
        try:
            deadlines = self._source().op_deadlines(completed, default_ms)
        except Exception:  # noqa: BLE001 - the watchdog must never take the training down
            _log.exception("rank %d: reading the deadlines of %s failed; whether the job recovered cannot be "
                           "judged, so the hang's dump stands and no recovered dump will follow", self.rank, completed)
            return None
        now = self._wall_clock()
        return sorted(pg for pg in completed if pg not in deadlines or now >= deadlines[pg])

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
        while not self._stop.is_set() and (self._record is None or self._moved_past is not None):
            try:
                self.poll_once()
            except Exception:  # noqa: BLE001 - the watchdog must never take the training down
                _log.exception("rank %d: hang dumper poll failed; will retry", self.rank)
            self._stop.wait(self._poll_s)


def _ops(completed: dict[str, int]) -> str:
    """``local group 0 #4, local group 1 #6``."""
    return ", ".join(f"local group {pg} #{seq}" for pg, seq in sorted(completed.items()))


def _torch_version() -> str | None:
    """The version of the torch the job imported; never imports it (the dumper may run without)."""
    version = getattr(sys.modules.get("torch"), "__version__", None)
    return str(version)[:64] if version is not None else None


# torch 2.14 imports torch._inductor the first time it symbolizes a dump's stack frames: measured
# 10.4 s for the first dump with stacks in one Gloo process on the shared 2-core machine (15-21 s
# with four processes), against milliseconds after. Imported in a daemon thread as the dumper
# starts (13.4 s there, off the training thread), the first dump took 0.00 s.
_SYMBOLIZER_IMPORT_FROM = (2, 14)
_SYMBOLIZER_MODULE = "torch._inductor"


def torch_release(version: str) -> tuple[int, int]:
    """``"2.14.1+cu130"`` -> ``(2, 14)``; ``(0, 0)`` for text that is not a release number."""
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return 0, 0


def start_symbolizer_import() -> threading.Thread | None:
    """Pay torch's symbolizer import now, in a daemon thread, where the job's torch needs it."""
    version = _torch_version()
    if version is None or torch_release(version) < _SYMBOLIZER_IMPORT_FROM or _SYMBOLIZER_MODULE in sys.modules:
        return None
    thread = threading.Thread(target=_import_quietly, args=(_SYMBOLIZER_MODULE,), daemon=True,
                              name="denpex-symbolizer-import")
    thread.start()
    return thread


def _import_quietly(module: str) -> None:
    try:
        importlib.import_module(module)
    except Exception:  # noqa: BLE001 - a failed warm-up only leaves the first dump slow
        _log.info("importing %s ahead of the first dump failed; the first dump will be slow", module,
                  exc_info=True)
