"""How old a stuck op is, and when its age excuses it.

A dump taken mid-step shows healthy ops in flight; only an op that outlived a share of its
timeout, at the incident time or at its rank's dump time, is known to be stuck. Where nothing
dates it, a slow rank looks exactly like a hung one: the blockage stays, marked ``age_unknown``.
"""

from __future__ import annotations

from dataclasses import dataclass

from denpex.analysis.blockage import Blockage, BlockageKind
from denpex.analysis.compare.found import Found, RankOp
from denpex.analysis.summary import PendingOp

__all__ = [
    "AGE_MATTERS",
    "AGE_UNKNOWN_NOTE",
    "STUCK_SHARE_OF_TIMEOUT",
    "YOUNG_SHARE_OF_TIMEOUT",
    "Clock",
    "all_in_of_unknown_age",
    "is_overdue",
    "oldest",
    "young",
]

# Said once per comparison when some blockage could not be dated (the report shows it).
AGE_UNKNOWN_NOTE = ("how long the stuck op has waited is unknown: the dumps record no dump time and "
                    "no incident time was given, so a slow rank looks exactly like a hung one and "
                    "the confidence is lowered. Pass --as-of with the alert time.")


# A slow rank looks exactly like a hung one in these; a mismatch or an overdue op is a hang
# whatever its age.
AGE_MATTERS = frozenset({BlockageKind.BEHIND, BlockageKind.P2P, BlockageKind.UNKNOWN_MEMBERS,
                         BlockageKind.UNREACHED})
# An op that waited at least this share of its timeout is stuck, not slow (torch's NCCL watchdog
# and Denpex's HangDumper only dump past it: the dumper at 0.75 x timeout).
STUCK_SHARE_OF_TIMEOUT = 0.5


@dataclass(frozen=True, slots=True)
class Clock:
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

    def age_unknown(self, ops: list[RankOp]) -> bool:
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


def young(ops: list[RankOp], clock: Clock) -> str | None:
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


def oldest(ops: list[RankOp]) -> int | None:
    """When the earliest waiting op was enqueued (a blockage's ``enqueued_ns``), if any says."""
    times = [op.time_created_ns for _, op in ops if op.time_created_ns]
    return min(times) if times else None


def is_overdue(op: PendingOp, as_of_ns: int) -> bool:
    """Whether ``op`` outlived its whole timeout by ``as_of_ns``; an undated op never has."""
    if op.time_created_ns is None or op.timeout_ms is None:
        return False
    return op.time_created_ns + op.timeout_ms * 1_000_000 <= as_of_ns


def all_in_of_unknown_age(name: str, seq: int, op: str, ops: dict[int, PendingOp],
                          unknown: tuple[int, ...], clock: Clock) -> Found | None:
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
