"""Cross-rank comparison: find each process group's stuck op and who it waits on.

For every group, the *stuck* collective is the lowest ``collective_seq_id`` that some member
enqueued but has not completed. Members that never enqueued it are *behind*; members with it in
flight are *waiting*. Waiting ranks point at the ranks they wait for::

    group "1" = [0, 1, 2, 3]; last enqueued 17,17,16,17; last completed 16,16,16,16
    -> stuck at #17; ranks 0,1,3 wait; rank 2 is behind          wait-for: {0,1,3} -> #17 -> {2}

Point-to-point ops (NCCL only; Gloo does not record them) add an edge from a rank blocked in a
send/recv to the peer that has no matching op in flight. Whoever ends a wait-for chain, waiting
on no one, is a culprit (``denpex.analysis.verdict``). Nothing here depends on file order.

Every rule, and the order they run in, is the one list :data:`RULES` below; each module holds
the rules' own logic: ``collective`` (the stuck collective), ``age`` (when age excuses an op),
``unknown_members`` (an inferred membership), ``tie_breaks`` (direction in an all-in tie),
``p2p`` (sends and recvs).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from denpex.analysis.blockage import Blockage, BlockageKind
from denpex.analysis.compare import collective, p2p, tie_breaks, unknown_members
from denpex.analysis.compare.age import AGE_MATTERS, AGE_UNKNOWN_NOTE, Clock, oldest, young
from denpex.analysis.compare.context import Findings, GroupFacts, Step, decide
from denpex.analysis.compare.found import Found
from denpex.analysis.compare.heads import heads_of, queued_behind
from denpex.analysis.compare.progress import known_progress, progress_from_status
from denpex.analysis.membership import GroupMembership
from denpex.analysis.summary import RankSummary
from denpex.analysis.unreached import unreached_waits
from denpex.analysis.wording import ranks_phrase

__all__ = ["AGE_UNKNOWN_NOTE", "RULES", "Blockage", "BlockageKind", "Comparison", "compare_groups",
           "progress_from_status"]


@dataclass(slots=True)
class Comparison:
    """Every blockage found, plus the in-flight-but-progressing ops that were let go and why."""

    blockages: list[Blockage] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # Waits of ops queued behind their rank's own unfinished op (``denpex.analysis.unreached``):
    # never a reason to leave a component, only direction inside a cycle of waits.
    directions: list[Blockage] = field(default_factory=list)


def _unreached(group: GroupFacts, findings: Findings) -> None:
    """Waits on members that never reached a collective their peers hold, beyond the ranks the
    rules above already blame (``denpex.analysis.unreached``)."""
    name, heads, summaries = group.name, group.heads, group.summaries
    covered = frozenset(r for f in findings.found() for r in f[0].targets)
    waits, directions = unreached_waits(
        name, group.progress, lambda rank, op: queued_behind(rank, op, heads, name), covered,
        lambda rank: summaries[rank].backend == "nccl" and not summaries[rank].timing_enabled,
        lambda rank: rank in heads and heads[rank].record_id == summaries[rank].newest_record_id)
    findings.waits, findings.directions = list(waits), list(directions)


# Every rule, in the order it runs on each process group. The rules wrapped in ``decide`` judge
# the group's stuck collective: the first that finds a blockage decides it, so their order is
# their priority. The rest weigh or add to what was decided.
RULES: tuple[Step, ...] = (
    collective.locate,                         # the stuck collective, if any member holds one
    decide(collective.mismatch),               # members called different ops: a hang whatever the order
    decide(collective.behind_or_absent),       # some members never enqueued it, or left no fresh dump
    decide(collective.queued_on_some),         # on some holders it sits behind their own stuck op
    decide(collective.overdue_started),        # past its timeout, its kernel started on some ranks only
    decide(collective.wrapped_unknown),        # all known members are in it; wrapped rings hold the answer
    decide(collective.overdue_tie),            # everyone is in it past its timeout: a tie
    decide(collective.all_in),                 # everyone is in it, not known overdue: its age decides
    collective.retired_by_gloo_peers,          # a Gloo tie some members retired: undecided
    collective.defer_unready,                  # every holder queued it behind its own op: only a last lead
    unknown_members.guessed_membership,        # an inferred group whose known members all wait: not whole
    tie_breaks.stopped_first,                  # an overdue tie: the one member whose CPU stopped in it
    tie_breaks.lagging_behind,                 # else the one member behind its peers elsewhere
    p2p.peer_waits,                            # sends and recvs waiting on their peer
    _unreached,                                # members that never reached a collective their peers hold
)


def compare_groups(summaries: dict[int, RankSummary], missing: set[int],
                   membership: GroupMembership, as_of_ns: int | None,
                   dumped_at_ns: dict[int, int] | None = None, *, as_of_given: bool = False,
                   world_size: int | None = None) -> Comparison:
    """Compare every group's progress across its members.

    ``dumped_at_ns`` gives each rank's dump time where known; a partly entered op that was young
    at its ranks' dump times (a dump taken mid-step) is progress, not a hang. ``as_of_given``
    says that ``as_of_ns`` is the incident's time (the alert's), not merely the newest time in
    the evidence: only then, or from dump times, is the age of a stuck op known.
    """
    result = Comparison(notes=list(membership.conflicts))
    clock = Clock(as_of_ns, as_of_given, dumped_at_ns or {})
    when = "at the incident time" if as_of_given else "when the ranks dumped"
    heads = heads_of(summaries)
    # Gloo's pg_config is read against the world's size (summary.RankSummary.built_subgroup).
    world = world_size or max([len(membership.members.get("0", ())), *(r + 1 for r in summaries),
                               *(r + 1 for r in missing)])
    lag_cache: dict[str, list[int]] = {}
    deferred: list[tuple[str, Found]] = []
    for name in sorted(membership.members):
        members = membership.members[name]
        progress, unknown, from_status, contradicted = known_progress(name, members, summaries)
        if not progress:
            continue
        group = GroupFacts(name, members, progress, unknown, missing, summaries, membership, heads, clock,
                           world, lag_cache)
        findings = Findings()
        for rule in RULES:
            rule(group, findings)
        deferred += [(name, f) for f in findings.deferred]
        found = findings.found()
        if from_status and found:
            their = "its" if len(from_status) == 1 else "their"
            result.notes.append(f"{ranks_phrase(from_status)} left no entry of process group {name!r} "
                                f"in {their} wrapped ring{'' if len(from_status) == 1 else 's'}; "
                                f"{their} progress there is read from pg_status (Gloo's count of "
                                "every op, sends and recvs included, below the stuck op's seq id)")
        if contradicted:
            result.notes.append(f"the pg_status of {ranks_phrase(contradicted)} counts fewer ops in "
                                f"process group {name!r} than its peers completed there (every member "
                                "enqueues a collective before it completes anywhere): not read")
        _add(result, name, found, missing, clock, when)
        # A young unreached wait is the same progress the stuck op's note already reports.
        _add(result, name, findings.waits, missing, clock, when, quiet=True)
        _add(result, name, findings.directions, missing, clock, when, into=result.directions, quiet=True)
    if not result.blockages:
        # Every stuck op sat behind an earlier op of its holders that is not stuck itself (it
        # was young, or nothing could be read of it): the queued ones are the only lead left.
        for name, queued in deferred:
            _add(result, name, [queued], missing, clock, when)
    if any(b.age_unknown for b in result.blockages):
        result.notes.append(AGE_UNKNOWN_NOTE)
    return result


def _add(result: Comparison, name: str, found: list[Found], missing: set[int],
         clock: Clock, when: str, *, into: list[Blockage] | None = None, quiet: bool = False) -> None:
    """Report each blockage, or a note where its waiting ops are provably young (progress)."""
    for blockage, ops in found:
        # A rank that left no dump may be dead: then a young wait proves nothing either way.
        age = None if missing.intersection(blockage.targets) else young(ops, clock)
        if age and quiet:
            continue
        if age:
            result.notes.append(f"process group {name!r} {blockage.op} #{blockage.seq} is partly "
                                f"entered but was at most {age} old {when}: "
                                "still in progress, not counted as a hang")
        else:
            (result.blockages if into is None else into).append(replace(
                blockage, enqueued_ns=oldest(ops),
                age_unknown=blockage.age_unknown or (blockage.kind in AGE_MATTERS and clock.age_unknown(ops))))
