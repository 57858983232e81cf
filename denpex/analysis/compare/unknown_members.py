"""Without a manifest, a group whose every known member waits in one collective is not whole.

The rule (``guessed_membership``) runs only on a group whose members were inferred from the
dumps, and only when nothing decided its stuck op or the op is merely overdue: a mismatch among
the known members stands whatever the membership.
"""

from __future__ import annotations

from denpex.analysis.blockage import Blockage, BlockageKind
from denpex.analysis.compare.context import Findings, GroupFacts
from denpex.analysis.compare.found import Found
from denpex.analysis.summary import GroupProgress, RankSummary
from denpex.analysis.wording import ranks_phrase

__all__ = ["guessed_membership", "unknown_members"]


def guessed_membership(group: GroupFacts, findings: Findings) -> None:
    """Replace an overdue (or no) verdict on an inferred group with its unknown members."""
    stuck = findings.stuck
    if group.name in group.membership.inferred and (stuck is None or stuck[0].kind is BlockageKind.OVERDUE):
        findings.stuck = unknown_members(group.name, group.progress, group.summaries, group.missing,
                                         group.world_size) or stuck


def unknown_members(name: str, progress: dict[int, GroupProgress], summaries: dict[int, RankSummary],
                    missing: set[int], world_size: int) -> Found | None:
    """Without a manifest a group's members are the ranks whose dumps mention it. When every one
    of them waits in the same collective, the group cannot be whole: a collective whose members
    all entered completes (a one-member group's at once), so members that left no entry in the
    group exist and did not enter. They are among the ranks with nothing in flight anywhere (an
    idle rank cannot be blocked elsewhere) and the ranks without evidence. Gloo's own records
    cannot name the group, but they do say who built one: Gloo's ``pg_config`` holds the
    last-built backend only, ``[]`` (torch 2.13) or positions shorter than the world (torch 2.14)
    for a subgroup and the world's ranks for the default group (non-members build no backend), so
    a rank that shows the world's list is a member of no subgroup, and one that shows a shorter
    list is a member of some. Such a rank may be blocked in another
    group (it skipped this one's op and went on): it stays a suspect even when not idle.
    ``pg_status`` registers a group only once the rank records an entry in it, so it cannot tell
    a member that never entered from a non-member.
    """
    ops = {r: p.oldest_pending_collective() for r, p in progress.items()}
    seqs = {op.collective_seq_id for op in ops.values() if op is not None}
    if None in ops.values() or len(seqs) != 1:
        return None
    seq = seqs.pop()
    outside = {r: s for r, s in summaries.items() if name not in s.groups}
    built = tuple(sorted(r for r, s in outside.items() if s.built_subgroup(world_size)))
    idle = tuple(sorted(r for r, s in outside.items() if s.built_subgroup(world_size) is None
                        and not any(g.pending for g in s.groups.values())))
    suspects = tuple(sorted(built + idle)) + tuple(sorted(missing))
    op = next(o for o in ops.values() if o is not None)
    waiting = tuple(sorted(ops))
    why = []
    if built:
        why.append(f"Gloo's pg_config shows that {ranks_phrase(built)} built a subgroup")
    if idle:
        why.append(f"{ranks_phrase(idle)} {'is' if len(idle) == 1 else 'are'} idle")
    if missing:
        why.append(f"{ranks_phrase(tuple(sorted(missing)))} left no evidence")
    among = "member can only be" if len(suspects) == 1 else "members are among"
    where = (f"; its other {among} {ranks_phrase(suspects)} ({'; '.join(why)})"
             if suspects else "; no rank could be one (none idle, none built a subgroup)")
    they = "mentions the group, and it waits" if len(waiting) == 1 else "mention the group, and all of them wait"
    return Blockage(name, seq, BlockageKind.UNKNOWN_MEMBERS, op.signature.describe(), waiting, suspects,
                    undecided=True,
                    detail=f"membership is unknown: only {ranks_phrase(waiting)} {they} in it{where}. "
                           "Pass a manifest with process_groups"
                    ), [(r, o) for r, o in ops.items() if o is not None]
