"""A rank's pickle and JSON dumps: the same dump, or two moments of the rank.

The collector writes both encodings of one moment; torch's JSON and pickle of one dump carry
the same entries. Two files that disagree come from two dumps (a later dump rewrote one of
them, or they were gathered from different places): the newer one says where the rank stands.

    rank_2.pkl: world last enqueued #5, newest entry 14:02:10
    rank_2.json: world last enqueued #9, newest entry 14:02:31  -> rank_2.json is used
"""

from __future__ import annotations

from denpex.analysis.summary import RankSummary

__all__ = ["same_moment", "newer"]


def _progress(summary: RankSummary) -> dict[str, tuple[int, int, int, int]]:
    return {name: (g.last_enqueued, g.last_completed, g.last_p2p_enqueued, len(g.pending))
            for name, g in summary.groups.items()}


def same_moment(a: RankSummary, b: RankSummary) -> bool:
    """True when both summaries describe one dump: same progress in every group, same times."""
    return (a.entry_count == b.entry_count and a.newest_time_ns == b.newest_time_ns
            and _progress(a) == _progress(b))


def newer(a: RankSummary, b: RankSummary) -> RankSummary:
    """The later of two dumps of one rank: by its newest entry, then by how far it got."""
    def key(s: RankSummary) -> tuple[int, int]:
        return (s.newest_time_ns or 0,
                sum(g.last_enqueued + g.last_completed + g.last_p2p_enqueued for g in s.groups.values()))
    return b if key(b) > key(a) else a
