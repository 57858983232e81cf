"""A batch reads the next dump while decoding this one where the store's reads wait (inline from a
local disk), and keeps order and per-file errors."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from denpex.analysis.batch import summarize_batch
from denpex.analysis.summary import RankSummary
from denpex.evidence.dump_ref import DumpRef
from denpex.evidence.skipped import SkippedFile
from denpex.evidence.store import LocalStore

GLOO = Path(__file__).resolve().parents[1] / "fixtures" / "gloo" / "withheld_one"


def _refs(folder: Path) -> list[DumpRef]:
    return [DumpRef(str(folder), f"rank_{r}.pkl", r, (folder / f"rank_{r}.pkl").stat().st_size) for r in range(4)]


def test_outcomes_keep_the_batch_order_and_a_bad_dump_is_skipped_alone(tmp_path: Path) -> None:
    folder = tmp_path / "dumps"
    shutil.copytree(GLOO, folder)
    refs = _refs(folder)
    (folder / "rank_1.pkl").write_bytes(b"\x80\x04not a pickle")
    (folder / "rank_2.pkl").unlink()  # gone between listing and reading
    outcomes = summarize_batch(refs)
    assert [o.rank for o in outcomes] == [0, 1, 2, 3]
    assert isinstance(outcomes[0], RankSummary) and isinstance(outcomes[3], RankSummary)
    assert isinstance(outcomes[1], SkippedFile) and isinstance(outcomes[2], SkippedFile)
    assert "cannot read" in outcomes[2].reason


class _ReadFailsOnceForMemory(LocalStore):
    """A read that lands while another dump's decode holds the process's memory cap."""

    reads_wait = True  # read on a thread, as from S3

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.failed: set[str] = set()

    def read(self, name: str, *, max_bytes: int) -> bytes:
        if name not in self.failed:
            self.failed.add(name)
            raise MemoryError
        return super().read(name, max_bytes=max_bytes)


def test_a_read_that_raced_a_decode_cap_is_read_again_not_skipped() -> None:
    store = _ReadFailsOnceForMemory(GLOO)
    outcomes = summarize_batch(_refs(GLOO), store=store)
    assert all(isinstance(o, RankSummary) for o in outcomes), outcomes
    assert store.failed == {f"rank_{r}.pkl" for r in range(4)}


class _ReaderThreadDies(LocalStore):
    """The first read of each dump ends its thread with nothing reported (as an error while the
    thread hands its result over would)."""

    reads_wait = True

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.died: set[str] = set()

    def read(self, name: str, *, max_bytes: int) -> bytes:
        if name not in self.died:
            self.died.add(name)
            raise SystemExit  # ends the reader thread silently
        return super().read(name, max_bytes=max_bytes)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_reader_thread_that_dies_unreported_cannot_hang_the_batch() -> None:
    store = _ReaderThreadDies(GLOO)
    outcomes = summarize_batch(_refs(GLOO), store=store)
    assert all(isinstance(o, RankSummary) for o in outcomes), outcomes


class _ThreadRecordingStore(LocalStore):
    def __init__(self, root: Path, reads_wait: bool) -> None:
        super().__init__(root)
        self.reads_wait = reads_wait
        self.threads: set[str] = set()

    def read(self, name: str, *, max_bytes: int) -> bytes:
        self.threads.add(threading.current_thread().name)
        return super().read(name, max_bytes=max_bytes)


@pytest.mark.parametrize("reads_wait", [True, False], ids=["network", "local"])
def test_only_a_store_whose_reads_wait_is_read_on_threads(reads_wait: bool) -> None:
    store = _ThreadRecordingStore(GLOO, reads_wait)
    outcomes = summarize_batch(_refs(GLOO), store=store)
    assert all(isinstance(o, RankSummary) for o in outcomes), outcomes
    here = threading.current_thread().name
    if reads_wait:
        assert store.threads == {f"denpex-read-{r}" for r in range(4)}
    else:
        assert store.threads == {here}


@pytest.mark.parametrize("size_seen", [0, 10, 100, 500], ids=["special-file", "grew", "as-is", "shrank"])
def test_a_local_read_is_capped_whatever_size_the_file_showed_when_opened(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size_seen: int) -> None:
    """The read is sized by the open file's size, and read on past it up to the cap: a file that
    grew after it was opened, or a special file (size 0), is still read whole or refused."""
    import os

    from denpex.evidence import store as store_module
    from denpex.evidence.errors import DumpError

    real_fstat = os.fstat

    class _Seen:
        def __init__(self, fd: int) -> None:
            self._st = real_fstat(fd)
            self.st_size = size_seen

    monkeypatch.setattr(store_module.os, "fstat", _Seen)
    (tmp_path / "dump").write_bytes(b"x" * 100)
    store = LocalStore(tmp_path)
    assert store.read("dump", max_bytes=100) == b"x" * 100
    assert store.read("dump", max_bytes=1000) == b"x" * 100
    with pytest.raises(DumpError, match="larger than the 99-byte cap"):
        store.read("dump", max_bytes=99)


def test_an_inline_read_that_ran_out_of_memory_is_read_again() -> None:
    class _FailsOnce(_ReadFailsOnceForMemory):
        reads_wait = False

    store = _FailsOnce(GLOO)
    outcomes = summarize_batch(_refs(GLOO), store=store)
    assert all(isinstance(o, RankSummary) for o in outcomes), outcomes
    assert store.failed == {f"rank_{r}.pkl" for r in range(4)}


def test_a_network_mount_is_read_ahead_and_a_local_disk_is_not(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from denpex.evidence import store as store_module

    mounts = tmp_path / "mounts"
    mounts.write_text("/dev/vda1 / ext4 rw 0 0\n"
                      f"server:/export {tmp_path}/shared\\040dumps nfs4 rw 0 0\n"
                      f"lustre@tcp:/fs {tmp_path}/lustre lustre rw 0 0\n")
    monkeypatch.setattr(store_module, "_MOUNTS", mounts)
    assert LocalStore(tmp_path / "shared dumps" / "inc-1").reads_wait is True
    assert LocalStore(tmp_path / "lustre").reads_wait is True
    assert LocalStore(tmp_path / "shared").reads_wait is False  # not the mount point's own folder
    assert LocalStore(tmp_path / "local").reads_wait is False


def test_a_worker_frees_a_hostile_self_referencing_dump_after_its_batch(tmp_path: Path) -> None:
    import gc
    import pickle

    from denpex.analysis.batch import summarize_in_worker

    loop: list[object] = []
    loop.append(loop)
    (tmp_path / "rank_0.pkl").write_bytes(pickle.dumps({"version": "2.10", "entries": loop}, protocol=2))
    ref = DumpRef(str(tmp_path), "rank_0.pkl", 0, 1)
    gc.collect()
    gc.disable()  # as in a worker (worker_init)
    try:
        [outcome] = summarize_in_worker([ref])
        assert isinstance(outcome, SkippedFile)
        assert gc.collect() == 0  # nothing the batch left behind was still waiting to be freed
    finally:
        gc.enable()


class _CountingStore(LocalStore):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.reads: list[str] = []

    def read(self, name: str, *, max_bytes: int) -> bytes:
        self.reads.append(name)
        return super().read(name, max_bytes=max_bytes)


def test_only_refs_in_the_given_store_are_read_through_it(tmp_path: Path) -> None:
    """A batch may hold refs of two stores: the given store reads its own, never another's names."""
    other = tmp_path / "other"
    shutil.copytree(GLOO, other)
    store = _CountingStore(GLOO)
    refs = _refs(GLOO)[:2] + _refs(other)[2:]
    outcomes = summarize_batch(refs, store=store)
    assert all(isinstance(o, RankSummary) for o in outcomes), outcomes
    assert store.reads == ["rank_0.pkl", "rank_1.pkl"]


def test_a_store_that_is_not_the_inventorys_is_refused(tmp_path: Path) -> None:
    from denpex.analysis.triage import take_inventory, triage_outcomes

    inventory = take_inventory(LocalStore(GLOO))
    outcomes = summarize_batch(_refs(GLOO))
    with pytest.raises(ValueError, match="not the inventory's"):
        triage_outcomes(inventory, outcomes, store=LocalStore(tmp_path))
    assert triage_outcomes(inventory, outcomes, store=LocalStore(GLOO)).verdict.value == "localized"
