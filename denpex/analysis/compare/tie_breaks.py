"""Direction inside an all-in tie: which member the others wait on when everyone entered the op.

Every member of the stuck collective entered it and none finished, so the op alone names no
one. Two weak leads may single one member out, tried in the order ``RULES`` lists them:
``stopped_at`` (its CPU enqueued nothing after the op) and ``lagging_at`` (it is behind its
peers in another group, and every other member went past it). Either adds a direction; the tie
itself stays reported.
"""

from __future__ import annotations

from bisect import bisect_right

from denpex.analysis.blockage import Blockage, BlockageKind
from denpex.analysis.compare.collective import op_at
from denpex.analysis.compare.context import Findings, GroupFacts
from denpex.analysis.compare.found import Found
from denpex.analysis.membership import GroupMembership
from denpex.analysis.summary import GroupProgress, OpState, RankSummary
from denpex.analysis.wording import ranks_phrase

__all__ = ["lagging_at", "lagging_behind", "stopped_at", "stopped_first"]


def _open_tie(findings: Findings) -> Blockage | None:
    """The stuck op when it is an overdue tie that no earlier rule has directed yet."""
    stuck = findings.stuck
    if stuck is None or findings.direction is not None or not stuck[0].tie:
        return None
    return stuck[0] if stuck[0].kind is BlockageKind.OVERDUE else None


def stopped_first(group: GroupFacts, findings: Findings) -> None:
    """Direct an overdue tie at the one member whose CPU stopped in it (``stopped_at``)."""
    tie = _open_tie(findings)
    if tie is not None:
        findings.direction = stopped_at(tie, group.progress, group.summaries)


def lagging_behind(group: GroupFacts, findings: Findings) -> None:
    """Direct an overdue tie at the one member behind the others elsewhere (``lagging_at``)."""
    tie = _open_tie(findings)
    if tie is not None:
        findings.direction = lagging_at(tie, group.summaries, group.membership, group.lag_cache)


def stopped_at(tie: Blockage, progress: dict[int, GroupProgress],
               summaries: dict[int, RankSummary]) -> Found | None:
    """Direction inside an all-in op: the one member whose CPU never got past it while the others' did.

    Every member enqueued collective ``#seq`` and none finished it; with NCCL timing off (every
    entry ``scheduled``, which tells what was enqueued, not what started) nothing says whose GPU
    never ran it. But NCCL enqueues asynchronously: a rank whose CPU still runs goes on enqueuing
    its next ops, in this group or others, until it syncs, and members of a group run the same
    program around the group's collectives. Members that enqueued anything after ``#seq`` prove
    the program goes on past it without a sync; a member whose newest entry is ``#seq`` itself
    has a CPU that stopped there: a lost GPU blocks its next driver call, or the process hung,
    or it synchronised right after the op (``loss.item()`` on one rank only) while the fault is
    elsewhere. The last cannot be told apart, so this is a weak lead, and it is read only where
    its premise holds:

    - NCCL (Gloo's collectives are synchronous: a later entry only means ``async_op=True``);
    - timing off on every member and every member's entry ``scheduled`` (with timing on, which
      kernels started says more, and a started kernel means the GPU ran it);
    - exactly one stopped member, against at least two that went on (a program that syncs on
      most ranks, or on half, says nothing about any one of them).
    """
    if tie.unknown or len(tie.waiting) < 3:
        return None
    stopped: list[int] = []
    passed: list[int] = []
    for rank in tie.waiting:
        summary = summaries.get(rank)
        op = op_at(progress[rank], tie.seq) if rank in progress else None
        if (summary is None or summary.backend != "nccl" or summary.timing_enabled or op is None
                or op.state is not OpState.SCHEDULED or op.record_id is None
                or summary.newest_record_id is None):
            return None
        (stopped if summary.newest_record_id == op.record_id else passed).append(rank)
    if len(stopped) != 1 or len(passed) < 2:
        return None
    return Blockage(tie.group, tie.seq, BlockageKind.STOPPED, tie.op, tuple(passed), tuple(stopped),
                    unknown=tie.unknown, age_unknown=tie.age_unknown,
                    detail=f"every member entered it; {ranks_phrase(tuple(passed))} went on to "
                           f"enqueue later ops, while rank {stopped[0]} enqueued nothing after it: "
                           f"its CPU stopped there (a lost GPU or a hung process), or its process "
                           "synchronised right after the op, e.g. .item(), and the fault is elsewhere"), []


# A tie with more members is left to ``_stopped_at``; the comparison below is quadratic in them.
_LAGGING_MAX_MEMBERS = 16


def lagging_at(tie: Blockage, summaries: dict[int, RankSummary], membership: GroupMembership,
               cache: dict[str, list[int]]) -> Found | None:
    """Direction inside an all-in op from the members' progress in the other groups they are in.

    Every member entered collective ``#seq`` and none finished; the op alone cannot say whose GPU
    or link holds it (a tensor-parallel pair both in its ``_all_gather_base``). NCCL enqueues
    asynchronously, so each member's CPU goes on enqueuing its next ops, in any group, until it
    stops (a lost GPU blocks its next driver call, a hung process) or synchronises. One member
    is singled out when, in other groups:

    - it is *behind its peers*: at least two other members of another group enqueued a
      collective there that it never enqueued (the ep ``all_to_all`` its expert-parallel peers
      wait in), so its own CPU stopped short of where theirs went (one peer ahead would be a
      one-against-one program difference, as ``stopped_at`` refuses too); and
    - every other member of the tie went past it: each enqueued a collective, in a group it
      shares with this member (not the tied group), that this member never enqueued, and none is
      behind it anywhere they share. Their CPUs got beyond where this one stopped, so they wait
      in ``#seq`` on it, not it on them.

    Where both members stopped at the same place (each behind its expert peers, neither past the
    other), nothing separates them and the tie stays. NCCL only (Gloo's collectives are
    synchronous), progress read from the rings only (a group a wrapped ring does not show is
    unknown there).
    """
    members = tie.waiting
    if tie.unknown or not 2 <= len(members) <= _LAGGING_MAX_MEMBERS:
        return None
    if any(summaries[r].backend != "nccl" for r in members if r in summaries) or any(
            r not in summaries for r in members):
        return None
    found: list[tuple[int, str, str]] = []
    for rank in members:
        behind = _behind_peers(rank, tie.group, summaries, membership, cache)
        if behind is None:
            continue
        passed = [_went_past(other, rank, tie.group, summaries) for other in members if other != rank]
        if all(p is not None for p in passed):
            found.append((rank, behind, "; ".join(p for p in passed if p is not None)))
    if len(found) != 1:
        return None
    rank, behind, passed_text = found[0]
    others = tuple(r for r in members if r != rank)
    return Blockage(tie.group, tie.seq, BlockageKind.LAGGING, tie.op, others, (rank,),
                    unknown=tie.unknown, age_unknown=tie.age_unknown,
                    detail=f"every member entered it and none finished; rank {rank} is also behind "
                           f"its peers in {behind}, while {passed_text}: its CPU stopped first, and "
                           f"{ranks_phrase(others)} wait{'s' if len(others) == 1 else ''} in it on "
                           "rank " + str(rank)), []


def _known_last_enqueued(summary: RankSummary, name: str) -> int | None:
    """The rank's newest collective in ``name``, or None where its wrapped ring may have lost it."""
    group = summary.groups.get(name)
    if group is not None and group.entry_count:
        return group.last_enqueued
    return None if summary.ring_wrapped else -1


def _behind_peers(rank: int, tied: str, summaries: dict[int, RankSummary], membership: GroupMembership,
                  cache: dict[str, list[int]]) -> str | None:
    """A group other than ``tied`` where at least two other members enqueued a collective that
    ``rank`` never enqueued, described; None when there is none."""
    summary = summaries[rank]
    for name in sorted(summary.groups):
        if name == tied or not membership.has_member(name, rank):
            continue
        mine = _known_last_enqueued(summary, name)
        if mine is None:
            continue
        if name not in cache:
            cache[name] = sorted(v for r in membership.members.get(name, ()) if r in summaries
                                 and (v := _known_last_enqueued(summaries[r], name)) is not None)
        levels = cache[name]
        ahead = len(levels) - bisect_right(levels, mine)
        if ahead >= 2:
            return (f"process group {name!r} ({ahead} of its members enqueued collective "
                    f"#{mine + 1} or later there; it never did)")
    return None


def _went_past(other: int, rank: int, tied: str, summaries: dict[int, RankSummary]) -> str | None:
    """Where ``other`` enqueued a collective ``rank`` never did, in a group both are in (other
    than ``tied``), described; None when it did nowhere, or when ``rank`` is ahead somewhere."""
    theirs, mine = summaries[other], summaries[rank]
    where = None
    for name in sorted(set(theirs.groups) & set(mine.groups)):
        if name == tied:
            continue
        a, b = _known_last_enqueued(theirs, name), _known_last_enqueued(mine, name)
        if a is None or b is None:
            continue
        if b > a:
            return None  # ahead of it somewhere: the two orders disagree, nothing is proven
        if a > b and where is None:
            where = f"rank {other} enqueued collective #{a} in process group {name!r}, where rank {rank} stopped at #{b}"
    return where
