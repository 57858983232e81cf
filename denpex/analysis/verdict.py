"""Turn the wait-for graph's culprits into candidates with reasons, and pick the verdict.

Rules (documented so that operators can predict them):
- no blockage and every rank reported          -> ``no_hang``, no candidates;
- no blockage but some ranks left no dump      -> ``incomplete``; the silent ranks are the only lead;
- a CPU that stopped in an op all entered      -> ``ambiguous``: that rank first, the op's other
                                                  members after it (it may only have synchronised);
- a culprit without usable evidence            -> ``incomplete`` (it may be the cause, or not);
- culprits that the evidence cannot separate   -> ``ambiguous``;
- otherwise                                    -> ``localized``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from denpex.analysis.compare import Blockage, BlockageKind, Comparison, progress_from_status
from denpex.analysis.membership import GroupMembership
from denpex.analysis.wording import ranks_phrase
from denpex.analysis.models import Candidate, CandidateKind, Verdict
from denpex.analysis.summary import RankSummary
from denpex.analysis.waitgraph import Culprit, find_culprits
from denpex.evidence.manifest import JobManifest

__all__ = ["Decision", "decide"]

_BASE_CONFIDENCE = {
    CandidateKind.NOT_ENTERED: 0.9,
    CandidateKind.MISMATCH: 0.85,
    CandidateKind.STALLED: 0.7,
    CandidateKind.STOPPED_REPORTING: 0.6,
}


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    candidates: list[Candidate]


def decide(comparison: Comparison, summaries: dict[int, RankSummary], missing: dict[int, str],
           membership: GroupMembership, manifest: JobManifest | None) -> Decision:
    """The verdict and its candidates, from the blockages the comparison found."""
    host = manifest.host_of if manifest else (lambda rank: None)
    if not comparison.blockages:
        if not missing:
            return Decision(Verdict.NO_HANG, [])
        return Decision(Verdict.INCOMPLETE, [
            Candidate(rank=r, kind=CandidateKind.STOPPED_REPORTING, confidence=0.3, host=host(r),
                      reasons=[f"{why}; the ranks that did report show no stuck collective, so this "
                               "rank's silence is the only lead"])
            for r, why in sorted(missing.items())
        ])
    culprits = find_culprits(comparison.blockages)
    candidates = [_candidate(c, summaries, missing, membership, host(c.rank)) for c in culprits]
    _share_blame_with_silent_ranks(candidates, culprits, missing)
    stopped = [b for c in culprits for b in c.blocking if b.kind is BlockageKind.STOPPED and c.rank in b.targets]
    candidates += _alternatives_to_stopped(stopped, {c.rank for c in candidates}, host)
    if stopped:
        # A CPU that stopped in an op is also what a rank that synchronised after it looks like
        # while a link or another GPU holds the op: a lead to check, never a culprit to act on.
        verdict = Verdict.AMBIGUOUS
    elif any(c.kind is CandidateKind.STOPPED_REPORTING for c in candidates) or any(
            b.undecided for c in culprits for b in c.blocking):
        verdict = Verdict.INCOMPLETE
    elif any(c.component_size > 1 for c in culprits):
        verdict = Verdict.AMBIGUOUS
    else:
        verdict = Verdict.LOCALIZED
    return Decision(verdict, candidates)


# A member whose CPU enqueued nothing after an all-in op may have lost its GPU, or merely
# synchronised there while the fault is elsewhere: that lead alone is never a near-certainty.
_STOPPED_FACTOR = 0.5


def _alternatives_to_stopped(stopped: list[Blockage], named: set[int],
                             host: Callable[[int], str | None]) -> list[Candidate]:
    """The other members of an op one member's CPU stopped in: their GPUs or links may hold it."""
    alternatives: dict[int, Candidate] = {}
    for blockage in stopped:
        lead = ranks_phrase(blockage.targets)
        for rank in blockage.waiting:
            if rank in named or rank in alternatives:
                continue
            confidence = _BASE_CONFIDENCE[CandidateKind.STALLED] * _STOPPED_FACTOR / (len(blockage.waiting) + 1)
            if blockage.age_unknown:
                confidence /= 2
            alternatives[rank] = Candidate(
                rank=rank, kind=CandidateKind.STALLED, process_group=blockage.group,
                collective_seq_id=blockage.seq, confidence=max(round(confidence, 3), 0.05), host=host(rank),
                reasons=[f"rank {rank} is blocked in collective #{blockage.seq} {blockage.op} in process "
                         f"group {blockage.group!r}, which every member entered and none finished; with "
                         f"NCCL timing off nothing records whose GPU ran it, so if {lead} merely "
                         "synchronised after the op (e.g. .item()), this rank's GPU or a link to it may "
                         "be what holds it"])
    return list(alternatives.values())


def _candidate(culprit: Culprit, summaries: dict[int, RankSummary], missing: dict[int, str],
               membership: GroupMembership, host: str | None) -> Candidate:
    first = culprit.blocking[0] if culprit.blocking else None
    kind = _kind(culprit, summaries, missing)
    reasons = [_why_waited(b, membership) for b in culprit.blocking[:3]]
    if len(culprit.blocking) > 3:
        reasons.append(f"... and {len(culprit.blocking) - 3} more stuck ops wait on it")
    reasons.append(_why_kind(culprit, kind, summaries, missing))
    if culprit.component_size > 1:
        reasons.append(f"one of {culprit.component_size} ranks the dumps cannot tell apart")
    confidence = _BASE_CONFIDENCE[kind] / culprit.component_size
    if first is not None and first.kind == BlockageKind.STOPPED:
        confidence *= _STOPPED_FACTOR
    if any(b.undecided for b in culprit.blocking):
        confidence /= 2
    if culprit.blocking and all(b.age_unknown for b in culprit.blocking):
        confidence /= 2
        reasons.append("how long its peers have waited is unknown (no dump time, no --as-of): it "
                       "may be slow rather than hung")
    confidence = round(confidence, 3)
    return Candidate(
        rank=culprit.rank, kind=kind, process_group=first.group if first else None,
        collective_seq_id=first.seq if first else None, confidence=max(confidence, 0.05),
        host=host, reasons=reasons,
    )


def _kind(culprit: Culprit, summaries: dict[int, RankSummary], missing: dict[int, str]) -> CandidateKind:
    if culprit.rank in missing:
        return CandidateKind.STOPPED_REPORTING
    if any(culprit.rank in b.mismatched for b in culprit.blocking):
        return CandidateKind.MISMATCH
    kinds = {b.kind for b in culprit.blocking}
    if BlockageKind.OVERDUE in kinds or _in_flight(summaries[culprit.rank]):
        return CandidateKind.STALLED
    return CandidateKind.NOT_ENTERED


def _in_flight(summary: RankSummary) -> str | None:
    """Where the rank is blocked, if it has any op in flight."""
    for name, group in sorted(summary.groups.items()):
        op = group.oldest_pending_collective()
        if op is not None:
            return f"collective #{op.collective_seq_id} {op.signature.describe()} in process group {name!r}"
        p2p = group.pending_p2p()
        if p2p:
            head = min(p2p, key=lambda o: o.p2p_seq_id)
            return f"{head.kind.value} (p2p_seq_id {head.p2p_seq_id}) in process group {name!r}"
    return None


def _why_waited(blockage: Blockage, membership: GroupMembership) -> str:
    desc = membership.descs.get(blockage.group)
    where = f"process group {blockage.group!r}" + (f" ({desc})" if desc else "")
    what = f"p2p_seq_id {blockage.seq}" if blockage.is_p2p else f"collective #{blockage.seq}"
    verb = "waits" if len(blockage.waiting) == 1 else "wait"
    return f"{ranks_phrase(blockage.waiting)} {verb} in {where} {what} {blockage.op}: {blockage.detail}"


def _why_kind(culprit: Culprit, kind: CandidateKind, summaries: dict[int, RankSummary],
              missing: dict[int, str]) -> str:
    rank = culprit.rank
    first = culprit.blocking[0] if culprit.blocking else None
    if kind is CandidateKind.STOPPED_REPORTING:
        return f"rank {rank}: {missing[rank]}, so whether it entered is unknown"
    if kind is CandidateKind.MISMATCH:
        if first is not None and first.undecided:
            return (f"rank {rank}'s call disagrees with a peer's and the calls tie; the members that "
                    "have not called yet decide which side is out of step")
        return f"rank {rank} called something other than the majority at the same sequence id"
    if kind is CandidateKind.STALLED:
        return _why_stalled(culprit, summaries)
    group = summaries[rank].groups.get(first.group) if first else None
    last = group.last_enqueued if group else -1
    # A wrapped ring may have dropped an op still in flight: only a whole history shows there is none.
    alive = f"rank {rank} dumped (it is alive)" + ("" if summaries[rank].ring_wrapped else " with nothing in flight")
    if first is not None and first.is_p2p and group is not None and group.last_p2p_enqueued >= 0:
        # A pipeline group counts p2p work in p2p_seq_id only; its collective count stays 0.
        seen = (f"its last p2p op in that group is p2p_seq_id {group.last_p2p_enqueued}, and every "
                "send, recv and batch it enqueued there completed")
    elif last >= 0:
        seen = f"its last enqueued op in that group is #{last}"
    elif first is not None and summaries[rank].ring_wrapped:
        seen = "its ring wrapped past that group's entries"
        status = None if rank in first.unknown else progress_from_status(first.group, rank, summaries)
        if status is not None:
            seen += (f"; its Gloo pg_status counts {status.last_enqueued} ops there, sends and recvs "
                     f"included, fewer than #{first.seq} needs: it never enqueued it")
        else:
            seen += (f": it never entered #{first.seq}, or entered it and its ring has wrapped "
                     "since; nothing left says which")
    else:
        seen = "it has no op in that group"
    return f"{alive}; {seen}"


def _why_stalled(culprit: Culprit, summaries: dict[int, RankSummary]) -> str:
    rank = culprit.rank
    first = culprit.blocking[0] if culprit.blocking else None
    if first is not None and first.kind == BlockageKind.STOPPED:
        # Everyone is in the op: it waits on the members' GPUs, and this one's CPU stopped.
        return (f"rank {rank} is itself blocked in collective #{first.seq} {first.op} in process group "
                f"{first.group!r}; every member entered it, but only its peers went on to enqueue "
                "later ops: its CPU stopped there (a lost GPU or a hung process), or its process "
                "synchronised right after the op, e.g. .item(), while the fault is elsewhere; the "
                "dumps cannot tell these apart")
    where = _in_flight(summaries[rank]) or "an op that never finished"
    if culprit.component_size > 1 and all(b.tie for b in culprit.blocking):
        return (f"rank {rank} is itself blocked in {where}, an op every member entered and none "
                "finished; the dumps cannot say whose GPU or link stopped it")
    if culprit.component_size > 1:
        return (f"rank {rank} is itself blocked in {where}, which waits on ranks that wait on "
                "it in turn: a cycle the dumps cannot break")
    return f"rank {rank} is itself blocked in {where}, which waits on no other rank"


def _share_blame_with_silent_ranks(candidates: list[Candidate], culprits: list[Culprit],
                                   missing: dict[int, str]) -> None:
    """A silent rank waited on next to a rank proven behind is a weaker lead than that rank."""
    proven = {c.rank for c in candidates if c.kind is not CandidateKind.STOPPED_REPORTING}
    if not proven:
        return
    # Decided once per blockage, not once per silent rank: a dead host's ranks share blockages.
    with_proven: dict[int, bool] = {}
    for candidate, culprit in zip(candidates, culprits, strict=True):
        if candidate.rank in missing and any(
                with_proven.setdefault(id(b), not proven.isdisjoint(b.targets)) for b in culprit.blocking):
            candidate.confidence = min(candidate.confidence, 0.4)

