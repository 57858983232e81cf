"""Dumps from an earlier attempt of the job, left in the same folder as the newest one.

A restarted job (minutes later, same file names) overwrites only the dumps of the ranks that
dumped again; the others stay from the attempt before. Mixed, they make ranks look as if they
waited in ops they completed. Two facts separate the attempts:

- a collective completes only once every member has enqueued it (c10d), and on a rank ops are
  created in order, each after the one it waited on; so within one attempt, a rank that
  completed ``#s`` in a group created its entries after its peers enqueued ``#s - 1``;
- a dump whose ring did not wrap holds its rank's whole history from the first op.

So when a member's whole history (its oldest entry) is newer than everything a peer recorded,
yet it never got to an op that peer completed, the peer's dump is from an earlier attempt::

    rank 3: world #6 completed, newest entry 14:02:10      rank 0: oldest entry 14:02:31, world #4 pending
    -> rank 3's dump is from an earlier attempt; rank 0's is the newest one

One op of slack is allowed, as for stale dumps (Gloo may retire a failed op).
"""

from __future__ import annotations

from denpex.analysis.membership import GroupMembership
from denpex.analysis.stale_by_peers import FAILED_OP_SLACK
from denpex.analysis.summary import RankSummary

__all__ = ["CLOCK_MARGIN_NS", "earlier_attempts"]

# Host clocks disagree by up to this much; a gap this size between two attempts is certain.
CLOCK_MARGIN_NS = 1_000_000_000


def earlier_attempts(summaries: dict[int, RankSummary], membership: GroupMembership) -> dict[int, str]:
    """Rank -> why its dump is from an earlier attempt than a peer's."""
    earlier: dict[int, str] = {}
    for name, members in membership.members.items():
        known = [(r, summaries[r]) for r in members if r in summaries and name in summaries[r].groups]
        fresh = [(s.oldest_time_ns, r, s.groups[name].last_enqueued) for r, s in known
                 if not s.ring_wrapped and s.oldest_time_ns is not None]
        if not fresh:
            continue
        started, newest, reached = max(fresh)
        for rank, summary in known:
            done = summary.groups[name].last_completed_by_all
            if rank in earlier or summary.newest_time_ns is None or done <= reached + FAILED_OP_SLACK:
                continue
            if summary.newest_time_ns + CLOCK_MARGIN_NS < started:
                gap = (started - summary.newest_time_ns) / 1e9
                earlier[rank] = (f"from an earlier attempt of the job: it completed collective #{done} "
                                 f"in process group {name!r}, but rank {newest}'s dump, whose whole "
                                 f"history starts {gap:.0f} s after this dump's newest entry, never "
                                 f"got past #{reached} there")
    return earlier
