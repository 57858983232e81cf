"""Dumps that their peers prove stale, whatever their timestamps say.

A collective completes on a rank only once every member of its group has enqueued it (c10d:
``ProcessGroupGloo``/``ProcessGroupNCCL`` run one algorithm across all members, and none returns
before every member joined). So when a peer completed collective ``#s`` in a group, every member
enqueued ``#s``; a member whose dump ends before ``#s`` dumped before it got there. Such a dump
predates the incident (an old periodic dump, an earlier attempt, a dump taken before the rank
moved on) and says nothing about where the rank stands now::

    group "3" = [0, 2]; rank 0 completed #9; rank 2's dump ends at #5   -> rank 2's dump is stale

Rooted ops (broadcast, reduce, gather, scatter) are not counted: they can complete on some members
before the others entered (``GroupProgress.last_completed_by_all``). One op of slack is allowed: Gloo may retire an op that failed (the peer timed out waiting in it),
so a peer's completed count can run one ahead of a member that never entered (notes: "Gloo quirks").
Only collectives count: point-to-point ops do not advance ``collective_seq_id``.
"""

from __future__ import annotations

from denpex.analysis.membership import GroupMembership
from denpex.analysis.summary import RankSummary

__all__ = ["FAILED_OP_SLACK", "stale_by_peers"]

FAILED_OP_SLACK = 1


def stale_by_peers(summaries: dict[int, RankSummary], membership: GroupMembership) -> dict[int, str]:
    """Rank -> why its dump predates what its peers completed (only ranks with evidence)."""
    stale: dict[int, str] = {}
    for name, members in membership.members.items():
        completed = [(summaries[r].groups[name].last_completed_by_all, r) for r in members
                     if r in summaries and name in summaries[r].groups]
        if not completed:
            continue
        done, by = max(completed)
        if done <= FAILED_OP_SLACK:
            continue
        for rank in members:
            summary = summaries.get(rank)
            if summary is None or rank in stale:
                continue
            group = summary.groups.get(name)
            if group is None or not group.entry_count:
                if summary.ring_wrapped:
                    # A wrapped ring lost the group's entries: its progress there is unknown.
                    continue
                last = -1
            else:
                last = group.last_enqueued
            if last + FAILED_OP_SLACK < done:
                seen = f"its dump's last op there is #{last}" if last >= 0 else "its dump has no op there"
                stale[rank] = (f"rank {by} completed collective #{done} in process group {name!r}, "
                               f"which needs every member, but {seen}: the dump predates the incident")
    return stale
