"""The hang dumper's logic, driven poll by poll with an in-memory Flight Recorder and a manual clock.

The real recorder is covered in test_torch_flight_recorder.py, and 4 real Gloo ranks in
tests/gloo_real/.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from denpex.collector import (
    BlockedOp,
    DumpFormat,
    DumpRecord,
    DumpRequest,
    DumpTrigger,
    FileDumpSignal,
    GroupProgress,
    HangDumper,
    InFlightOp,
    StallWatch,
    StoreDumpSignal,
    dump_path,
    rank_identities,
    read_dump_records,
    record_path,
    request_dump,
    request_path,
    stall_threshold,
    write_atomic,
)
from denpex.evidence.manifest import RankIdentity

BOTH = (DumpFormat.PICKLE, DumpFormat.JSON)


class MemoryRecorder:
    """An in-memory Flight Recorder: progress and in-flight ops are set by the test."""

    def __init__(self, status: dict[str, GroupProgress] | None = None) -> None:
        self.status = dict(status or {})
        self.ops: dict[tuple[str, int], InFlightOp] = {}
        self.deadlines: dict[tuple[str, int], float] = {}
        """Set by a test; any other op's deadline is far off, and ops in ``unknown`` have none."""
        self.unknown: set[tuple[str, int]] = set()
        self.dumps: Counter[DumpFormat] = Counter()
        self.lookups = 0

    def progress(self) -> dict[str, GroupProgress]:
        return dict(self.status)

    def in_flight_op(self, pg_id: str, seq: int) -> InFlightOp | None:
        self.lookups += 1
        return self.ops.get((pg_id, seq))

    def op_deadlines(self, ops: dict[str, int], default_timeout_ms: int | None = None) -> dict[str, float]:
        return {pg: self.deadlines.get((pg, seq), 1e12) for pg, seq in ops.items() if (pg, seq) not in self.unknown}

    def dump(self, fmt: DumpFormat) -> bytes:
        self.dumps[fmt] += 1
        return f"{fmt.value} dump #{self.dumps[fmt]}".encode()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_dumper(tmp_path: Path, recorder: MemoryRecorder, clock: Clock, **kw: object) -> HangDumper:
    options: dict[str, object] = {"rank": 2, "collective_timeout": timedelta(seconds=4),
                                  "host": "gpu-node-003", "local_rank": 1, "formats": BOTH}
    options.update(kw)
    return HangDumper(tmp_path, recorder=recorder, clock=clock, **options)  # type: ignore[arg-type]


def stuck(enqueued: int = 5) -> dict[str, GroupProgress]:
    return {"0": GroupProgress(3, 3), "1": GroupProgress(enqueued, enqueued - 1)}


# -- StallWatch and thresholds -------------------------------------------------------------------

@pytest.mark.parametrize(("polls", "expected"), [
    pytest.param([({"0": (3, 3)}, 0.0)], [], id="nothing-in-flight"),
    pytest.param([({"0": (4, 3)}, 0.0), ({"0": (4, 3)}, 1.0), ({"0": (4, 3)}, 2.0)],
                 [BlockedOp("0", 4, 0.0, 3)], id="same-op-keeps-first-seen"),
    pytest.param([({"0": (4, 3)}, 0.0), ({"0": (5, 4)}, 1.0)],
                 [BlockedOp("0", 5, 1.0, 1)], id="progress-resets"),
    pytest.param([({"0": (4, 3)}, 0.0), ({"0": (4, 4)}, 1.0), ({"0": (5, 4)}, 2.0)],
                 [BlockedOp("0", 5, 2.0, 1)], id="finished-op-is-forgotten"),
    pytest.param([({"0": (4, 3), "1": (7, 7)}, 0.0), ({"0": (4, 3), "1": (8, 7)}, 1.0)],
                 [BlockedOp("0", 4, 0.0, 2), BlockedOp("1", 8, 1.0, 1)], id="oldest-first"),
])
def test_stall_watch(polls: list[tuple[dict[str, tuple[int, int]], float]],
                     expected: list[BlockedOp]) -> None:
    watch = StallWatch()
    result: list[BlockedOp] = []
    for status, now in polls:
        result = watch.observe({pg: GroupProgress(*c) for pg, c in status.items()}, now)
    assert result == expected


@pytest.mark.parametrize(("configured", "op_ms", "expected"), [
    pytest.param(timedelta(seconds=8), None, timedelta(seconds=6), id="configured-only"),
    pytest.param(None, 4000, timedelta(seconds=3), id="op-only"),
    pytest.param(timedelta(minutes=10), 4000, timedelta(seconds=3), id="op-shorter-wins"),
    pytest.param(timedelta(seconds=4), 1_800_000, timedelta(seconds=3), id="configured-shorter-wins"),
    pytest.param(None, None, None, id="unknown"),
    pytest.param(None, 0, None, id="zero-op-timeout-is-unknown"),
])
def test_stall_threshold(configured: timedelta | None, op_ms: int | None,
                         expected: timedelta | None) -> None:
    assert stall_threshold(0.75, configured, op_ms) == expected


# -- HangDumper, one poll at a time --------------------------------------------------------------

def test_dumps_and_signals_once_blocked_for_the_fraction_of_the_timeout(tmp_path: Path) -> None:
    recorder, clock = MemoryRecorder(stuck()), Clock()
    recorder.ops[("1", 5)] = InFlightOp("1", 5, "tp-3", "gloo:all_reduce", None)
    dumper = make_dumper(tmp_path, recorder, clock)
    assert dumper.poll_once() is None  # first sight
    clock.now += 2.9
    assert dumper.poll_once() is None  # 2.9 s < 0.75 x 4 s
    clock.now += 0.1
    record = dumper.poll_once()

    assert record is not None and record.trigger is DumpTrigger.STALL
    assert "gloo:all_reduce in group 'tp-3' (collective_seq_id 5)" in record.reason
    assert record.files == ["rank_2.pkl", "rank_2.json"]
    # The first dump of each format was the warm-up; the files hold the second.
    assert dump_path(tmp_path, 2, DumpFormat.PICKLE).read_bytes() == b"pickle dump #2"
    assert dump_path(tmp_path, 2, DumpFormat.JSON).read_bytes() == b"json dump #2"
    assert DumpRecord.model_validate_json(record_path(tmp_path, 2).read_bytes()) == record
    request = DumpRequest.model_validate_json(request_path(tmp_path).read_bytes())
    assert request.requested_by == "rank 2" and request.reason == record.reason
    assert (record.host, record.local_rank) == ("gpu-node-003", 1)
    assert dumper.poll_once() is None and dumper.record == record  # once only


def test_op_timeout_shorter_than_configured_wins(tmp_path: Path) -> None:
    recorder, clock = MemoryRecorder(stuck()), Clock()
    recorder.ops[("1", 5)] = InFlightOp("1", 5, "1", "gloo:broadcast", timeout_ms=2000)
    dumper = make_dumper(tmp_path, recorder, clock, collective_timeout=timedelta(minutes=30))
    dumper.poll_once()
    clock.now += 1.5
    record = dumper.poll_once()
    assert record is not None and "1.5s = 0.75 x timeout" in record.reason


def test_a_job_that_keeps_progressing_never_dumps_and_skips_lookups(tmp_path: Path) -> None:
    recorder, clock = MemoryRecorder(), Clock()
    dumper = make_dumper(tmp_path, recorder, clock)
    for seq in range(1, 50):
        recorder.status = {"0": GroupProgress(seq, seq - 1)}
        assert dumper.poll_once() is None
        clock.now += 10.0
    assert recorder.lookups == 0  # each op was seen once: no full read needed
    assert not record_path(tmp_path, 2).exists()


def test_without_trigger_fraction_it_waits_for_a_request(tmp_path: Path) -> None:
    recorder, clock = MemoryRecorder(stuck()), Clock()
    dumper = make_dumper(tmp_path, recorder, clock, trigger_fraction=None)
    dumper.poll_once()
    clock.now += 3600
    assert dumper.poll_once() is None
    request_dump(tmp_path, "stalled past the timeout")
    record = dumper.poll_once()
    assert record is not None and record.trigger is DumpTrigger.REQUEST
    assert record.reason == "operator: stalled past the timeout"


def test_request_from_a_peer_dumps_a_rank_that_is_not_stuck(tmp_path: Path) -> None:
    recorder, clock = MemoryRecorder({"0": GroupProgress(9, 9)}), Clock()
    peer_signal = FileDumpSignal(request_path(tmp_path))
    peer_signal.send(DumpRequest(requested_by="rank 0", reason="blocked 3.0s in ...",
                                 requested_at=datetime(2026, 11, 29, tzinfo=UTC)))
    record = make_dumper(tmp_path, recorder, clock).poll_once()
    assert record is not None and record.trigger is DumpTrigger.REQUEST
    assert record.reason == "rank 0: blocked 3.0s in ..."
    # The first request stays: answering does not overwrite it.
    assert peer_signal.receive().requested_by == "rank 0"  # type: ignore[union-attr]


def test_warm_up_happens_once_when_entries_appear(tmp_path: Path) -> None:
    recorder, clock = MemoryRecorder({"0": GroupProgress(0, 0)}), Clock()
    dumper = make_dumper(tmp_path, recorder, clock)
    dumper.poll_once()
    assert recorder.dumps == Counter()  # nothing recorded yet: a warm-up would be pointless
    recorder.status = {"0": GroupProgress(1, 1)}
    dumper.poll_once()
    dumper.poll_once()
    assert recorder.dumps == Counter({DumpFormat.PICKLE: 1, DumpFormat.JSON: 1})


def test_dump_now_is_idempotent(tmp_path: Path) -> None:
    dumper = make_dumper(tmp_path, MemoryRecorder(), Clock(), formats=(DumpFormat.JSON,))
    first = dumper.dump_now(DumpTrigger.MANUAL, "end of run")
    again = dumper.dump_now(DumpTrigger.ERROR, "later")
    assert again is first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["collector", "rank_2.json"]
    assert dump_path(tmp_path, 2, DumpFormat.JSON).read_bytes() == b"json dump #1"


# -- the thread and the context manager ----------------------------------------------------------

def test_context_manager_dumps_and_signals_when_the_body_raises(tmp_path: Path) -> None:
    dumper = make_dumper(tmp_path, MemoryRecorder(), Clock(), poll_interval=timedelta(seconds=0.01))
    with pytest.raises(RuntimeError, match="Connection closed by peer"), dumper:
        raise RuntimeError("Connection closed by peer [127.0.0.1]:1234")
    assert dumper.record is not None and dumper.record.trigger is DumpTrigger.ERROR
    assert dumper.record.reason == "RuntimeError: Connection closed by peer [127.0.0.1]:1234"
    assert FileDumpSignal(request_path(tmp_path)).receive() is not None


def test_context_manager_leaves_no_dump_after_a_clean_run(tmp_path: Path) -> None:
    with make_dumper(tmp_path, MemoryRecorder(), Clock(),
                     poll_interval=timedelta(seconds=0.01)) as dumper:
        pass
    assert dumper.record is None and not (tmp_path / "rank_2.pkl").exists()
    with pytest.raises(RuntimeError, match="already started"):
        dumper.start()


def test_watchdog_thread_answers_a_request(tmp_path: Path) -> None:
    with make_dumper(tmp_path, MemoryRecorder(), Clock(),
                     poll_interval=timedelta(seconds=0.01)) as dumper:
        request_dump(tmp_path, "operator asked", requested_by="on-call")
        record = dumper.wait_dumped(timedelta(seconds=10))
    assert record is not None and record.reason == "on-call: operator asked"


def test_watchdog_thread_survives_a_failing_recorder(tmp_path: Path) -> None:
    class Flaky(MemoryRecorder):
        calls = 0

        def progress(self) -> dict[str, GroupProgress]:
            self.calls += 1
            if self.calls < 3:
                raise OSError("transient")
            return super().progress()

    recorder = Flaky()
    with make_dumper(tmp_path, recorder, Clock(), poll_interval=timedelta(seconds=0.01)) as dumper:
        deadline = threading.Event()
        while recorder.calls < 4 and not deadline.wait(0.01):
            pass
        request_dump(tmp_path, "after the failures")
        assert dumper.wait_dumped(timedelta(seconds=10)) is not None


@pytest.mark.parametrize(("kw", "message"), [
    pytest.param({"rank": -1}, "rank must be >= 0", id="negative-rank"),
    pytest.param({"trigger_fraction": 1.0}, "precedes the timeout", id="fraction-one"),
    pytest.param({"trigger_fraction": 0.0}, "precedes the timeout", id="fraction-zero"),
    pytest.param({"formats": ()}, "formats is empty", id="no-format"),
    pytest.param({"poll_interval": timedelta(0)}, "must be positive", id="zero-poll"),
])
def test_constructor_refuses_bad_settings(tmp_path: Path, kw: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_dumper(tmp_path, MemoryRecorder(), Clock(), **kw)


# -- signals, records and files ------------------------------------------------------------------

def test_file_signal_reads_a_garbled_request_as_a_request(tmp_path: Path) -> None:
    path = request_path(tmp_path)
    assert FileDumpSignal(path).receive() is None
    write_atomic(path, b"please dump")
    request = FileDumpSignal(path).receive()
    assert request is not None and str(path) in request.reason


def test_file_signal_keeps_the_first_request(tmp_path: Path) -> None:
    at = datetime(2026, 11, 29, 18, 45, tzinfo=UTC)
    signal = FileDumpSignal(request_path(tmp_path))
    signal.send(DumpRequest(requested_by="rank 3", reason="stall", requested_at=at))
    signal.send(DumpRequest(requested_by="rank 1", reason="later", requested_at=at))
    assert signal.receive() == DumpRequest(requested_by="rank 3", reason="stall", requested_at=at)
    assert [p.name for p in request_path(tmp_path).parent.iterdir()] == ["dump-request.json"]


@pytest.mark.parametrize("kind", ["hash", "file"])
def test_store_signal_on_a_real_c10d_store(tmp_path: Path, kind: str) -> None:
    dist = pytest.importorskip("torch.distributed")
    store = dist.HashStore() if kind == "hash" else dist.FileStore(str(tmp_path / "store"), 1)
    first, second = StoreDumpSignal(store), StoreDumpSignal(store)
    assert second.receive() is None
    at = datetime(2026, 11, 29, 18, 45, tzinfo=UTC)
    first.send(DumpRequest(requested_by="rank 3", reason="stall", requested_at=at))
    second.send(DumpRequest(requested_by="rank 1", reason="later", requested_at=at))
    assert second.receive() == DumpRequest(requested_by="rank 3", reason="stall", requested_at=at)


def test_store_signal_reads_an_unreadable_value_as_a_request() -> None:
    dist = pytest.importorskip("torch.distributed")
    store = dist.HashStore()
    store.set("denpex/dump-request", "not a request")
    request = StoreDumpSignal(store).receive()
    assert request is not None and request.requested_by == "unknown"
    assert "denpex/dump-request" in request.reason


def test_records_merge_into_manifest_identities(tmp_path: Path) -> None:
    at = datetime(2026, 11, 29, 18, 45, 2, tzinfo=UTC)
    for rank in (0, 2):
        record = DumpRecord(rank=rank, host=f"node-{rank}", local_rank=0, pid=100 + rank,
                            dumped_at=at, trigger=DumpTrigger.STALL, reason="r",
                            files=[f"rank_{rank}.pkl"], dump_seconds=0.01)
        write_atomic(record_path(tmp_path, rank), record.model_dump_json().encode())
    write_atomic(record_path(tmp_path, 9), b"{not json")
    records = read_dump_records(tmp_path)
    assert sorted(records) == [0, 2]

    launched = {r: RankIdentity(host=f"node-{r}", pid=100 + r, gpu_index=r) for r in range(3)}
    merged = rank_identities(records.values(), launched)
    assert merged[0] == RankIdentity(host="node-0", local_rank=0, pid=100, gpu_index=0, dumped_at=at)
    assert merged[1] == launched[1]  # no dump: what the launcher knew, no dumped_at
    assert list(merged) == [0, 1, 2]


def test_write_atomic_leaves_only_the_file(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "rank_0.json"
    write_atomic(target, json.dumps({"a": 1}).encode())
    write_atomic(target, b"{}")
    assert [p.name for p in target.parent.iterdir()] == ["rank_0.json"]
    assert target.read_bytes() == b"{}"


def test_dumps_again_once_the_ops_in_flight_at_the_dump_complete(tmp_path: Path) -> None:
    """A stopped peer is continued: the blocked collective completes, and the rank's dump is
    replaced by one that shows it, so a flow waiting for approval sees the recovery."""
    recorder, clock = MemoryRecorder(stuck()), Clock()
    dumper = make_dumper(tmp_path, recorder, clock)
    dumper.poll_once()
    clock.now += 3.0
    first = dumper.poll_once()
    assert first is not None and first.trigger is DumpTrigger.STALL
    assert dumper.poll_once() is None  # still blocked: nothing new

    recorder.status = {"0": GroupProgress(3, 3), "1": GroupProgress(5, 5)}  # local group 1 #5 completed
    assert dumper.poll_once() is None  # by success, or by an error (Gloo counts both): not yet proof
    recorder.status = {"0": GroupProgress(3, 3), "1": GroupProgress(6, 6)}  # the next step's op completed
    again = dumper.poll_once()
    assert again is not None and again.trigger is DumpTrigger.RECOVERED
    assert again.reason == "completed since the first dump: local group 1 #6"
    assert dump_path(tmp_path, 2, DumpFormat.PICKLE).read_bytes() == b"pickle dump #3"
    assert DumpRecord.model_validate_json(record_path(tmp_path, 2).read_bytes()) == again
    assert dumper.record == again
    recorder.status = {"0": GroupProgress(3, 3), "1": GroupProgress(8, 7)}  # later ops: no third dump
    clock.now += 10
    assert dumper.poll_once() is None and dumper.record == again


def test_a_rank_that_answered_a_request_between_collectives_dumps_again_once_it_completes_one(
        tmp_path: Path) -> None:
    """A stopped rank is continued: its watchdog answers the pending request before the main
    thread re-enters the collective its peers wait in, so the dump shows it behind (#3 done,
    nothing in flight). Once it completes #4, it dumps again: else it would look behind for good."""
    recorder, clock = MemoryRecorder({"0": GroupProgress(3, 3)}), Clock()
    dumper = make_dumper(tmp_path, recorder, clock)
    request_dump(tmp_path, reason="rank 0 blocked in #4")
    first = dumper.poll_once()
    assert first is not None and first.trigger is DumpTrigger.REQUEST
    recorder.status = {"0": GroupProgress(4, 3)}  # entered #4, not finished: the dump still holds
    assert dumper.poll_once() is None
    recorder.status = {"0": GroupProgress(4, 4)}
    assert dumper.poll_once() is None  # #4 may have ended in an error: its next op is the proof
    recorder.status = {"0": GroupProgress(5, 5)}
    again = dumper.poll_once()
    assert again is not None and again.trigger is DumpTrigger.RECOVERED
    assert again.reason == "completed since the first dump: local group 0 #5"
    assert dump_path(tmp_path, 2, DumpFormat.PICKLE).read_bytes() == b"pickle dump #2"  # over the first
    recorder.status = {"0": GroupProgress(9, 9)}  # once more only
    assert dumper.poll_once() is None and dumper.record == again


def test_a_manual_dump_with_nothing_in_flight_never_dumps_again(tmp_path: Path) -> None:
    recorder, clock = MemoryRecorder({"0": GroupProgress(3, 3)}), Clock()
    dumper = make_dumper(tmp_path, recorder, clock)
    first = dumper.dump_now(DumpTrigger.MANUAL, "end of a healthy run")
    recorder.status = {"0": GroupProgress(9, 9)}
    assert dumper.poll_once() is None and dumper.record == first


class WallClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _stalled_dump(tmp_path: Path, wall: WallClock) -> tuple[MemoryRecorder, HangDumper, DumpRecord]:
    """Rank 2 dumped on a stall in local group 1 #5 (a 4 s timeout from t=1000 s); group 0 idle."""
    recorder, clock = MemoryRecorder(stuck()), Clock()
    recorder.deadlines = {("1", 5): 1004.0, ("1", 6): 1010.0, ("1", 7): 1016.0, ("0", 4): 1012.0}
    dumper = make_dumper(tmp_path, recorder, clock, wall_clock=wall)
    dumper.poll_once()
    clock.now += 3.0
    first = dumper.poll_once()
    assert first is not None and first.trigger is DumpTrigger.STALL
    return recorder, dumper, first


def test_an_op_that_ends_by_its_timeout_gives_no_recovered_dump(tmp_path: Path) -> None:
    """Gloo counts a timed-out collective as completed (``last_completed_collective`` reaches it,
    its entry reads ``retired``): that is the hang ending in an error, not a recovery, and the
    first dump must stay the one that shows the hang. Nor is a retry that times out too; only a
    newer op completed in time is."""
    wall = WallClock(1003.5)
    recorder, dumper, first = _stalled_dump(tmp_path, wall)

    wall.now = 1004.2  # the 4 s timeout fired: Gloo retires #5 and counts it completed
    recorder.status = {"0": GroupProgress(3, 3), "1": GroupProgress(5, 5)}
    assert dumper.poll_once() is None
    assert dump_path(tmp_path, 2, DumpFormat.PICKLE).read_bytes() == b"pickle dump #2"  # the first dump stands
    wall.now = 1010.5
    recorder.status = {"0": GroupProgress(3, 3), "1": GroupProgress(6, 6)}  # a retry of #6 timed out too
    assert dumper.poll_once() is None and dumper.record == first

    wall.now = 1011.0
    recorder.status = {"0": GroupProgress(3, 3), "1": GroupProgress(7, 7)}  # #7 finished in time
    again = dumper.poll_once()
    assert again is not None and again.trigger is DumpTrigger.RECOVERED
    assert again.reason == "completed since the first dump: local group 1 #7"


def test_a_rarely_used_stuck_group_is_confirmed_by_the_next_op_of_any_group(tmp_path: Path) -> None:
    """Hostile review: stuck in a checkpoint group the job uses once an hour, a recovered job goes
    on in its step groups; waiting for the stuck group's next op left the hang's dump in place and
    let the flow drain the node of a job that had recovered. A late op in one group does not veto
    an in-time one in another."""
    wall = WallClock(1003.5)
    recorder, dumper, _ = _stalled_dump(tmp_path, wall)
    recorder.status = {"0": GroupProgress(3, 3), "1": GroupProgress(5, 5)}  # #5 completed: arms
    assert dumper.poll_once() is None
    wall.now = 1011.0  # group 1's #6 is late (1010), group 0's #4 in time (1012)
    recorder.status = {"0": GroupProgress(4, 4), "1": GroupProgress(6, 6)}
    again = dumper.poll_once()
    assert again is not None and again.trigger is DumpTrigger.RECOVERED
    assert again.reason == "completed since the first dump: local group 0 #4"


def test_a_body_that_returns_after_its_last_collective_completed_is_a_recovery(tmp_path: Path) -> None:
    """The stuck op was the job's last collective (a final barrier): no newer op can confirm it,
    and the body returning without an error is the proof. Returning with an error is not."""
    for raises in (False, True):
        folder = tmp_path / str(raises)
        wall = WallClock(1003.5)
        recorder, dumper, first = _stalled_dump(folder, wall)
        recorder.status = {"0": GroupProgress(3, 3), "1": GroupProgress(5, 5)}  # #5 completed
        if raises:
            with pytest.raises(RuntimeError):
                with dumper:
                    raise RuntimeError("Connection closed by peer")
            assert dumper.record == first
        else:
            with dumper:
                pass
            assert dumper.record is not None and dumper.record.trigger is DumpTrigger.RECOVERED
            assert "returned without an error" in dumper.record.reason


def test_an_op_that_completes_before_its_deadline_and_then_the_next_is_a_recovery(tmp_path: Path) -> None:
    wall = WallClock(1003.5)
    recorder, dumper, _ = _stalled_dump(tmp_path, wall)
    wall.now = 1003.9
    recorder.status = {"0": GroupProgress(3, 3), "1": GroupProgress(5, 5)}
    assert dumper.poll_once() is None
    wall.now = 1004.5
    recorder.status = {"0": GroupProgress(3, 3), "1": GroupProgress(6, 6)}  # #6's deadline is 1010
    again = dumper.poll_once()
    assert again is not None and again.trigger is DumpTrigger.RECOVERED


def test_an_op_that_a_dead_peer_ended_early_gives_no_recovered_dump(tmp_path: Path) -> None:
    """CI, under load: the peer exited, Gloo's op raised "Connection closed by peer" before its
    deadline and counted as completed, and the old rule wrote a recovered dump over the hang's.
    The job raised and made no further collective: the hang's dump stands."""
    wall = WallClock(1003.5)
    recorder, dumper, first = _stalled_dump(tmp_path, wall)
    wall.now = 1003.6
    recorder.status = {"0": GroupProgress(3, 3), "1": GroupProgress(5, 5)}
    for _ in range(3):
        wall.now += 5
        assert dumper.poll_once() is None
    assert dumper.record == first and dump_path(tmp_path, 2, DumpFormat.PICKLE).read_bytes() == b"pickle dump #2"


def test_unreadable_deadlines_keep_the_hangs_dump(tmp_path: Path) -> None:
    wall = WallClock(1003.5)
    recorder, dumper, first = _stalled_dump(tmp_path, wall)

    calls = []

    def broken(ops: dict[str, int], default_timeout_ms: int | None = None) -> dict[str, float]:
        calls.append(ops)
        raise RuntimeError("FR read failed")
    recorder.op_deadlines = broken  # type: ignore[method-assign]
    recorder.status = {"0": GroupProgress(3, 3), "1": GroupProgress(5, 5)}
    assert dumper.poll_once() is None and dumper.record == first and not calls  # arms the confirmation
    recorder.status = {"0": GroupProgress(3, 3), "1": GroupProgress(6, 6)}
    assert dumper.poll_once() is None and dumper.record == first
    recorder.status = {"0": GroupProgress(3, 3), "1": GroupProgress(7, 7)}
    assert dumper.poll_once() is None and len(calls) == 1  # said once; the watch ended


def test_an_op_without_a_known_deadline_is_no_recovery_until_a_newer_one_completes_in_time(tmp_path: Path) -> None:
    wall = WallClock(1003.5)
    recorder, dumper, first = _stalled_dump(tmp_path, wall)
    recorder.unknown.add(("1", 5))  # FR holds no entry for #5 any more
    recorder.status = {"0": GroupProgress(3, 3), "1": GroupProgress(5, 5)}
    assert dumper.poll_once() is None and dumper.record == first
    recorder.status = {"0": GroupProgress(3, 3), "1": GroupProgress(6, 6)}
    again = dumper.poll_once()
    assert again is not None and again.trigger is DumpTrigger.RECOVERED
