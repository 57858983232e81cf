"""Turn the wait-for graph's culprits into candidates with reasons, and pick the verdict.

Rules (documented so that operators can predict them):
- no blockage and every rank reported          -> ``no_hang``, no candidates;
- no blockage but some ranks left no dump      -> ``incomplete``; the silent ranks are the only lead;
- a CPU that stopped in an op all entered      -> ``ambiguous``: that rank alone is named; the op's
                                                  other members are named in its reasons (it may
                                                  only have synchronised), never as candidates;
- a culprit without usable evidence            -> ``incomplete`` (it may be the cause, or not);
- culprits that the evidence cannot separate   -> ``ambiguous``;
- otherwise                                    -> ``localized``.

The same rules give each stuck op its own verdict (``groups``), from the culprits its waits end on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from denpex.analysis.blockage import Blockage, BlockageKind
from denpex.analysis.compare import Comparison, progress_from_status
from denpex.analysis.membership import GroupMembership
from denpex.analysis.wording import ranks_phrase
from denpex.analysis.models import Candidate, CandidateKind, GroupVerdict, Verdict
from denpex.analysis.summary import RankSummary
from denpex.analysis.waitgraph import Culprit, analyze
from denpex.evidence.manifest import JobManifest

__all__ = ["BASE_CONFIDENCE", "Decision", "SEPARATING_EVIDENCE", "decide", "verdict_of"]

# What would tell the members of an all-in op apart when the dumps cannot (reasons and notes).
SEPARATING_EVIDENCE = ("What would separate them: a hardware signal (Xid, NVLink, PCIe) on one member's "
                       "GPU, NCCL timing (TORCH_NCCL_ENABLE_TIMING=1: a kernel that started on one "
                       "member and not on the other), or one member behind its peers in another group")

BASE_CONFIDENCE = {
    CandidateKind.NOT_ENTERED: 0.9,
    CandidateKind.MISMATCH: 0.85,
    CandidateKind.STALLED: 0.7,
    CandidateKind.STOPPED_REPORTING: 0.6,
}


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    candidates: list[Candidate]
    # One verdict per stuck op (``TriageResult.groups``): the culprits its waits end on.
    groups: list[GroupVerdict] = field(default_factory=list)


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
    culprits, reached = analyze(comparison.blockages, comparison.directions)
    candidates = [_candidate(c, summaries, missing, membership, host(c.rank)) for c in culprits]
    _share_blame_with_silent_ranks(candidates, culprits, missing)
    stopped = [b for c in culprits for b in c.blocking if b.kind is BlockageKind.STOPPED and c.rank in b.targets]
    _mention_alternatives_to_stopped(candidates, stopped)
    verdict = verdict_of(culprits, candidates)
    return Decision(verdict, candidates, _group_verdicts(comparison.blockages, reached, culprits, candidates))


def _group_verdicts(blockages: list[Blockage], reached: list[frozenset[int]], culprits: list[Culprit],
                    candidates: list[Candidate]) -> list[GroupVerdict]:
    """Each stuck op's own verdict, from the culprits its waits end on (the same rules as the
    incident's): a proven culprit in one group is not held back by a lead in another."""
    at: dict[tuple[str, int, bool], set[int]] = {}
    for blockage, below in zip(blockages, reached, strict=True):
        at.setdefault((blockage.group, blockage.seq, blockage.is_p2p), set()).update(below)
    index = {c.rank: i for i, c in enumerate(culprits)}
    groups = []
    for (group, seq, is_p2p), ranks in at.items():
        picked = sorted(index[r] for r in ranks if r in index)
        if not picked:
            continue
        verdict = verdict_of([culprits[i] for i in picked], [candidates[i] for i in picked])
        tied = verdict is Verdict.AMBIGUOUS and _tied([culprits[i] for i in picked])
        groups.append(GroupVerdict(process_group=group, collective_seq_id=None if is_p2p else seq,
                                   p2p_seq_id=seq if is_p2p else None, verdict=verdict,
                                   candidates=[culprits[i].rank for i in picked], tied=tied))
    return groups


def _tied(culprits: list[Culprit]) -> bool:
    """Whether these culprits are exactly the members of one op they all entered and none finished:
    not a cycle of different ops, not a tied mismatch (a program's choice, which no hardware
    signal settles), not a stopped-CPU lead, no undecided wait, a known age."""
    return len(culprits) >= 2 and all(
        c.component_size == len(culprits) and any(b.tie and b.kind is BlockageKind.OVERDUE for b in c.blocking)
        and not any(b.kind is BlockageKind.STOPPED or b.undecided for b in c.blocking)
        and not all(b.age_unknown for b in c.blocking)
        for c in culprits)


def verdict_of(culprits: list[Culprit], candidates: list[Candidate]) -> Verdict:
    """The verdict that a set of culprits (and their candidates, in the same order) supports.

    The whole incident's verdict, and each stuck group's from the culprits its waits end on.
    Waits that end on no rank (a group whose unseen members nobody could be) explain nothing:
    never ``localized`` without a named rank.
    """
    if not culprits:
        return Verdict.INCOMPLETE
    if any(b.kind is BlockageKind.STOPPED and c.rank in b.targets for c in culprits for b in c.blocking):
        # A CPU that stopped in an op is also what a rank that synchronised after it looks like
        # while a link or another GPU holds the op: a lead to check, never a culprit to act on.
        return Verdict.AMBIGUOUS
    if any(c.kind is CandidateKind.STOPPED_REPORTING for c in candidates) or any(
            _rests_on_undecided(c) for c in culprits):
        return Verdict.INCOMPLETE
    if any(c.component_size > 1 for c in culprits):
        return Verdict.AMBIGUOUS
    return Verdict.LOCALIZED


def _rests_on_undecided(culprit: Culprit) -> bool:
    """Whether an undecided wait leaves the rank's part open.

    Members whose rings wrapped past a group (a ``behind`` wait left undecided) each never
    entered its op, or entered it and their rings wrapped since; either way the waits go on
    through them and are followed, so that doubt does not touch a rank that a decided, directed
    wait proves (it never entered an op its peers wait in, or its CPU stopped first in one they
    all entered while they went on). Where the undecided wait is a guess at who the members are
    (unknown membership) or which call was right (a tied mismatch), it stays open.
    """
    undecided = [b for b in culprit.blocking if b.undecided]
    if not undecided:
        return False
    if any(b.kind is not BlockageKind.BEHIND for b in undecided):
        return True
    return not any(not b.undecided and not b.tie and b.kind is not BlockageKind.STOPPED
                   for b in culprit.blocking)


# A member whose CPU enqueued nothing after an all-in op may have lost its GPU, or merely
# synchronised there while the fault is elsewhere: that lead alone is never a near-certainty.
_STOPPED_FACTOR = 0.5


def _mention_alternatives_to_stopped(candidates: list[Candidate], stopped: list[Blockage]) -> None:
    """Say, on the lead, which members' GPUs or links may hold the op if it merely synchronised.

    They are not candidates: each entered the op and went on, so nothing shows any of them
    behind, and a candidate is a rank proven to explain a stuck group, never one that waits.
    """
    by_rank = {c.rank: c for c in candidates}
    for blockage in stopped:
        for rank in blockage.targets:
            lead = by_rank.get(rank)
            if lead is None:
                continue
            lead.reasons.append(
                f"if rank {rank} merely synchronised after collective #{blockage.seq}, the GPU of "
                f"{ranks_phrase(blockage.waiting)} or a link to it holds the op instead; they are not "
                "named, since each entered it and went on. A hardware signal on rank "
                f"{rank}'s GPU, or NCCL timing (TORCH_NCCL_ENABLE_TIMING=1: a kernel that started on "
                "the others and not on it), would settle it")


def _candidate(culprit: Culprit, summaries: dict[int, RankSummary], missing: dict[int, str],
               membership: GroupMembership, host: str | None) -> Candidate:
    first = culprit.blocking[0] if culprit.blocking else None
    kind = _kind(culprit, summaries, missing)
    reasons = [_why_waited(b, membership) for b in culprit.blocking[:3]]
    if len(culprit.blocking) > 3:
        reasons.append(f"... and {len(culprit.blocking) - 3} more stuck ops wait on it")
    reasons.append(_why_kind(culprit, kind, summaries, missing))
    if culprit.component_size > 1:
        tied = any(b.tie for b in culprit.blocking)
        reasons.append(f"one of {culprit.component_size} ranks the dumps cannot tell apart"
                       + (f". {SEPARATING_EVIDENCE}" if tied else ""))
    confidence = BASE_CONFIDENCE[kind] / culprit.component_size
    if first is not None and first.kind is BlockageKind.STOPPED:
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
    if first is not None and first.kind is BlockageKind.STOPPED:
        # Everyone is in the op: it waits on the members' GPUs, and this one's CPU stopped.
        return (f"rank {rank} is itself blocked in collective #{first.seq} {first.op} in process group "
                f"{first.group!r}; every member entered it, but only its peers went on to enqueue "
                "later ops: its CPU stopped there (a lost GPU or a hung process), or its process "
                "synchronised right after the op, e.g. .item(), while the fault is elsewhere; the "
                "dumps cannot tell these apart")
    where = _in_flight(summaries[rank]) or "an op that never finished"
    if first is not None and first.kind is BlockageKind.UNREACHED:
        # Picked out of a cycle by a peer that went past it in a group both are in (unreached).
        peers = ranks_phrase(first.waiting)
        return (f"rank {rank} is itself blocked in {where}; {peers} enqueued collective #{first.seq} "
                f"of process group {first.group!r}, which rank {rank} never reached: its CPU stopped "
                f"first, and {peers} wait{'s' if len(first.waiting) == 1 else ''} on it")
    if first is not None and first.kind is BlockageKind.LAGGING:
        # Separated from its tied peers by where the CPUs stopped (compare.tie_breaks.lagging_at).
        return (f"rank {rank} is itself blocked in collective #{first.seq} {first.op} in process group "
                f"{first.group!r}, which every member entered and none finished; {first.detail}")
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

