"""Where each rank stands in a picture: its counters joined with the triage's answer.

The charts never see a dump or a full summary, only ``JobProgress`` (two counters per rank and
process group); ``rank_marks`` places each rank::

    summaries: rank 2 {"2": enqueued 2, completed 2}, rank 3 {"2": enqueued 3, completed 2}
    stuck: group "2" #3, waiting (3,), behind (2,); candidates: rank 2 not_entered
    -> RankMark(rank=2, state=culprit, process_group="2", last_enqueued=2, offset=-1)
       RankMark(rank=3, state=waiting, process_group="2", last_enqueued=3, offset=0)
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from denpex.analysis.job_progress import JobProgress
from denpex.analysis.models import CandidateKind, StuckCollective, TriageResult

__all__ = ["RankState", "RankMark", "rank_marks", "stuck_placement"]


class RankState(StrEnum):
    """How a rank appears in the pictures."""

    CULPRIT = "culprit"
    """A candidate of the triage: a rank behind the hang."""
    WAITING = "waiting"
    """It entered a stuck op and waits in it for others."""
    CLEAR = "clear"
    """It is in no stuck op (it ran on, or its groups are not stuck)."""
    NO_EVIDENCE = "no_evidence"
    """No usable or fresh dump, and not a candidate."""


class RankMark(BaseModel):
    """One rank's place in a picture."""

    model_config = ConfigDict(frozen=True)

    rank: int
    state: RankState
    culprit_kind: CandidateKind | None = None
    host: str | None = None
    process_group: str | None = None
    last_enqueued: int | None = None
    last_completed: int | None = None
    # The rank's last enqueued id minus the stuck op's id in that group: 0 sits in the stuck op,
    # below 0 never reached it, above 0 ran past it.
    offset: int | None = None


def stuck_placement(result: TriageResult) -> dict[int, StuckCollective]:
    """The stuck op that places each rank: a candidate's own group first, else the first stuck op
    it waits in or is behind in (the comparison lists direct blockages before chained ones)."""
    placement: dict[int, StuckCollective] = {}
    own_group = {c.rank: c.process_group for c in result.candidates if c.process_group is not None}
    for stuck in result.stuck:
        for rank in (*stuck.behind_ranks, *stuck.unknown_ranks):
            if own_group.get(rank) == stuck.process_group:
                placement.setdefault(rank, stuck)
    for stuck in result.stuck:
        for rank in (*stuck.behind_ranks, *stuck.waiting_ranks):
            placement.setdefault(rank, stuck)
    return placement


def rank_marks(result: TriageResult, progress: JobProgress) -> list[RankMark]:
    """One mark per rank of the job, in rank order."""
    culprits = {c.rank: c for c in result.candidates}
    no_evidence = set(result.missing_ranks) | set(result.stale_ranks)
    waiting = {r for s in result.stuck for r in s.waiting_ranks}
    placement = stuck_placement(result)
    marks = []
    for rank in range(result.world_size):
        stuck = placement.get(rank)
        position = (progress.positions.get(rank, {}).get(stuck.process_group)
                    if stuck is not None else None)
        candidate = culprits.get(rank)
        if candidate is not None:
            state = RankState.CULPRIT
        elif rank in no_evidence:
            state = RankState.NO_EVIDENCE
        elif rank in waiting:
            state = RankState.WAITING
        else:
            state = RankState.CLEAR
        marks.append(RankMark(
            rank=rank, state=state, culprit_kind=candidate.kind if candidate else None,
            host=candidate.host if candidate else None,
            process_group=stuck.process_group if stuck else None,
            last_enqueued=position.last_enqueued if position else None,
            last_completed=position.last_completed if position else None,
            offset=(position.last_enqueued - stuck.collective_seq_id
                    if position is not None and stuck is not None else None),
        ))
    return marks
