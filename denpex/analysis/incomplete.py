"""Why a verdict is ``incomplete`` (``incomplete_reason``), and the one-dump rule.

``incomplete`` once meant only "ranks that could explain the hang have no usable or fresh dump".
It now also stands where nothing names a rank at all (an alert the evidence contradicts, a job of
unknown size), so the JSON says which (``denpex.analysis.models.IncompleteReason``), and the
invariants (``denpex.analysis.invariants``) accept an ``incomplete`` without candidates only with
a reason.
"""

from __future__ import annotations

from collections.abc import Sequence

from denpex.analysis.blockage import Blockage, BlockageKind
from denpex.analysis.models import Candidate, CandidateKind, IncompleteReason, Membership, TriageResult, Verdict

__all__ = ["incomplete_reason", "one_dump_alone"]


def incomplete_reason(candidates: Sequence[Candidate], blockages: Sequence[Blockage]) -> IncompleteReason:
    """The reason an ``incomplete`` verdict of the comparison has, the strongest first."""
    if any(c.kind is CandidateKind.STOPPED_REPORTING for c in candidates):
        return IncompleteReason.RANKS_MISSING
    if any(c.membership is Membership.INFERRED for c in candidates) or any(
            b.kind is BlockageKind.UNKNOWN_MEMBERS for b in blockages):
        return IncompleteReason.MEMBERSHIP_UNKNOWN
    return IncompleteReason.UNDECIDED


def one_dump_alone(result: TriageResult) -> TriageResult:
    """One rank's dump and a world size read off its file name: the job's size is unknown, so
    whatever the comparison found, the verdict is ``incomplete`` (``world_size_unknown``). A
    dump ``comm_lib_trace_rank_2`` says there are at least 3 ranks, never how many."""
    if len(result.ranks_with_evidence) + len(result.stale_ranks) > 1:
        return result
    note = ("only one rank's dump and no manifest: the world size is unknown (the file name gives a "
            "lower bound only), so no verdict about the job can be given. Pass --world-size or a "
            "manifest, and the other ranks' dumps")
    return result.model_copy(update={"verdict": Verdict.INCOMPLETE,
                                     "incomplete_reason": IncompleteReason.WORLD_SIZE_UNKNOWN,
                                     "notes": [*result.notes, note]})
