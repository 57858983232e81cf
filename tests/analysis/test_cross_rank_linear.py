"""Issue 29, section 6: every cross-rank step is linear in the group's size.

Counted, not timed: a rank's summary is looked up through a mapping that counts the lookups, and
doubling the group may at most double them (plus a constant). The retire race compared every
member with every other one (30 s of one core for a 4,096-rank Gloo world group); the unreached
rule (issue 29, section 1) must not bring that back.
"""

from __future__ import annotations

from typing import Any

from denpex.analysis.compare import compare_groups
from denpex.analysis.membership import GroupMembership
from denpex.analysis.retire_race import settle_retire_races
from denpex.analysis.summary import GroupProgress, OpKind, OpSignature, OpState, PendingOp, RankSummary
from denpex.evidence.fr_dump import DumpEncoding

T0 = 1_764_441_902_000_000_000
SEQ = 40


class CountingSummaries(dict[int, RankSummary]):
    """``dict`` that counts every lookup of a rank's summary."""

    lookups = 0

    def __getitem__(self, key: int) -> RankSummary:
        CountingSummaries.lookups += 1
        return super().__getitem__(key)

    def get(self, key: int, default: Any = None) -> Any:
        CountingSummaries.lookups += 1
        return super().get(key, default)


def _op(seq: int, created: int, rank: int) -> PendingOp:
    return PendingOp(kind=OpKind.COLLECTIVE, collective_seq_id=seq, signature=OpSignature(op="gloo:all_reduce"),
                     state=OpState.SCHEDULED, time_created_ns=created, timeout_ms=60_000, record_id=10_000 + rank)


def _world(size: int) -> tuple[CountingSummaries, GroupMembership]:
    """A Gloo world group: every other rank retired #SEQ, the rest read it unretired (the race),
    and the last rank went on to #SEQ+1 (the unreached rule has two levels to chain)."""
    summaries = CountingSummaries()
    for rank in range(size):
        created = T0 + rank * 1000
        if rank % 2:
            last = _op(SEQ, created, rank)
            group = GroupProgress(name="0", pg_id=0, last_enqueued=SEQ, last_completed=SEQ,
                                  last_completed_by_all=SEQ, last_op=last, entry_count=SEQ)
        else:
            pending = [_op(SEQ, created, rank)] + ([_op(SEQ + 1, created + 10, rank)] if rank == size - 2 else [])
            group = GroupProgress(name="0", pg_id=0, last_enqueued=pending[-1].collective_seq_id,
                                  last_completed=SEQ - 1, last_completed_by_all=SEQ - 1, pending=pending,
                                  last_op=pending[-1], entry_count=SEQ)
        summaries[rank] = RankSummary(rank=rank, source=f"rank_{rank}.pkl", encoding=DumpEncoding.PICKLE,
                                      version="2.10", backend="gloo", entry_count=SEQ,
                                      newest_record_id=10_000 + rank, groups={"0": group})
    members = tuple(range(size))
    return summaries, GroupMembership(members={"0": members}, descs={"0": "default_pg"},
                                      sets={"0": frozenset(members)})


def _lookups(size: int) -> tuple[int, int]:
    summaries, membership = _world(size)
    dump_times = {r: T0 + 5 * 10**9 for r in summaries}
    CountingSummaries.lookups = 0
    settled, races = settle_retire_races(summaries, set(), membership, None, dump_times)
    assert len(races) == size // 2  # every unretired member is in the race, its peers proved it
    retire = CountingSummaries.lookups
    CountingSummaries.lookups = 0
    compare_groups(summaries, set(), membership, T0 + 5 * 10**9, dump_times)
    return retire, CountingSummaries.lookups


def test_the_retire_race_and_the_comparison_are_linear_in_the_group() -> None:
    small, large = _lookups(128), _lookups(256)
    assert large[0] <= 2 * small[0] + 64, (small, large)
    assert large[1] <= 2 * small[1] + 64, (small, large)
