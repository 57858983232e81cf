"""Point-to-point rules: a rank blocked in a send/recv waits on its peer.

NCCL only (Gloo does not record p2p ops). The edge goes from the rank blocked in a send/recv to
the peer that has no matching op in flight; a pair where both ends posted is a hang only once
the transfer outlived its timeout, and is reported once.
"""

from __future__ import annotations

from dataclasses import replace

from denpex.analysis.blockage import Blockage, BlockageKind
from denpex.analysis.compare.collective import overdue_blockage
from denpex.analysis.compare.context import Findings, GroupFacts
from denpex.analysis.compare.found import Found
from denpex.analysis.compare.heads import Head, queued_behind
from denpex.analysis.summary import GroupProgress, OpKind, PendingOp, RankSummary
from denpex.analysis.wording import ranks_phrase

__all__ = ["p2p_blockages", "peer_waits"]


def peer_waits(group: GroupFacts, findings: Findings) -> None:
    """Add the group's p2p blockages (``p2p_blockages``) after its collective ones."""
    findings.p2p += p2p_blockages(group.name, group.progress, group.members, group.missing, group.summaries,
                                  group.heads, group.clock.as_of_ns)


def p2p_blockages(name: str, progress: dict[int, GroupProgress], members: tuple[int, ...],
                  missing: set[int], summaries: dict[int, RankSummary],
                  heads: dict[int, Head], as_of_ns: int | None) -> list[Found]:
    """Each rank's oldest in-flight send/recv (or batch) against its peer's in-flight ops."""
    found: list[Found] = []
    pairs_seen: set[tuple[int, int]] = set()
    for rank, group in sorted(progress.items()):
        ops = group.pending_p2p()
        if not ops:
            continue
        head = min(op.p2p_seq_id for op in ops)
        for op in (o for o in ops if o.p2p_seq_id == head):
            peer = _global_peer(op, members)
            if peer is None or peer == rank:
                continue
            match = None if peer in missing else _peer_match(op, summaries.get(peer), name)
            if match is not None and not queued_behind(peer, match, heads, name):
                # Both ends posted. That is a hang only once the transfer outlived its timeout
                # (a link or GPU fault on either side); the pair is reported once.
                pair = (min(rank, peer), max(rank, peer))
                if pair in pairs_seen or queued_behind(rank, op, heads, name):
                    continue
                ends = {rank: op, peer: match} if rank < peer else {peer: match, rank: op}
                overdue = overdue_blockage(name, op.p2p_seq_id, op.signature.describe(), ends, as_of_ns, ())
                if overdue is not None:
                    pairs_seen.add(pair)
                    found.append((replace(overdue, is_p2p=True, detail=_overdue_pair_detail(
                        rank, op, peer, match, overdue)), []))
                continue
            if queued_behind(rank, op, heads, name):
                # The rank is blocked in an earlier op (NCCL runs a rank's work in order on its
                # streams); that op's blockage says what it waits on. An edge from this later op
                # would let a victim of one fault point at another fault's chain and hide the
                # first fault's source from the condensation.
                continue
            verb = "send to" if op.kind is OpKind.SEND else "recv from"
            why = ("has no matching op in flight" if match is None else
                   "enqueued the matching op behind an earlier op that has not finished")
            found.append((Blockage(
                name, op.p2p_seq_id, BlockageKind.P2P, op.signature.describe(), (rank,), (peer,),
                is_p2p=True,
                detail=f"rank {rank} is blocked in {verb} rank {peer} (p2p_seq_id {op.p2p_seq_id}), "
                       f"and rank {peer} {why}"), [(rank, op)]))
    return found


def _overdue_pair_detail(rank: int, op: PendingOp, peer: int, match: PendingOp,
                         overdue: Blockage) -> str:
    both = (f"rank {rank}'s {op.kind.value} and rank {peer}'s matching {match.kind.value} "
            f"(p2p_seq_id {op.p2p_seq_id}) are both in flight past their timeout")
    if overdue.tie:
        return f"{both}; the dumps cannot say which end stopped the transfer"
    return (f"{both}; the kernel started on {ranks_phrase(overdue.waiting)} but never on "
            f"{ranks_phrase(overdue.targets)}")


def _global_peer(op: PendingOp, members: tuple[int, ...]) -> int | None:
    local = op.peer_local_rank
    if local is None or not 0 <= local < len(members):
        return None
    return members[local]


def _peer_match(op: PendingOp, peer: RankSummary | None, name: str) -> PendingOp | None:
    """The peer's oldest in-flight op that pairs with ``op`` (NCCL pairs them in order)."""
    group = peer.groups.get(name) if peer is not None else None
    if group is None:
        return None
    wanted = OpKind.RECV if op.kind is OpKind.SEND else OpKind.SEND
    matches = [o for o in group.pending_p2p() if o.kind is wanted and o.peer_local_rank == op.local_rank]
    return min(matches, key=lambda o: o.p2p_seq_id) if matches else None
