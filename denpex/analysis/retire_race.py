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

Cost: one pass over each group's members gathers who retired what (``_Retirers``), then each
member holding an op is judged against that in constant time (the retirers' list is shared):
linear in the group, where comparing every member with every other one took 30 s of one core for
a 4,096-rank Gloo world group (issue 29, section 6).

    group "0" = [0, 1, 2, 3]; ranks 0, 2, 3 retired #4 (created at t, t+0.5 ms, t+0.2 ms),
    rank 1 holds #4 (created at t+0.1 ms); timeout 5 s; newest evidence t+0.5 ms
    -> rank 1's #4 is complete: Gloo's retire race, not a hang
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

from denpex.analysis.membership import GroupMembership
from denpex.analysis.op_rules import ROOTED_OPS
from denpex.analysis.summary import GroupProgress, OpKind, PendingOp, RankSummary
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
    """The summaries with every proven retire race read as complete, and the races found.

    One pass over each group's members (``_Retirers``), then one look per member: linear in the
    group's size, not members x members (a 4,096-rank world group made that 30 s of one core).
    """
    races: list[RetireRace] = []
    settled = dict(summaries)
    for name, members in membership.members.items():
        if missing.intersection(members):
            continue  # a silent member may be dead: its peers' ops may have failed sooner
        candidates = [(rank, op) for rank in members if (op := _racing_op(summaries.get(rank), name)) is not None]
        if not candidates:
            continue
        retirers = _Retirers(name, members, summaries, as_of_ns, dump_times)
        for rank, op in candidates:
            race = retirers.race(rank, op)
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


def _racing_op(summary: RankSummary | None, name: str) -> PendingOp | None:
    """The member's op in the group that the race could explain: its oldest in flight, a Gloo
    collective that needs every member (the race is Gloo's: NCCL's state is read off its events
    at dump time), with a creation time."""
    group = summary.groups.get(name) if summary is not None else None
    op = group.oldest_pending_collective() if group is not None else None
    if (op is None or not op.signature.op.startswith("gloo:") or op.signature.op in ROOTED_OPS
            or op.time_created_ns is None):
        return None
    return op


class _Retirers:
    """What the members of one group that retired an op show, gathered in one pass.

    For a member holding ``#s``, its retirers are the other members whose ``last_completed_by_all``
    reaches ``s``. Those past ``s`` completed a later all-member collective: their retire was a
    completion. Those exactly at ``s`` prove it only if each one's own op ``#s`` is known, its
    timeout was not reached in the evidence, and this member entered ``#s`` less than half that
    timeout after it: kept per level as "all usable" and the earliest deadline for joining.
    """

    def __init__(self, name: str, members: tuple[int, ...], summaries: dict[int, RankSummary],
                 as_of_ns: int | None, dump_times: dict[int, int]) -> None:
        self.name = name
        self.by_level: dict[int, list[int]] = {}
        self.at: dict[int, _Level] = {}
        for peer in members:
            theirs = summaries[peer].groups.get(name) if peer in summaries else None
            if theirs is None:
                continue
            level = theirs.last_completed_by_all
            self.by_level.setdefault(level, []).append(peer)
            self.at.setdefault(level, _Level()).add(peer, theirs, as_of_ns, dump_times.get(peer))
        self.levels = sorted(self.by_level)
        # The members at or past each level, built once per level asked for (shared by the races).
        self._reached: dict[int, tuple[int, ...]] = {}

    def race(self, rank: int, op: PendingOp) -> RetireRace | None:
        seq, created = op.collective_seq_id, op.time_created_ns
        if created is None:
            return None
        exact = self.at.get(seq)
        if exact is not None and not exact.proves(rank, created):
            return None
        retired_by = self._reached_from(seq)
        if rank in retired_by:  # never in practice: it holds #s, so it completed less than that
            retired_by = tuple(p for p in retired_by if p != rank)
        if not retired_by:
            return None
        low = min(created, exact.first_created) if exact is not None and exact.first_created else created
        high = max(created, exact.last_created) if exact is not None and exact.last_created else created
        return RetireRace(rank, self.name, seq, op.signature.describe(), retired_by, (high - low) / 1e6)

    def _reached_from(self, seq: int) -> tuple[int, ...]:
        if seq not in self._reached:
            start = bisect_left(self.levels, seq)
            self._reached[seq] = tuple(sorted(p for level in self.levels[start:] for p in self.by_level[level]))
        return self._reached[seq]


@dataclass(slots=True)
class _Level:
    """The members whose ``last_completed_by_all`` is one value ``s``, and what their ``#s`` shows."""

    unusable: set[int] = field(default_factory=set)
    first_created: int | None = None
    last_created: int | None = None
    # The two earliest (created + half the timeout, rank): a member must have entered #s before
    # the earliest deadline among the *other* members, whoever asks.
    earliest: list[tuple[int, int]] = field(default_factory=list)

    def add(self, peer: int, theirs: GroupProgress, as_of_ns: int | None, dumped_ns: int | None) -> None:
        seq = theirs.last_completed_by_all
        last = theirs.last_op
        if (last is None or last.collective_seq_id != seq or last.time_created_ns is None
                or not last.timeout_ms):
            self.unusable.add(peer)
            return
        created, timeout_ns = last.time_created_ns, last.timeout_ms * 1_000_000
        self.first_created = created if self.first_created is None else min(self.first_created, created)
        self.last_created = created if self.last_created is None else max(self.last_created, created)
        reached = dumped_ns if dumped_ns is not None else as_of_ns
        if reached is None or reached >= created + timeout_ns:
            self.unusable.add(peer)  # the evidence reaches its timeout: the retire may be a failure
            return
        self.earliest = sorted([*self.earliest, (created + int(JOINED_SHARE_OF_TIMEOUT * timeout_ns), peer)])[:2]

    def proves(self, rank: int, created: int) -> bool:
        """Whether every other member at this level retired ``#s`` by completing it, for a member
        that entered ``#s`` at ``created`` (see the module doc)."""
        if len(self.unusable) - (rank in self.unusable) > 0:
            return False
        others = [deadline for deadline, p in self.earliest if p != rank]
        return not others or created < others[0]


def _completed(group: GroupProgress, seq: int) -> GroupProgress:
    """``group`` with its collectives up to ``seq`` complete."""
    return group.model_copy(update={
        "last_completed": max(group.last_completed, seq),
        "last_completed_by_all": max(group.last_completed_by_all, seq),
        "pending": [p for p in group.pending if p.kind is not OpKind.COLLECTIVE or p.collective_seq_id > seq],
    })
