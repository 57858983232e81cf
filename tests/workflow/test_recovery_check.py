"""Recovery before action: newer dumps past the stuck collective withdraw the plan."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

from denpex.analysis.models import Candidate, CandidateKind, StuckCollective, TriageResult, Verdict
from denpex.isolation.plan import utc_now
from denpex.analysis.triage import EvidenceInventory, take_inventory
from denpex.evidence.dump_ref import DumpRef
from denpex.evidence.files import write_atomic
from denpex.evidence.store import LocalStore
from denpex.workflow.recovery import check_recovery, newer_dumps

T0 = utc_now()


def _hung(as_of_delta: float = 0, seq: int = 3) -> TriageResult:
    return TriageResult(
        verdict=Verdict.LOCALIZED, world_size=4, ranks_with_evidence=[0, 1, 2, 3], missing_ranks=[],
        as_of=T0 + timedelta(seconds=as_of_delta),
        candidates=[Candidate(rank=2, kind=CandidateKind.NOT_ENTERED, process_group="2",
                              collective_seq_id=seq, confidence=0.9)],
        stuck=[StuckCollective(process_group="2", collective_seq_id=seq, op="all_reduce",
                               waiting_ranks=(3,), behind_ranks=(2,))],
    )


def _healthy(as_of_delta: float) -> TriageResult:
    return TriageResult(verdict=Verdict.NO_HANG, world_size=4, ranks_with_evidence=[0, 1, 2, 3],
                        missing_ranks=[], candidates=[], as_of=T0 + timedelta(seconds=as_of_delta))


def test_moved_past_the_collective_is_a_recovery() -> None:
    check = check_recovery(_hung(), _healthy(30), newer_ranks=[0, 1, 2, 3])
    assert check.recovered and "group '2' past collective #3" in check.reason


def test_a_later_hang_elsewhere_still_counts_as_recovered_from_this_one() -> None:
    assert check_recovery(_hung(seq=3), _hung(as_of_delta=60, seq=9), newer_ranks=[3]).recovered


def test_same_evidence_is_not_a_recovery() -> None:
    check = check_recovery(_hung(), _healthy(30), newer_ranks=[])
    assert not check.recovered and "no newer evidence" in check.reason


def test_still_stuck_is_not_a_recovery() -> None:
    check = check_recovery(_hung(), _hung(as_of_delta=30), newer_ranks=[0])
    assert not check.recovered and "still stuck: group '2' #3" in check.reason


def test_a_silent_culprit_is_not_a_recovery() -> None:
    after = _healthy(30).model_copy(update={"ranks_with_evidence": [0, 1, 3], "missing_ranks": [2]})
    assert not check_recovery(_hung(), after, newer_ranks=[0, 1, 3]).recovered


def test_newer_dumps_are_judged_on_the_store_record(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    for rank in (0, 1):
        (tmp_path / f"rank_{rank}.pkl").write_bytes(b"x")
    os.utime(tmp_path / "rank_0.pkl", (1_000_000, 1_000_000))
    os.utime(tmp_path / "rank_1.pkl", (1_000_000, 1_000_000))
    before = take_inventory(store, world_size=3)
    assert newer_dumps(before, take_inventory(store, world_size=3)) == []
    (tmp_path / "rank_1.pkl").write_bytes(b"xy")
    (tmp_path / "rank_2.pkl").write_bytes(b"z")
    assert newer_dumps(before, take_inventory(store, world_size=3)) == [1, 2]


def _inventory(**versions: str | None) -> EvidenceInventory:
    at = T0.replace(microsecond=0)  # S3 keeps whole seconds
    return EvidenceInventory(store_uri="s3://evidence/inc", world_size=2, dumps={
        int(r[-1]): DumpRef("s3://evidence/inc", f"rank_{r[-1]}.pkl", int(r[-1]), 4096, at, v)
        for r, v in versions.items()})


def test_a_redump_in_the_same_second_at_the_same_size_is_newer_by_its_version() -> None:
    """A rank whose op completes just after its first dump writes again within the second, at the
    same size (an FR dump's size barely depends on the ops' states): only the ETag differs."""
    before = _inventory(r0='"etag-a"', r1='"etag-b"')
    assert newer_dumps(before, _inventory(r0='"etag-a"', r1='"etag-b"')) == []
    assert newer_dumps(before, _inventory(r0='"etag-c"', r1='"etag-b"')) == [0]


def test_a_local_rewrite_at_the_same_size_and_mtime_is_newer(tmp_path: Path) -> None:
    """An atomic rewrite is a new file (inode): newer even where the clock did not move."""
    store, path = LocalStore(tmp_path), tmp_path / "rank_0.pkl"
    write_atomic(path, b"ab")
    os.utime(path, ns=(1_000_000_000_123, 1_000_000_000_123))
    before = take_inventory(store, world_size=1)
    write_atomic(path, b"cd")
    os.utime(path, ns=(1_000_000_000_123, 1_000_000_000_123))
    after = take_inventory(store, world_size=1)
    assert (after.dumps[0].size, after.dumps[0].modified) == (before.dumps[0].size, before.dumps[0].modified)
    assert newer_dumps(before, after) == [0]
