"""The real Flight Recorder reader, on a one-rank Gloo group in this process."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from denpex.collector import (
    DumpFormat,
    DumpTrigger,
    GroupProgress,
    HangDumper,
    TorchFlightRecorder,
    dump_path,
    read_dump_records,
)
from denpex.evidence.safe_pickle import safe_loads

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    if dist.is_initialized():
        pytest.skip("a default process group already exists in this test process")
    store = dist.FileStore(str(tmp_path_factory.mktemp("store") / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1,
                            timeout=timedelta(seconds=30))
    try:
        for _ in range(2):
            dist.all_reduce(torch.ones(4))
        _settle_with_a_retired_last_op(TorchFlightRecorder(), "0")
        yield
    finally:
        dist.destroy_process_group()


def _settle_with_a_retired_last_op(recorder: TorchFlightRecorder, pg_id: str, attempts: int = 5) -> None:
    """One more collective, until Flight Recorder shows it retired.

    Gloo retires an FR entry from the work's completion callback, which may run just after
    all_reduce() has returned to us. CI saw the last op left unretired for good: one behind
    after 10 s, then after 60 s. A fresh op gets a fresh callback; the tests need a group with
    nothing in flight, not that particular op."""
    progress = recorder.progress().get(pg_id)
    for _ in range(attempts):
        before = progress.last_enqueued if progress is not None else -1
        dist.all_reduce(torch.ones(4))
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            progress = recorder.progress()[pg_id]
            # Our op must be the one seen retired: CI once read 2 of 3 after an earlier settle.
            if progress.last_enqueued > before and progress.last_completed == progress.last_enqueued:
                return
            time.sleep(0.01)
    pytest.fail(f"Flight Recorder retired none of {attempts} last collectives of group {pg_id}: {progress}")


def test_progress_reads_pg_status(one_rank: None) -> None:
    _settle_with_a_retired_last_op(TorchFlightRecorder(), "0")  # this test's own settled group
    progress = TorchFlightRecorder().progress()
    assert progress["0"].last_enqueued >= 3
    assert progress["0"] == GroupProgress(progress["0"].last_enqueued, progress["0"].last_enqueued)
    assert progress["0"].in_flight is None


def test_dumps_are_plain_data_in_both_encodings(one_rank: None) -> None:
    recorder = TorchFlightRecorder()
    from_pickle = safe_loads(recorder.dump(DumpFormat.PICKLE))
    from_json = json.loads(recorder.dump(DumpFormat.JSON))
    assert isinstance(from_pickle, dict)
    assert from_pickle["version"] == from_json["version"] == "2.10"
    last = from_pickle["entries"][-1]
    assert last["process_group"] == ("0", "default_pg") and last["profiling_name"] == "gloo:all_reduce"
    assert last["frames"], "the pickle carries stack traces"
    assert "frames" not in from_json["entries"][-1]


def test_a_retired_op_is_not_in_flight(one_rank: None) -> None:
    recorder = TorchFlightRecorder()
    _settle_with_a_retired_last_op(recorder, "0")
    assert recorder.in_flight_op("0", recorder.progress()["0"].last_enqueued) is None


def test_dump_now_writes_what_the_evidence_loader_reads(one_rank: None, tmp_path: Path) -> None:
    dumper = HangDumper(tmp_path, rank=0, collective_timeout=timedelta(seconds=30),
                        host=socket.gethostname(), formats=(DumpFormat.PICKLE, DumpFormat.JSON))
    assert dumper.warm_up() >= 0.0
    record = dumper.dump_now(DumpTrigger.MANUAL, "test")
    assert safe_loads(dump_path(tmp_path, 0, DumpFormat.PICKLE).read_bytes())["entries"]
    assert json.loads(dump_path(tmp_path, 0, DumpFormat.JSON).read_bytes())["entries"]
    assert read_dump_records(tmp_path) == {0: record}
