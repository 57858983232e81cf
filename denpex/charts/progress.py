"""Where each rank stands in a picture: its counters joined with the triage's answer.

The charts never see a dump or a full summary, only ``JobProgress`` (two counters per rank and
process group); ``rank_marks`` places each rank::

    summaries: rank 2 {"2": enqueued 2, completed 2}, rank 3 {"2": enqueued 3, completed 2}
    stuck: group "2" #3, waiting (3,), behind (2,); candidates: rank 2 not_entered
    -> RankMark(rank=2, state=culprit, process_group="2", last_enqueued=2, offset=-1)
       RankMark(rank=3, state=waiting, process_group="2", last_enqueued=3, offset=0)
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from denpex.analysis.job_progress import JobProgress
from denpex.analysis.models import CandidateKind, StuckCollective, TriageResult

__all__ = ["RankState", "RankMark", "rank_marks", "role_in", "stuck_placement"]


class RankState(StrEnum):
    """How a rank appears in the pictures."""

    CULPRIT = "culprit"
    """A candidate of the triage: a rank behind the hang."""
    WAITING = "waiting"
    """It entered a stuck op and waits in it for others (a stuck op's ``waiting_ranks``)."""
    BEHIND = "behind"
    """It never entered a stuck op that others wait in (``behind_ranks``), and is not a candidate."""
    UNKNOWN = "unknown"
    """Its part in a stuck op cannot be told (``unknown_ranks``): it may be a member that is behind."""
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


def role_in(rank: int, stuck: Sequence[StuckCollective], *, candidates: Collection[int],
            no_evidence: Collection[int]) -> RankState:
    """The rank's role in ``stuck`` (one stuck op for a group's chart, all of them for the
    overview), read off the triage JSON's lists; the first that holds wins: a candidate, no usable
    dump (``missing_ranks``, ``stale_ranks``), waiting in a stuck op, behind in one, unknown in one,
    clear::

        stuck: group "4" #3 waiting (1,), behind (3,); candidates (2,)
        -> rank 1 waiting, rank 2 culprit, rank 3 behind, rank 0 clear
    """
    if rank in candidates:
        return RankState.CULPRIT
    if rank in no_evidence:
        return RankState.NO_EVIDENCE
    for state, ranks in ((RankState.WAITING, lambda s: s.waiting_ranks), (RankState.BEHIND, lambda s: s.behind_ranks),
                         (RankState.UNKNOWN, lambda s: s.unknown_ranks)):
        if any(rank in ranks(s) for s in stuck):
            return state
    return RankState.CLEAR


def rank_marks(result: TriageResult, progress: JobProgress) -> list[RankMark]:
    """One mark per rank of the job, in rank order."""
    culprits = {c.rank: c for c in result.candidates}
    no_evidence = set(result.missing_ranks) | set(result.stale_ranks)
    placement = stuck_placement(result)
    marks = []
    for rank in range(result.world_size):
        stuck = placement.get(rank)
        position = (progress.positions.get(rank, {}).get(stuck.process_group)
                    if stuck is not None else None)
        candidate = culprits.get(rank)
        state = role_in(rank, result.stuck, candidates=culprits, no_evidence=no_evidence)
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
