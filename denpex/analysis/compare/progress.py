"""What is known of each member's progress in one group, read from its ring or its pg_status.

A rank whose ring wrapped past the group says nothing there by itself; Gloo's ``pg_status``
may bound it (``progress_from_status``), and a member whose bound contradicts its peers is not
read at all.
"""

from __future__ import annotations

from typing import NamedTuple

from denpex.analysis.summary import GroupProgress, OpKind, RankSummary

__all__ = ["KnownProgress", "known_progress", "progress_from_status"]


class KnownProgress(NamedTuple):
    """One group's members by what is known of their progress there."""

    known: dict[int, GroupProgress]
    unknown: tuple[int, ...]
    # Read from Gloo's pg_status (the report says so in a note).
    from_status: tuple[int, ...]
    # Their pg_status counts fewer ops than their peers completed: not read (a note says so).
    contradicted: tuple[int, ...]


def known_progress(name: str, members: tuple[int, ...], summaries: dict[int, RankSummary]) -> KnownProgress:
    """Members whose progress in ``name`` is known, those whose is not, those whose progress came
    from ``pg_status``, and those whose ``pg_status`` contradicts their peers. A wrapped ring
    without the group says nothing by itself."""
    known: dict[int, GroupProgress] = {}
    wrapped: list[int] = []
    for rank in members:
        summary = summaries.get(rank)
        if summary is None:
            continue
        group = summary.groups.get(name)
        if group is not None and group.entry_count:
            known[rank] = group
        elif summary.ring_wrapped:
            wrapped.append(rank)
        else:
            # The whole history is in the ring and the group is not in it: nothing enqueued.
            known[rank] = group or GroupProgress(name=name)
    if not wrapped:
        return KnownProgress(known, (), (), ())
    # A collective completes only once every member enqueued it: every member enqueued what any
    # known member completed.
    completed = max((g.last_completed for g in known.values()), default=-1)
    stuck = min((op.collective_seq_id for g in known.values() for op in g.pending
                 if op.kind is OpKind.COLLECTIVE), default=None)
    from_status: list[int] = []
    unknown: list[int] = []
    contradicted: list[int] = []
    # A process that destroyed its default group and built it again (an in-process restart)
    # records the new one under another pg_id, and pg_status keeps the old one's frozen counters.
    restarted = any(g.pg_id not in (None, 0) or g.pg_id_changed for g in known.values() if g.entry_count)
    for rank in wrapped:
        if summaries[rank].only_active and stuck is not None:
            # Its dump holds every op it has in flight (onlyActive), and none in this group: it
            # never enqueued the op its peers hold (one it had finished, they would have too).
            known[rank] = GroupProgress(name=name, last_enqueued=stuck - 1, last_completed=stuck - 1,
                                        last_completed_by_all=stuck - 1)
            continue
        status = None if restarted else progress_from_status(name, rank, summaries)
        if status is not None and status.last_enqueued < completed:
            contradicted.append(rank)
            status = None
        elif status is not None and (stuck is None or status.last_enqueued >= stuck):
            status = None  # a count at or past the op may be sends and recvs: it proves nothing
        if status is None:
            unknown.append(rank)
            continue
        known[rank] = status
        from_status.append(rank)
    return KnownProgress(known, tuple(unknown), tuple(from_status), tuple(contradicted))


def progress_from_status(name: str, rank: int, summaries: dict[int, RankSummary]) -> GroupProgress | None:
    """An upper bound on ``rank``'s collectives in ``name`` from its own ``pg_status``, when its
    ring wrapped past the group; None when pg_status cannot give one.

    Gloo only, default group only. Gloo numbers every op it runs, sends and recvs too (they leave
    no ring entry), and ``last_enqueued_collective`` is that number for the last collective: never
    below the rank's collective count, so a count below a collective's seq id proves the rank never
    enqueued it, while a higher count proves nothing (tests/gloo_real/test_gloo_pg_status.py).
    NCCL's counter is the seq id of the rank's last op, a p2p one (``seqP2P_``) after any send or
    recv in the group: no bound either way. The default group is pg_id 0 in every process; Gloo's
    other pg_ids count backends per process and cannot be told from the dump.
    """
    summary = summaries.get(rank)
    if summary is None or not summary.ring_wrapped or summary.backend != "gloo" or name != "0":
        return None
    group = summary.groups.get(name)
    if group is not None and group.entry_count:
        return None
    seen = {g.pg_id for g in summary.groups.values() if g.entry_count}
    if 0 not in summary.pg_status or 0 in seen:
        return None  # no counters, or this rank's ring shows another group under pg_id 0
    if any(pg_id not in seen for pg_id in summary.pg_status if pg_id != 0):
        # Counters for a backend its ring does not show: it may be a rebuilt default group (an
        # in-process restart, which leaves pg_status["0"] frozen), and nothing here says not.
        return None
    enqueued, _ = summary.pg_status[0]
    return GroupProgress(name=name, pg_id=0, last_enqueued=enqueued, last_completed=enqueued,
                         last_completed_by_all=enqueued)
