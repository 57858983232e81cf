"""Recovery before action: newer dumps past the stuck collective withdraw the plan."""

from __future__ import annotations

from datetime import timedelta

from denpex.analysis.models import Candidate, CandidateKind, StuckCollective, TriageResult, Verdict
from denpex.isolation.plan import utc_now
from denpex.workflow.recovery import check_recovery

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
    check = check_recovery(_hung(), _healthy(30))
    assert check.recovered and "group '2' past collective #3" in check.reason


def test_a_later_hang_elsewhere_still_counts_as_recovered_from_this_one() -> None:
    assert check_recovery(_hung(seq=3), _hung(as_of_delta=60, seq=9)).recovered


def test_same_evidence_is_not_a_recovery() -> None:
    check = check_recovery(_hung(), _hung())
    assert not check.recovered and "no newer evidence" in check.reason


def test_still_stuck_is_not_a_recovery() -> None:
    check = check_recovery(_hung(), _hung(as_of_delta=30))
    assert not check.recovered and "still stuck: group '2' #3" in check.reason


def test_a_silent_culprit_is_not_a_recovery() -> None:
    after = _healthy(30).model_copy(update={"ranks_with_evidence": [0, 1, 3], "missing_ranks": [2]})
    assert not check_recovery(_hung(), after).recovered
