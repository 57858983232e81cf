"""Cross-rank comparison: find each process group's stuck op and who it waits on.

For every group, the *stuck* collective is the lowest ``collective_seq_id`` that some member
enqueued but has not completed. Members that never enqueued it are *behind*; members with it in
flight are *waiting*. Waiting ranks point at the ranks they wait for::

    group "1" = [0, 1, 2, 3]; last enqueued 17,17,16,17; last completed 16,16,16,16
    -> stuck at #17; ranks 0,1,3 wait; rank 2 is behind          wait-for: {0,1,3} -> #17 -> {2}

Point-to-point ops (NCCL only; Gloo does not record them) add an edge from a rank blocked in a
send/recv to the peer that has no matching op in flight. Whoever ends a wait-for chain, waiting
on no one, is a culprit (``denpex.analysis.verdict``). Nothing here depends on file order.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

from denpex.analysis.blockage import Blockage, BlockageKind
from denpex.analysis.membership import GroupMembership
from denpex.analysis.unreached import unreached_waits
from denpex.analysis.wording import ranks_phrase
from denpex.analysis.op_rules import AgreementKey, agreement_key
from denpex.analysis.summary import GroupProgress, OpKind, OpSignature, OpState, PendingOp, RankSummary

__all__ = ["AGE_UNKNOWN_NOTE", "Blockage", "BlockageKind", "Comparison", "compare_groups", "progress_from_status"]


@dataclass(slots=True)
class Comparison:
    """Every blockage found, plus the in-flight-but-progressing ops that were let go and why."""

    blockages: list[Blockage] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # Waits of ops queued behind their rank's own unfinished op (``denpex.analysis.unreached``):
    # never a reason to leave a component, only direction inside a cycle of waits.
    directions: list[Blockage] = field(default_factory=list)


_RankOp = tuple[int, PendingOp]
_Found = tuple[Blockage, list[_RankOp]]


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
    dumped_at_ns = dumped_at_ns or {}
    clock = _Clock(as_of_ns, as_of_given, dumped_at_ns)
    when = "at the incident time" if as_of_given else "when the ranks dumped"
    heads = _heads(summaries)
    # Gloo's pg_config is read against the world's size (summary.RankSummary.built_subgroup).
    world = world_size or max([len(membership.members.get("0", ())), *(r + 1 for r in summaries),
                               *(r + 1 for r in missing)])
    lag_cache: dict[str, list[int]] = {}
    deferred: list[tuple[str, _Found]] = []
    for name in sorted(membership.members):
        members = membership.members[name]
        progress, unknown, from_status, contradicted = _known_progress(name, members, summaries)
        if not progress:
            continue
        later: list[_Found] = []
        found = [_collective_blockage(name, progress, members, missing, unknown, clock, heads, later)]
        deferred += [(name, f) for f in later]
        if name in membership.inferred and (found[0] is None or found[0][0].kind is BlockageKind.OVERDUE):
            # A mismatch among the known members stands whatever the membership.
            found[0] = _unknown_members(name, progress, summaries, missing, world) or found[0]
        if found[0] is not None and found[0][0].tie and found[0][0].kind is BlockageKind.OVERDUE:
            found.append(_stopped_at(found[0][0], progress, summaries)
                         or _lagging_at(found[0][0], summaries, membership, lag_cache))
        found += _p2p_blockages(name, progress, members, missing, summaries, heads, as_of_ns)
        covered = frozenset(r for f in found if f is not None for r in f[0].targets)
        waits, directions = unreached_waits(
            name, progress, lambda rank, op: _queued_behind(rank, op, heads, name), covered,
            lambda rank: summaries[rank].backend == "nccl" and not summaries[rank].timing_enabled,
            lambda rank: rank in heads and heads[rank].record_id == summaries[rank].newest_record_id)
        if from_status and any(f is not None for f in found):
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
        _add(result, name, list(waits), missing, clock, when, quiet=True)
        _add(result, name, list(directions), missing, clock, when, into=result.directions, quiet=True)
    if not result.blockages:
        # Every stuck op sat behind an earlier op of its holders that is not stuck itself (it
        # was young, or nothing could be read of it): the queued ones are the only lead left.
        for name, queued in deferred:
            _add(result, name, [queued], missing, clock, when)
    if any(b.age_unknown for b in result.blockages):
        result.notes.append(AGE_UNKNOWN_NOTE)
    return result


def _add(result: Comparison, name: str, found: list[_Found | None], missing: set[int],
         clock: _Clock, when: str, *, into: list[Blockage] | None = None, quiet: bool = False) -> None:
    for blockage, ops in (f for f in found if f is not None):
        # A rank that left no dump may be dead: then a young wait proves nothing either way.
        young = None if missing.intersection(blockage.targets) else _young(ops, clock)
        if young and quiet:
            continue
        if young:
            result.notes.append(f"process group {name!r} {blockage.op} #{blockage.seq} is partly "
                                f"entered but was at most {young} old {when}: "
                                "still in progress, not counted as a hang")
        else:
            (result.blockages if into is None else into).append(replace(blockage, enqueued_ns=_oldest(ops),
                                            age_unknown=blockage.age_unknown or (
                                                blockage.kind in _AGE_MATTERS
                                                and clock.age_unknown(ops))))


AGE_UNKNOWN_NOTE = ("how long the stuck op has waited is unknown: the dumps record no dump time and "
                    "no incident time was given, so a slow rank looks exactly like a hung one and "
                    "the confidence is lowered. Pass --as-of with the alert time.")


# A slow rank looks exactly like a hung one in these; a mismatch or an overdue op is a hang
# whatever its age.
_AGE_MATTERS = frozenset({BlockageKind.BEHIND, BlockageKind.P2P, BlockageKind.UNKNOWN_MEMBERS,
                          BlockageKind.UNREACHED})
# An op that waited at least this share of its timeout is stuck, not slow (torch's NCCL watchdog
# and Denpex's HangDumper only dump past it: the dumper at 0.75 x timeout).
STUCK_SHARE_OF_TIMEOUT = 0.5


@dataclass(frozen=True, slots=True)
class _Clock:
    """What the evidence says about time: the incident's time and each rank's dump time."""

    as_of_ns: int | None
    as_of_given: bool
    dumped_at_ns: dict[int, int]

    def age_ns(self, rank: int, op: PendingOp) -> int | None:
        """How long ``op`` had waited: at the incident time if given, else at the rank's dump."""
        if op.time_created_ns is None:
            return None
        when = self.as_of_ns if self.as_of_given else self.dumped_at_ns.get(rank)
        return None if when is None else when - op.time_created_ns

    def age_unknown(self, ops: list[_RankOp]) -> bool:
        """True unless some waiting op provably waited half its timeout, or every age is known.

        The default incident time (the newest time in the evidence) still bounds an age from
        below, so an op that old against it is known to be stuck.
        """
        if not ops:
            return False
        ages = [self.age_ns(r, op) for r, op in ops]
        if all(a is not None for a in ages):
            return False
        return not any(op.timeout_ms and self.as_of_ns is not None and op.time_created_ns is not None
                       and self.as_of_ns - op.time_created_ns
                       >= STUCK_SHARE_OF_TIMEOUT * op.timeout_ms * 1_000_000 for _, op in ops)


# A waiting op younger than this share of its timeout at dump time is still in progress.
YOUNG_SHARE_OF_TIMEOUT = 0.5


def _young(ops: list[_RankOp], clock: _Clock) -> str | None:
    """The largest age if every waiting op is provably young (at the given incident time, else at
    its rank's dump time), else None."""
    ages = []
    for rank, op in ops:
        age_ns = clock.age_ns(rank, op)
        if age_ns is None or not op.timeout_ms:
            return None
        if age_ns >= YOUNG_SHARE_OF_TIMEOUT * op.timeout_ms * 1_000_000:
            return None
        ages.append(age_ns)
    return f"{max(ages) / 1e9:.1f} s" if ages else None


def _oldest(ops: list[_RankOp]) -> int | None:
    times = [op.time_created_ns for _, op in ops if op.time_created_ns]
    return min(times) if times else None


@dataclass(frozen=True, slots=True)
class _Head:
    """A rank's oldest in-flight op: its process-wide ``record_id``, and its p2p batch if any."""

    record_id: int
    batch: tuple[str, int] | None = None
    """(group, p2p_seq_id) when the op is a member of a ``batch_isend_irecv`` batch."""


def _heads(summaries: dict[int, RankSummary]) -> dict[int, _Head]:
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
            heads[rank] = _Head(record_id, (name, op.p2p_seq_id) if op.in_batch else None)
    return heads


def _queued_behind(rank: int, op: PendingOp, heads: dict[int, _Head], group: str) -> bool:
    """Whether ``op`` waits behind the rank's own older op. Members of one p2p batch are issued
    as one group call (``ncclGroupStart``/``End``), not in order: none is queued behind another,
    and each member's peer is one the batch waits on."""
    head = heads.get(rank)
    if head is None or op.record_id is None or op.record_id <= head.record_id:
        return False
    return not (op.in_batch and head.batch == (group, op.p2p_seq_id))


def _known_progress(name: str, members: tuple[int, ...], summaries: dict[int, RankSummary]
                    ) -> tuple[dict[int, GroupProgress], tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
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
        return known, (), (), ()
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
    return known, tuple(unknown), tuple(from_status), tuple(contradicted)


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


def _collective_blockage(name: str, progress: dict[int, GroupProgress], members: tuple[int, ...],
                         missing: set[int], unknown: tuple[int, ...], clock: _Clock,
                         heads: dict[int, _Head], deferred: list[_Found]) -> _Found | None:
    """The group's stuck collective and who it waits on.

    An op that every member holding it enqueued behind an earlier op of its own that has not
    finished is not what any of them is blocked in (NCCL runs a rank's work in order): its
    blockage goes to ``deferred``, used only when nothing else is stuck. Edges from it would let
    mere enqueue order break ties elsewhere.
    """
    last_enqueued = max(p.last_enqueued for p in progress.values())
    floor = min(p.last_enqueued for p in progress.values())
    if any(p.last_completed > floor for p in progress.values()):
        # A collective cannot finish unless every member enqueued it. A peer that shows it
        # finished anyway was blocked in it until it failed (Gloo may retire a failed op).
        seq, failed = floor + 1, True
    else:
        seq, failed = min(p.last_completed for p in progress.values()) + 1, False
    if last_enqueued < 0 or seq > last_enqueued:
        return None
    waiting_ops = _holding(progress, seq, failed)
    if not waiting_ops:
        # Nobody holds ``seq``: sequence ids start at 1 (nothing completed yet gives seq 0), or
        # the laggard is several ops behind. The stuck op is the lowest one a member holds.
        seq = _lowest_held(progress, seq, failed)
        waiting_ops = _holding(progress, seq, failed)
        if not waiting_ops:
            return None
    behind = tuple(r for r, p in sorted(progress.items()) if p.last_enqueued < seq)
    absent = tuple(r for r in members if r in missing)
    ready = {r: o for r, o in waiting_ops.items() if not _queued_behind(r, o, heads, name)}
    found = _blockage_at(name, seq, waiting_ops, ready, behind, absent, unknown, clock)
    retired = tuple(r for r, p in sorted(progress.items()) if p.last_completed >= seq)
    if (found is not None and retired and not failed and found[0].kind is BlockageKind.OVERDUE and found[0].tie
            and all(o.signature.op.startswith("gloo:") for o in waiting_ops.values())):
        # Gloo peers retired it and the retire race was not proven (denpex.analysis.retire_race):
        # Gloo retires an op that timed out too, so neither "none finished" nor a culprit is known.
        # NCCL records a real completion (its watchdog dumps timed-out work before retiring it),
        # and a member's GPU can stop after its peers got their data: that stays a lead.
        found = (replace(found[0], undecided=True, detail=(
            f"{ranks_phrase(retired)} retired it, which Gloo does when the op completes and also when "
            "it times out; the evidence does not show which (the holders entered it late, or the "
            "evidence reaches its timeout)")), found[1])
    if found is not None and not ready and found[0].kind is not BlockageKind.MISMATCH:
        # Judged young or old on every holder's op: none is ready, but they are all it has.
        deferred.append((replace(found[0], waiting=tuple(waiting_ops)) if not found[0].waiting else found[0],
                         found[1] or list(waiting_ops.items())))
        return None
    return found


def _blockage_at(name: str, seq: int, waiting_ops: dict[int, PendingOp], ready: dict[int, PendingOp],
                 behind: tuple[int, ...], absent: tuple[int, ...], unknown: tuple[int, ...],
                 clock: _Clock) -> _Found | None:
    """What op ``#seq`` waits on. ``ready`` are the holders for which it is the oldest op in
    flight: only they wait in it (the others wait wherever their oldest op is)."""
    ops = list(ready.items())
    mismatch = _mismatch(name, seq, waiting_ops, behind, absent, unknown)
    if mismatch is not None:
        # A mismatch is a hang whatever the order; but only ready ranks wait in it now.
        stripped = tuple(r for r in mismatch.waiting if r in ready)
        if not mismatch.tie and stripped:
            mismatch = replace(mismatch, waiting=stripped)
        return mismatch, ops or list(waiting_ops.items())
    op_text = next(iter(waiting_ops.values())).signature.describe()
    if behind or absent:
        return Blockage(name, seq, BlockageKind.BEHIND, op_text, tuple(ready), behind + absent,
                        detail=_behind_detail(behind, absent), unknown=unknown), ops
    queued = tuple(r for r in waiting_ops if r not in ready)
    if queued and ready:
        # Everyone enqueued it, but on these ranks it sits behind an op that is itself stuck.
        return Blockage(name, seq, BlockageKind.BEHIND, op_text, tuple(ready), queued, unknown=unknown,
                        detail=f"{ranks_phrase(queued)} enqueued it behind an earlier op that has "
                               "not finished"), ops
    overdue = _overdue(name, seq, op_text, waiting_ops, clock.as_of_ns, unknown)
    if overdue is not None and not overdue.tie:
        # A kernel that never started on some ranks singles them out whatever the wrapped
        # members did: their GPU never ran it though their stream was free to.
        wrapped = (f"; {ranks_phrase(unknown)} left no entry of the group in "
                   f"{'its wrapped ring' if len(unknown) == 1 else 'their wrapped rings'}") if unknown else ""
        return replace(overdue, unknown=unknown, detail=overdue.detail + wrapped), []
    if unknown:
        # Every member whose progress is known is in it, and the op completes once all members
        # entered: the members whose rings wrapped past the group hold the answer. Each never
        # entered it, or entered it (NCCL enqueues asynchronously) and ran enough ops in other
        # groups since that its ring no longer shows it; nothing here says which.
        their = "its wrapped ring" if len(unknown) == 1 else "their wrapped rings"
        return Blockage(name, seq, BlockageKind.BEHIND, op_text, tuple(ready), unknown, unknown=unknown,
                        undecided=True,
                        detail=f"every member whose dump shows the group entered it; "
                               f"{ranks_phrase(unknown)} left no entry of the group in {their} and "
                               f"no usable pg_status: {'it' if len(unknown) == 1 else 'each'} never "
                               "entered it, or entered it and its ring has wrapped since"), ops
    if overdue is None:
        return _all_in_of_unknown_age(name, seq, op_text, waiting_ops, unknown, clock)
    # An overdue op is old by definition: no dump-time test may excuse it.
    return overdue, []


def _all_in_of_unknown_age(name: str, seq: int, op: str, ops: dict[int, PendingOp],
                           unknown: tuple[int, ...], clock: _Clock) -> _Found | None:
    """Everyone entered and the op is not known to be overdue. It is progress only when the
    incident time or the dump times show it younger than half its timeout; with no age at all
    a slow collective and a hung one look the same, so it stays a (weak) lead."""
    pairs = list(ops.items())
    if not clock.age_unknown(pairs):
        ages = [(clock.age_ns(r, o), o.timeout_ms) for r, o in pairs]
        if all(a is not None and (not t or a < STUCK_SHARE_OF_TIMEOUT * t * 1_000_000) for a, t in ages):
            return None
        detail = "every member entered it and none finished after half its timeout"
        return Blockage(name, seq, BlockageKind.OVERDUE, op, tuple(ops), tuple(ops), tie=True,
                        detail=detail, unknown=unknown), []
    ranks = tuple(ops)
    return Blockage(name, seq, BlockageKind.OVERDUE, op, ranks, ranks, tie=True, unknown=unknown,
                    age_unknown=True,
                    detail="every member entered it and none had finished when they dumped; how "
                           "long it had waited is unknown"), []


def _stopped_at(tie: Blockage, progress: dict[int, GroupProgress],
                summaries: dict[int, RankSummary]) -> _Found | None:
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
        op = _op_at(progress[rank], tie.seq) if rank in progress else None
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


def _lagging_at(tie: Blockage, summaries: dict[int, RankSummary], membership: GroupMembership,
                cache: dict[str, list[int]]) -> _Found | None:
    """Direction inside an all-in op from the members' progress in the other groups they are in.

    Every member entered collective ``#seq`` and none finished; the op alone cannot say whose GPU
    or link holds it (a tensor-parallel pair both in its ``_all_gather_base``). NCCL enqueues
    asynchronously, so each member's CPU goes on enqueuing its next ops, in any group, until it
    stops (a lost GPU blocks its next driver call, a hung process) or synchronises. One member
    is singled out when, in other groups:

    - it is *behind its peers*: at least two other members of another group enqueued a
      collective there that it never enqueued (the ep ``all_to_all`` its expert-parallel peers
      wait in), so its own CPU stopped short of where theirs went (one peer ahead would be a
      one-against-one program difference, as ``_stopped_at`` refuses too); and
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
    from bisect import bisect_right

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


def _unknown_members(name: str, progress: dict[int, GroupProgress], summaries: dict[int, RankSummary],
                     missing: set[int], world_size: int) -> _Found | None:
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


def _holding(progress: dict[int, GroupProgress], seq: int, failed: bool) -> dict[int, PendingOp]:
    """Members that enqueued ``seq`` and did not finish it, with their op there."""
    return {r: op for r, p in sorted(progress.items())
            if p.last_enqueued >= seq and (failed or p.last_completed < seq)
            and (op := _op_at(p, seq)) is not None}


def _lowest_held(progress: dict[int, GroupProgress], seq: int, failed: bool) -> int:
    """The lowest collective at or after ``seq`` that some member has in flight (or, after a
    failure, as its newest op); ``seq`` itself when there is none."""
    held = [op.collective_seq_id for p in progress.values() for op in p.pending
            if op.kind is OpKind.COLLECTIVE and op.collective_seq_id >= seq]
    if failed:
        held += [p.last_op.collective_seq_id for p in progress.values()
                 if p.last_op is not None and p.last_op.collective_seq_id >= seq]
    return min(held, default=seq)


def _op_at(progress: GroupProgress, seq: int) -> PendingOp | None:
    """The rank's op at ``seq``: in flight, or (after a failure) its newest, retired one."""
    for op in progress.pending:
        if op.kind is OpKind.COLLECTIVE and op.collective_seq_id == seq:
            return op
    last = progress.last_op
    return last if last is not None and last.collective_seq_id == seq else None


def _mismatch(name: str, seq: int, ops: dict[int, PendingOp], behind: tuple[int, ...],
              absent: tuple[int, ...], unknown: tuple[int, ...]) -> Blockage | None:
    """Majority decides what the group called; ranks outside the majority are the culprits.

    Calls are compared only on what the op requires to agree (:mod:`denpex.analysis.op_rules`).
    Members that never entered are culprits too: a mismatch never hides them. When the calls tie
    and some members have not called (or left no evidence), their calls would decide the
    majority, so the blockage is undecided.
    """
    by_key: dict[AgreementKey, list[int]] = {}
    for rank, op in ops.items():
        by_key.setdefault(agreement_key(op.signature), []).append(rank)
    if len(by_key) < 2:
        return None
    signature_of = {key: ops[ranks[0]].signature for key, ranks in by_key.items()}
    counts = Counter({key: len(ranks) for key, ranks in by_key.items()})
    (top, top_n), *rest = counts.most_common()
    detail = _mismatch_detail({signature_of[k]: r for k, r in by_key.items()}, behind, absent)
    if any(n == top_n for _, n in rest):
        tied = tuple(sorted(r for key, ranks in by_key.items() if counts[key] == top_n for r in ranks))
        others = tuple(sorted(r for r in ops if r not in tied))
        if behind or absent or unknown:
            # Nobody waits on the tied ranks here: each is a culprit in its own right.
            return Blockage(name, seq, BlockageKind.MISMATCH, "disagreeing calls", (),
                            tied + others + behind + absent, detail=detail, unknown=unknown,
                            mismatched=tied + others, undecided=True)
        return Blockage(name, seq, BlockageKind.MISMATCH, "disagreeing calls", tied, tied + others,
                        tie=True, detail=detail, unknown=unknown, mismatched=tied + others)
    minority = tuple(sorted(r for key, ranks in by_key.items() if key != top for r in ranks))
    return Blockage(name, seq, BlockageKind.MISMATCH, signature_of[top].describe(),
                    tuple(sorted(by_key[top])), minority + behind + absent, detail=detail,
                    unknown=unknown, mismatched=minority)


def _overdue(name: str, seq: int, op: str, ops: dict[int, PendingOp], as_of_ns: int | None,
             unknown: tuple[int, ...]) -> Blockage | None:
    """Everyone entered the same op. That is a hang only once it outlived its timeout.

    A dump taken while a healthy job runs, or Gloo's retire race, shows such an op in flight;
    calling a hang on it would blame healthy ranks.
    """
    if as_of_ns is None or not any(_is_overdue(op_, as_of_ns) for op_ in ops.values()):
        return None
    not_started = tuple(r for r, o in ops.items() if o.state is OpState.SCHEDULED)
    started = tuple(r for r, o in ops.items() if o.state is OpState.STARTED)
    if started and not_started:
        # With NCCL timing on, a kernel that never started on some ranks singles them out.
        return Blockage(name, seq, BlockageKind.OVERDUE, op, started, not_started,
                        detail="its kernel started on some ranks but not on these")
    ranks = tuple(ops)
    return Blockage(name, seq, BlockageKind.OVERDUE, op, ranks, ranks, tie=True,
                    detail="every member entered it and none finished; the dumps cannot say which")


def _is_overdue(op: PendingOp, as_of_ns: int) -> bool:
    if op.time_created_ns is None or op.timeout_ms is None:
        return False
    return op.time_created_ns + op.timeout_ms * 1_000_000 <= as_of_ns


def _p2p_blockages(name: str, progress: dict[int, GroupProgress], members: tuple[int, ...],
                   missing: set[int], summaries: dict[int, RankSummary],
                   heads: dict[int, _Head], as_of_ns: int | None) -> list[_Found]:
    """Each rank's oldest in-flight send/recv (or batch) against its peer's in-flight ops."""
    found: list[_Found] = []
    pairs_seen: set[tuple[int, int]] = set()
    for rank, group in sorted(progress.items()):
        ops = group.pending_p2p()
        if not ops:
            continue
        head = min(op.p2p_seq_id for op in ops)
        for op in (o for o in ops if o.p2p_seq_id == head):
            peer = _global_peer(op, members)
            if peer is None or peer == rank:
                continue
            match = None if peer in missing else _peer_match(op, summaries.get(peer), name)
            if match is not None and not _queued_behind(peer, match, heads, name):
                # Both ends posted. That is a hang only once the transfer outlived its timeout
                # (a link or GPU fault on either side); the pair is reported once.
                pair = (min(rank, peer), max(rank, peer))
                if pair in pairs_seen or _queued_behind(rank, op, heads, name):
                    continue
                ends = {rank: op, peer: match} if rank < peer else {peer: match, rank: op}
                overdue = _overdue(name, op.p2p_seq_id, op.signature.describe(), ends, as_of_ns, ())
                if overdue is not None:
                    pairs_seen.add(pair)
                    found.append((replace(overdue, is_p2p=True, detail=_overdue_pair_detail(
                        rank, op, peer, match, overdue)), []))
                continue
            if _queued_behind(rank, op, heads, name):
                # The rank is blocked in an earlier op (NCCL runs a rank's work in order on its
                # streams); that op's blockage says what it waits on. An edge from this later op
                # would let a victim of one fault point at another fault's chain and hide the
                # first fault's source from the condensation.
                continue
            verb = "send to" if op.kind is OpKind.SEND else "recv from"
            why = ("has no matching op in flight" if match is None else
                   "enqueued the matching op behind an earlier op that has not finished")
            found.append((Blockage(
                name, op.p2p_seq_id, BlockageKind.P2P, op.signature.describe(), (rank,), (peer,),
                is_p2p=True,
                detail=f"rank {rank} is blocked in {verb} rank {peer} (p2p_seq_id {op.p2p_seq_id}), "
                       f"and rank {peer} {why}"), [(rank, op)]))
    return found


def _overdue_pair_detail(rank: int, op: PendingOp, peer: int, match: PendingOp,
                         overdue: Blockage) -> str:
    both = (f"rank {rank}'s {op.kind.value} and rank {peer}'s matching {match.kind.value} "
            f"(p2p_seq_id {op.p2p_seq_id}) are both in flight past their timeout")
    if overdue.tie:
        return f"{both}; the dumps cannot say which end stopped the transfer"
    return (f"{both}; the kernel started on {ranks_phrase(overdue.waiting)} but never on "
            f"{ranks_phrase(overdue.targets)}")


def _global_peer(op: PendingOp, members: tuple[int, ...]) -> int | None:
    local = op.peer_local_rank
    if local is None or not 0 <= local < len(members):
        return None
    return members[local]


def _peer_match(op: PendingOp, peer: RankSummary | None, name: str) -> PendingOp | None:
    """The peer's oldest in-flight op that pairs with ``op`` (NCCL pairs them in order)."""
    group = peer.groups.get(name) if peer is not None else None
    if group is None:
        return None
    wanted = OpKind.RECV if op.kind is OpKind.SEND else OpKind.SEND
    matches = [o for o in group.pending_p2p() if o.kind is wanted and o.peer_local_rank == op.local_rank]
    return min(matches, key=lambda o: o.p2p_seq_id) if matches else None


def _behind_detail(behind: tuple[int, ...], absent: tuple[int, ...]) -> str:
    parts = []
    if behind:
        parts.append(f"{ranks_phrase(behind)} never enqueued it")
    if absent:
        parts.append(f"{ranks_phrase(absent)} left no usable, fresh dump")
    return "; ".join(parts)


def _mismatch_detail(by_signature: dict[OpSignature, list[int]], behind: tuple[int, ...] = (),
                     absent: tuple[int, ...] = ()) -> str:
    calls = "; ".join(f"{ranks_phrase(tuple(sorted(r)))} called {sig.describe()}"
                      for sig, r in sorted(by_signature.items(), key=lambda kv: -len(kv[1])))
    silent = _behind_detail(behind, absent)
    return f"{calls}; {silent}" if silent else calls

