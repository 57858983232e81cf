"""A member that enqueued a collective another member never reached waits on that member.

Every member must enter a collective before it completes anywhere, so a member holding an
unfinished op at a sequence id a peer has not reached waits on that peer, whatever else it waits
on. One pass over the group's members, grouped by how far each got (linear in the group)::

    group "7" (tp) = [4, 5]: rank 5 stopped at #41; rank 4 enqueued #41 ... #53, none finished
    -> rank 4 waits in #42 on rank 5, which never reached it

Members at several levels chain level by level (the ranks at 30 wait on those at 20, the ranks at
20 on those at 10), so the edges stay linear in the members and every wait is still reachable.

Where the waiting member's op is the oldest op it has in flight, the wait is what the member is
blocked in now: an ordinary edge of the wait-for graph. Where it sits behind an older op of the
member's own that has not finished (NCCL enqueues asynchronously: rank 4's #42 queues behind its
#41), it is not what the member is blocked in, so it must not send the member's chain elsewhere;
but it does say which member of a cycle the cycle hangs from (rank 4 and rank 5 both hold #41, and
rank 4 went past it while rank 5 never did). Those waits are *directions*: the wait-for graph uses
them only inside a terminal cycle (``denpex.analysis.waitgraph``).

Rooted ops (broadcast, reduce, gather, scatter) are left out: a member can finish one before a
peer downstream of it entered it, so holding one says nothing about who it waits on.
"""

from __future__ import annotations

from collections.abc import Callable

from denpex.analysis.blockage import Blockage, BlockageKind
from denpex.analysis.op_rules import ROOTED_OPS
from denpex.analysis.summary import GroupProgress, OpKind, PendingOp
from denpex.analysis.wording import ranks_phrase

__all__ = ["Unreached", "unreached_waits"]

_RankOp = tuple[int, PendingOp]
Unreached = tuple[Blockage, list[_RankOp]]


def unreached_waits(name: str, progress: dict[int, GroupProgress], queued: Callable[[int, PendingOp], bool],
                    covered: frozenset[int], cpu_readable: Callable[[int], bool],
                    cpu_stopped: Callable[[int], bool]) -> tuple[list[Unreached], list[Unreached]]:
    """The group's waits on members that never reached a collective their peers hold:
    (waits the members are blocked in now, directions from ops queued behind their own).

    ``progress`` holds the members whose progress in the group is known; ``queued`` tells whether
    a member's op waits behind an older op of its own; ``covered`` are the ranks the group's stuck
    op already waits on (an edge to them from a ready op would repeat it). ``cpu_readable`` says
    whether a rank's enqueue order shows where its CPU stopped (NCCL with timing off: Gloo's
    collectives are synchronous, and with timing on which kernels started says more); directions
    are read only between such ranks, and only at a rank whose CPU stopped (``cpu_stopped``: it
    enqueued nothing after the op it is blocked in). A rank that went on enqueuing other ops is
    not stopped: its program merely reaches the group's op later (``test_ambiguous_leads``, F).
    """
    by_level: dict[int, list[int]] = {}
    for rank, group in progress.items():
        by_level.setdefault(group.last_enqueued, []).append(rank)
    if len(by_level) < 2:
        return [], []
    levels = sorted(by_level)
    waits: list[Unreached] = []
    directions: list[Unreached] = []
    for low, high in zip(levels, levels[1:]):
        targets = tuple(sorted(by_level[low]))
        ready: list[_RankOp] = []
        behind_own: list[_RankOp] = []
        for rank in sorted(by_level[high]):
            op = _first_after(progress[rank], low)
            if op is None:
                continue
            (behind_own if queued(rank, op) else ready).append((rank, op))
        seq = low + 1
        if ready and not covered.issuperset(targets):
            waits.append((_blockage(name, seq, ready, targets, queued=False), ready))
        if (behind_own and all(cpu_readable(r) for r in (*targets, *(r for r, _ in behind_own)))
                and all(cpu_stopped(r) for r in targets)):
            directions.append((_blockage(name, seq, behind_own, targets, queued=True), behind_own))
    return waits, directions


def _first_after(group: GroupProgress, seq: int) -> PendingOp | None:
    """The member's oldest unfinished, non-rooted collective past ``seq``."""
    ops = [op for op in group.pending if op.kind is OpKind.COLLECTIVE and op.collective_seq_id > seq
           and op.signature.op not in ROOTED_OPS]
    return min(ops, key=lambda op: op.collective_seq_id) if ops else None


def _blockage(name: str, seq: int, holders: list[_RankOp], targets: tuple[int, ...], *, queued: bool) -> Blockage:
    waiting = tuple(rank for rank, _ in holders)
    first = min((op for _, op in holders), key=lambda op: op.collective_seq_id)
    they = "it" if len(targets) == 1 else "they"
    detail = (f"{ranks_phrase(waiting)} enqueued collective #{first.collective_seq_id} or later, which "
              f"{ranks_phrase(targets)} never reached: every member must enter a collective before it "
              f"completes, so {'it waits' if len(waiting) == 1 else 'they wait'} on {'it' if they == 'it' else 'them'}")
    if queued:
        detail += (f" (queued behind {'its' if len(waiting) == 1 else 'their'} own unfinished op: this says "
                   "which member a cycle of waits hangs from, not where the waiting ranks are blocked)")
    return Blockage(name, seq, BlockageKind.UNREACHED, first.signature.describe(), waiting, targets, detail=detail)
