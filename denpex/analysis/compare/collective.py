"""The rules that judge a group's stuck collective: the lowest seq id some member holds.

``locate`` finds the op and where each member stands in it; the :data:`StuckRule` functions
below judge it, tried in the order ``RULES`` lists them (the first blockage found decides);
``retired_by_gloo_peers`` and ``defer_unready`` then weigh what was decided::

    group "1" = [0, 1, 2, 3]; last enqueued 17,17,16,17; last completed 16,16,16,16
    -> stuck at #17; ranks 0,1,3 wait; rank 2 is behind          (rule: behind_or_absent)
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from denpex.analysis.blockage import Blockage, BlockageKind
from denpex.analysis.compare.age import all_in_of_unknown_age, is_overdue
from denpex.analysis.compare.agreement import AgreementKey, agreement_key
from denpex.analysis.compare.context import Findings, GroupFacts, StuckOp
from denpex.analysis.compare.found import Found
from denpex.analysis.compare.heads import queued_behind
from denpex.analysis.summary import GroupProgress, OpKind, OpSignature, OpState, PendingOp
from denpex.analysis.wording import ranks_phrase

__all__ = [
    "all_in",
    "behind_or_absent",
    "behind_detail",
    "defer_unready",
    "locate",
    "mismatch",
    "op_at",
    "overdue_blockage",
    "overdue_started",
    "overdue_tie",
    "queued_on_some",
    "retired_by_gloo_peers",
    "wrapped_unknown",
]


def locate(group: GroupFacts, findings: Findings) -> None:
    """The group's stuck collective and where each member stands in it; none when nothing is held."""
    progress = group.progress
    last_enqueued = max(p.last_enqueued for p in progress.values())
    floor = min(p.last_enqueued for p in progress.values())
    if any(p.last_completed > floor for p in progress.values()):
        # A collective cannot finish unless every member enqueued it. A peer that shows it
        # finished anyway was blocked in it until it failed (Gloo may retire a failed op).
        seq, failed = floor + 1, True
    else:
        seq, failed = min(p.last_completed for p in progress.values()) + 1, False
    if last_enqueued < 0 or seq > last_enqueued:
        return
    waiting_ops = holding(progress, seq, failed)
    if not waiting_ops:
        # Nobody holds ``seq``: sequence ids start at 1 (nothing completed yet gives seq 0), or
        # the laggard is several ops behind. The stuck op is the lowest one a member holds.
        seq = lowest_held(progress, seq, failed)
        waiting_ops = holding(progress, seq, failed)
        if not waiting_ops:
            return
    op_text = next(iter(waiting_ops.values())).signature.describe()
    findings.stuck_op = StuckOp(
        seq=seq, failed=failed, waiting_ops=waiting_ops,
        ready={r: o for r, o in waiting_ops.items() if not queued_behind(r, o, group.heads, group.name)},
        behind=tuple(r for r, p in sorted(progress.items()) if p.last_enqueued < seq),
        absent=tuple(r for r in group.members if r in group.missing),
        op_text=op_text,
        overdue=overdue_blockage(group.name, seq, op_text, waiting_ops, group.clock.as_of_ns, group.unknown))


def mismatch(group: GroupFacts, stuck: StuckOp) -> Found | None:
    """Members called different ops at ``#seq``: a hang whatever the order, but only ready ranks
    wait in it now (the others wait wherever their oldest op is)."""
    found = mismatch_blockage(group.name, stuck.seq, stuck.waiting_ops, stuck.behind, stuck.absent, group.unknown)
    if found is None:
        return None
    stripped = tuple(r for r in found.waiting if r in stuck.ready)
    if not found.tie and stripped:
        found = replace(found, waiting=stripped)
    return found, stuck.ready_ops or list(stuck.waiting_ops.items())


def behind_or_absent(group: GroupFacts, stuck: StuckOp) -> Found | None:
    """Some members never enqueued the op, or left no usable, fresh dump: they are the targets."""
    if not (stuck.behind or stuck.absent):
        return None
    return Blockage(group.name, stuck.seq, BlockageKind.BEHIND, stuck.op_text, tuple(stuck.ready),
                    stuck.behind + stuck.absent, detail=behind_detail(stuck.behind, stuck.absent),
                    unknown=group.unknown), stuck.ready_ops


def queued_on_some(group: GroupFacts, stuck: StuckOp) -> Found | None:
    """Everyone enqueued it, but on some ranks it sits behind an op that is itself stuck."""
    late = tuple(r for r in stuck.waiting_ops if r not in stuck.ready)
    if not (late and stuck.ready):
        return None
    return Blockage(group.name, stuck.seq, BlockageKind.BEHIND, stuck.op_text, tuple(stuck.ready), late,
                    unknown=group.unknown,
                    detail=f"{ranks_phrase(late)} enqueued it behind an earlier op that has "
                           "not finished"), stuck.ready_ops


def overdue_started(group: GroupFacts, stuck: StuckOp) -> Found | None:
    """Past its timeout, its kernel started on some ranks only: those where it never did are
    singled out whatever the wrapped members did (their GPU never ran it though their stream
    was free to)."""
    overdue = stuck.overdue
    if overdue is None or overdue.tie:
        return None
    unknown = group.unknown
    wrapped = (f"; {ranks_phrase(unknown)} left no entry of the group in "
               f"{'its wrapped ring' if len(unknown) == 1 else 'their wrapped rings'}") if unknown else ""
    return replace(overdue, unknown=unknown, detail=overdue.detail + wrapped), []


def wrapped_unknown(group: GroupFacts, stuck: StuckOp) -> Found | None:
    """Every member whose progress is known is in it, and the op completes once all members
    entered: the members whose rings wrapped past the group hold the answer. Each never entered
    it, or entered it (NCCL enqueues asynchronously) and ran enough ops in other groups since
    that its ring no longer shows it; nothing here says which."""
    unknown = group.unknown
    if not unknown:
        return None
    their = "its wrapped ring" if len(unknown) == 1 else "their wrapped rings"
    return Blockage(group.name, stuck.seq, BlockageKind.BEHIND, stuck.op_text, tuple(stuck.ready), unknown,
                    unknown=unknown, undecided=True,
                    detail=f"every member whose dump shows the group entered it; "
                           f"{ranks_phrase(unknown)} left no entry of the group in {their} and "
                           f"no usable pg_status: {'it' if len(unknown) == 1 else 'each'} never "
                           "entered it, or entered it and its ring has wrapped since"), stuck.ready_ops


def overdue_tie(group: GroupFacts, stuck: StuckOp) -> Found | None:
    """Everyone entered it and it outlived its timeout: a tie. An overdue op is old by
    definition, so no dump-time test may excuse it (no ops to date it)."""
    return None if stuck.overdue is None else (stuck.overdue, [])


def all_in(group: GroupFacts, stuck: StuckOp) -> Found | None:
    """Everyone entered and nothing says it is overdue: its age decides (``age.all_in_of_unknown_age``)."""
    return all_in_of_unknown_age(group.name, stuck.seq, stuck.op_text, stuck.waiting_ops, group.unknown,
                                 group.clock)


def retired_by_gloo_peers(group: GroupFacts, findings: Findings) -> None:
    """An all-in Gloo tie that some members retired is undecided.

    Gloo peers retired it and the retire race was not proven (denpex.analysis.retire_race):
    Gloo retires an op that timed out too, so neither "none finished" nor a culprit is known.
    NCCL records a real completion (its watchdog dumps timed-out work before retiring it), and a
    member's GPU can stop after its peers got their data: that stays a lead.
    """
    stuck, found = findings.stuck_op, findings.stuck
    if stuck is None or found is None:
        return
    retired = tuple(r for r, p in sorted(group.progress.items()) if p.last_completed >= stuck.seq)
    if (retired and not stuck.failed and found[0].kind is BlockageKind.OVERDUE and found[0].tie
            and all(o.signature.op.startswith("gloo:") for o in stuck.waiting_ops.values())):
        findings.stuck = (replace(found[0], undecided=True, detail=(
            f"{ranks_phrase(retired)} retired it, which Gloo does when the op completes and also when "
            "it times out; the evidence does not show which (the holders entered it late, or the "
            "evidence reaches its timeout)")), found[1])


def defer_unready(group: GroupFacts, findings: Findings) -> None:
    """An op every holder enqueued behind an earlier op of its own is deferred.

    It is not what any of them is blocked in (NCCL runs a rank's work in order): it is reported
    only when nothing else is stuck (``compare_groups``). Edges from it would let mere enqueue
    order break ties elsewhere. A mismatch stays: it is a hang whatever the order.
    """
    stuck, found = findings.stuck_op, findings.stuck
    if stuck is None or found is None or stuck.ready or found[0].kind is BlockageKind.MISMATCH:
        return
    # Judged young or old on every holder's op: none is ready, but they are all it has.
    findings.deferred.append((replace(found[0], waiting=tuple(stuck.waiting_ops)) if not found[0].waiting
                              else found[0], found[1] or list(stuck.waiting_ops.items())))
    findings.stuck = None


def holding(progress: dict[int, GroupProgress], seq: int, failed: bool) -> dict[int, PendingOp]:
    """Members that enqueued ``seq`` and did not finish it, with their op there."""
    return {r: op for r, p in sorted(progress.items())
            if p.last_enqueued >= seq and (failed or p.last_completed < seq)
            and (op := op_at(p, seq)) is not None}


def lowest_held(progress: dict[int, GroupProgress], seq: int, failed: bool) -> int:
    """The lowest collective at or after ``seq`` that some member has in flight (or, after a
    failure, as its newest op); ``seq`` itself when there is none."""
    held = [op.collective_seq_id for p in progress.values() for op in p.pending
            if op.kind is OpKind.COLLECTIVE and op.collective_seq_id >= seq]
    if failed:
        held += [p.last_op.collective_seq_id for p in progress.values()
                 if p.last_op is not None and p.last_op.collective_seq_id >= seq]
    return min(held, default=seq)


def op_at(progress: GroupProgress, seq: int) -> PendingOp | None:
    """The rank's op at ``seq``: in flight, or (after a failure) its newest, retired one."""
    for op in progress.pending:
        if op.kind is OpKind.COLLECTIVE and op.collective_seq_id == seq:
            return op
    last = progress.last_op
    return last if last is not None and last.collective_seq_id == seq else None


def mismatch_blockage(name: str, seq: int, ops: dict[int, PendingOp], behind: tuple[int, ...],
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
    detail = mismatch_detail({signature_of[k]: r for k, r in by_key.items()}, behind, absent)
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


def overdue_blockage(name: str, seq: int, op: str, ops: dict[int, PendingOp], as_of_ns: int | None,
                     unknown: tuple[int, ...]) -> Blockage | None:
    """Everyone entered the same op. That is a hang only once it outlived its timeout.

    A dump taken while a healthy job runs, or Gloo's retire race, shows such an op in flight;
    calling a hang on it would blame healthy ranks.
    """
    if as_of_ns is None or not any(is_overdue(op_, as_of_ns) for op_ in ops.values()):
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


def behind_detail(behind: tuple[int, ...], absent: tuple[int, ...]) -> str:
    """Why members are targets of the op: they never enqueued it, or left no dump to say."""
    parts = []
    if behind:
        parts.append(f"{ranks_phrase(behind)} never enqueued it")
    if absent:
        parts.append(f"{ranks_phrase(absent)} left no usable, fresh dump")
    return "; ".join(parts)


def mismatch_detail(by_signature: dict[OpSignature, list[int]], behind: tuple[int, ...] = (),
                    absent: tuple[int, ...] = ()) -> str:
    """Who called what, largest party first, then who did not call at all."""
    calls = "; ".join(f"{ranks_phrase(tuple(sorted(r)))} called {sig.describe()}"
                      for sig, r in sorted(by_signature.items(), key=lambda kv: -len(kv[1])))
    silent = behind_detail(behind, absent)
    return f"{calls}; {silent}" if silent else calls
