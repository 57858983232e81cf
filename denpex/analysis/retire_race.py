"""An op its peers retired is complete, when the evidence shows their retire was not a timeout.

Gloo's retire race (measured, ``tests/fixtures/gloo/healthy_retire_race`` and
``tests/fixtures/gloo_cases/overlap_retire_race``): the Gloo worker wakes the caller before it
marks the FR entry retired, so a dump taken a moment after a collective returned can read it
``retired=False`` on one member while the others read it retired. A collective that needs every
member (not a rooted op: ``GroupProgress.last_completed_by_all``) completes on a member only once
every member entered it, so a peer that retired it proves that this member entered it too.

But Gloo also retires an op that *failed*: in ``tests/fixtures/gloo/withheld_one_long`` rank 0's
dp all_reduce #3 timed out waiting for rank 2 and reads ``retired: True, state: scheduled`` with
no completion time, exactly like a completed one (Gloo records neither ``state`` nor
``time_discovered_*``; ``pg_status`` counts it completed too). So the retire alone proves
nothing. (Gloo only: NCCL reads each entry's state off its CUDA events when it dumps, and its
watchdog dumps timed-out work before retiring it, so a member's op NCCL did not complete while
its peers did is a GPU that stopped after they got their data, not a race.) What does: a Gloo collective fails only at its timeout (``timeout_ms`` after the call;
a peer's death makes it fail sooner, and that peer leaves no fresh dump), so the peer's retire
was a completion when

- the peer went on to complete a later collective of the group that needs every member, or
- this member entered the op well before the peer's op could have timed out (less than half its
  timeout after the peer did: the members joined together, so no peer gave up waiting for this
  one; half a timeout is the margin for host clocks), and nothing in the evidence reaches the
  peer's timeout: not its dump time, nor the incident time (``--as-of``, else the newest time in
  the evidence).

The one story this cannot exclude: every member joined together, the transport then stalled with
every process alive, every member timed out, and this member's own dump fell inside its own
retire race after the timeout. That needs a transport stall with no dead or stopped member and a
dump taken after the timeout with no dump time recorded; the note says the op was read as complete.

    group "0" = [0, 1, 2, 3]; ranks 0, 2, 3 retired #4 (created at t, t+0.5 ms, t+0.2 ms),
    rank 1 holds #4 (created at t+0.1 ms); timeout 5 s; newest evidence t+0.5 ms
    -> rank 1's #4 is complete: Gloo's retire race, not a hang
"""

from __future__ import annotations

from dataclasses import dataclass

from denpex.analysis.membership import GroupMembership
from denpex.analysis.summary import ROOTED_OPS, GroupProgress, OpKind, PendingOp, RankSummary
from denpex.analysis.wording import ranks_phrase

__all__ = ["JOINED_SHARE_OF_TIMEOUT", "RetireRace", "race_notes", "settle_retire_races"]

# Members that entered an op less than this share of its timeout apart joined it together.
JOINED_SHARE_OF_TIMEOUT = 0.5


@dataclass(frozen=True, slots=True)
class RetireRace:
    """One member's op that its peers' completion proves complete."""

    rank: int
    group: str
    seq: int
    op: str
    retired_by: tuple[int, ...]
    spread_ms: float


def settle_retire_races(summaries: dict[int, RankSummary], missing: set[int], membership: GroupMembership,
                        as_of_ns: int | None, dump_times: dict[int, int]
                        ) -> tuple[dict[int, RankSummary], list[RetireRace]]:
    """The summaries with every proven retire race read as complete, and the races found."""
    races: list[RetireRace] = []
    settled = dict(summaries)
    for name, members in membership.members.items():
        if missing.intersection(members):
            continue  # a silent member may be dead: its peers' ops may have failed sooner
        for rank in members:
            race = _race(rank, name, members, summaries, as_of_ns, dump_times)
            if race is None:
                continue
            races.append(race)
            summary = settled[rank]
            group = summary.groups[name]
            settled[rank] = summary.model_copy(update={"groups": {**summary.groups, name: _completed(group, race.seq)}})
    return settled, races


def race_notes(races: list[RetireRace]) -> list[str]:
    """One note per race: what was read as complete, and on what evidence."""
    return [f"rank {r.rank}'s collective #{r.seq} {r.op} in process group {r.group!r} reads retired=False, "
            f"but {ranks_phrase(r.retired_by)} retired it, and it needs every member: all had entered it, "
            f"within {r.spread_ms:.1f} ms of each other, and nothing in the evidence reaches its timeout, so "
            "their retire was a completion, not a timeout. Gloo wakes the caller before it marks the entry "
            "retired (the retire race): the op is read as complete" for r in races]


def _race(rank: int, name: str, members: tuple[int, ...], summaries: dict[int, RankSummary],
          as_of_ns: int | None, dump_times: dict[int, int]) -> RetireRace | None:
    summary = summaries.get(rank)
    group = summary.groups.get(name) if summary is not None else None
    op = group.oldest_pending_collective() if group is not None else None
    if (op is None or not op.signature.op.startswith("gloo:") or op.signature.op in ROOTED_OPS
            or op.time_created_ns is None):
        return None  # the race is Gloo's: NCCL's state is read off its events at dump time
    retired_by = []
    for peer in members:
        if peer == rank:
            continue
        theirs = summaries[peer].groups.get(name) if peer in summaries else None
        if theirs is None or theirs.last_completed_by_all < op.collective_seq_id:
            continue
        if not _completed_not_failed(op, theirs, as_of_ns, dump_times.get(peer)):
            return None
        retired_by.append(peer)
    if not retired_by:
        return None
    times = [op.time_created_ns] + [t for p in retired_by if (t := _created(summaries[p].groups[name], op.collective_seq_id))]
    return RetireRace(rank, name, op.collective_seq_id, op.signature.describe(), tuple(retired_by),
                      (max(times) - min(times)) / 1e6)


def _completed_not_failed(op: PendingOp, theirs: GroupProgress, as_of_ns: int | None,
                          dumped_ns: int | None) -> bool:
    """Whether the peer's retire of ``op``'s seq id is proven a completion (see the module doc)."""
    if theirs.last_completed_by_all > op.collective_seq_id:
        return True  # it completed a later all-member collective: this one did not fail
    last = theirs.last_op
    if (last is None or last.collective_seq_id != op.collective_seq_id or last.time_created_ns is None
            or not last.timeout_ms or op.time_created_ns is None):
        return False
    timeout_ns = last.timeout_ms * 1_000_000
    if op.time_created_ns - last.time_created_ns >= JOINED_SHARE_OF_TIMEOUT * timeout_ns:
        return False  # this member came late: the peer may have timed out before it entered
    reached = dumped_ns if dumped_ns is not None else as_of_ns
    return reached is not None and reached < last.time_created_ns + timeout_ns


def _created(group: GroupProgress, seq: int) -> int | None:
    last = group.last_op
    return last.time_created_ns if last is not None and last.collective_seq_id == seq else None


def _completed(group: GroupProgress, seq: int) -> GroupProgress:
    """``group`` with its collectives up to ``seq`` complete."""
    return group.model_copy(update={
        "last_completed": max(group.last_completed, seq),
        "last_completed_by_all": max(group.last_completed_by_all, seq),
        "pending": [p for p in group.pending if p.kind is not OpKind.COLLECTIVE or p.collective_seq_id > seq],
    })
