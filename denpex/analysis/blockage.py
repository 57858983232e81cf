"""The wait-for graph's nodes: one op that some ranks wait in, and the ranks it waits on."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from denpex.analysis.models import StuckCollective

__all__ = ["Blockage", "BlockageKind"]


class BlockageKind(StrEnum):
    """Why a group's op did not complete.

    A closed set, compared by identity (``is``). The values are strings that equal the old plain
    constants, so anything that printed or compared a kind as text reads the same.
    """

    BEHIND = "behind"          # some members never enqueued it
    MISMATCH = "mismatch"      # members called different ops / sizes / dtypes at the same seq id
    P2P = "p2p"                # a send/recv whose peer has no matching op in flight
    OVERDUE = "overdue"        # everyone is in it, and it outlived its timeout
    UNKNOWN_MEMBERS = "unknown_members"  # every known member is in it: the others are unknown
    STOPPED = "stopped"        # everyone is in it; these members' CPUs stopped there, the others' went on
    LAGGING = "lagging"        # everyone is in it; this member is behind its peers in another group too
    UNREACHED = "unreached"    # these members enqueued a collective of the group the targets never reached


@dataclass(frozen=True, slots=True)
class Blockage:
    """One node of the wait-for graph: ``waiting`` ranks wait for ``targets`` in one op."""

    group: str
    seq: int
    kind: BlockageKind
    op: str
    waiting: tuple[int, ...]
    targets: tuple[int, ...]
    is_p2p: bool = False
    tie: bool = False
    detail: str = ""
    unknown: tuple[int, ...] = ()
    enqueued_ns: int | None = None
    # Targets that called something else than their peers (the rest of the targets never entered).
    mismatched: tuple[int, ...] = ()
    # The members that have not called yet (or left no evidence) decide who is out of step.
    undecided: bool = False
    # Nothing says how long the op has waited: it may be slow progress, not a hang.
    age_unknown: bool = False

    def as_stuck(self, desc: str | None) -> StuckCollective:
        return StuckCollective(
            process_group=self.group, group_desc=desc, collective_seq_id=self.seq, op=self.op,
            waiting_ranks=self.waiting, behind_ranks=self.targets, unknown_ranks=self.unknown,
            is_p2p=self.is_p2p, detail=self.detail,
            enqueued_at=datetime.fromtimestamp(self.enqueued_ns / 1e9, UTC) if self.enqueued_ns else None,
        )
