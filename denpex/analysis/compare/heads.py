"""What each rank is blocked in: its oldest op in flight, across all its groups.

NCCL runs a rank's work in order on its streams, so an op enqueued behind the rank's own older,
unfinished op is not what the rank waits in; rules read these heads to leave such ops out.
"""

from __future__ import annotations

from dataclasses import dataclass

from denpex.analysis.summary import PendingOp, RankSummary

__all__ = ["Head", "heads_of", "queued_behind"]


@dataclass(frozen=True, slots=True)
class Head:
    """A rank's oldest in-flight op: its process-wide ``record_id``, and its p2p batch if any."""

    record_id: int
    batch: tuple[str, int] | None = None
    """(group, p2p_seq_id) when the op is a member of a ``batch_isend_irecv`` batch."""


def heads_of(summaries: dict[int, RankSummary]) -> dict[int, Head]:
    """Each rank's oldest in-flight op (by its process-wide ``record_id``): what it is blocked in.

    NCCL enqueues asynchronously, so a rank stuck in one op may already have enqueued later ops
    in other groups; those later ops cannot finish before the oldest one does.
    """
    heads = {}
    for rank, summary in summaries.items():
        ops = [(op.record_id, name, op) for name, g in summary.groups.items() for op in g.pending
               if op.record_id is not None]
        if ops:
            record_id, name, op = min(ops, key=lambda item: item[0])
            heads[rank] = Head(record_id, (name, op.p2p_seq_id) if op.in_batch else None)
    return heads


def queued_behind(rank: int, op: PendingOp, heads: dict[int, Head], group: str) -> bool:
    """Whether ``op`` waits behind the rank's own older op. Members of one p2p batch are issued
    as one group call (``ncclGroupStart``/``End``), not in order: none is queued behind another,
    and each member's peer is one the batch waits on."""
    head = heads.get(rank)
    if head is None or op.record_id is None or op.record_id <= head.record_id:
        return False
    return not (op.in_batch and head.batch == (group, op.p2p_seq_id))
