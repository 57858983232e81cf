"""Deciding that a rank is stuck: how long each in-flight op has been seen, against its timeout."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from denpex.collector.flight_recorder import GroupProgress

__all__ = ["BlockedOp", "StallWatch", "stall_threshold"]


@dataclass(frozen=True, slots=True)
class BlockedOp:
    """An op seen in flight on consecutive polls, since ``first_seen`` (monotonic seconds)."""

    pg_id: str
    seq: int
    first_seen: float
    polls: int


class StallWatch:
    """Remembers since when each in-flight op has been seen, across polls of ``pg_status``.

    An op is identified by (rank-local ``pg_id``, sequence id). It is forgotten as soon as a poll
    no longer shows it in flight, so a job that keeps progressing never accumulates a stall.

    >>> watch = StallWatch()
    >>> watch.observe({"0": GroupProgress(3, 2)}, now=10.0)
    [BlockedOp(pg_id='0', seq=3, first_seen=10.0, polls=1)]
    >>> watch.observe({"0": GroupProgress(3, 2)}, now=11.0)
    [BlockedOp(pg_id='0', seq=3, first_seen=10.0, polls=2)]
    >>> watch.observe({"0": GroupProgress(4, 3)}, now=12.0)
    [BlockedOp(pg_id='0', seq=4, first_seen=12.0, polls=1)]
    """

    def __init__(self) -> None:
        self._seen: dict[tuple[str, int], BlockedOp] = {}

    def observe(self, progress: Mapping[str, GroupProgress], now: float) -> list[BlockedOp]:
        """Record one poll; return the ops in flight now, longest blocked first."""
        current: dict[tuple[str, int], BlockedOp] = {}
        for pg_id, counters in progress.items():
            seq = counters.in_flight
            if seq is None:
                continue
            before = self._seen.get((pg_id, seq))
            current[(pg_id, seq)] = (
                BlockedOp(pg_id, seq, now, 1) if before is None
                else BlockedOp(pg_id, seq, before.first_seen, before.polls + 1)
            )
        self._seen = current
        return sorted(current.values(), key=lambda op: (op.first_seen, op.pg_id))


def stall_threshold(fraction: float, configured: timedelta | None,
                    op_timeout_ms: int | None) -> timedelta | None:
    """How long an op may stay in flight before the rank dumps; None when no timeout is known.

    The shorter of the configured timeout and the op's own (FR ``timeout_ms``) wins, so that a
    group created with a shorter timeout still dumps before its collective raises.

    >>> stall_threshold(0.75, timedelta(seconds=8), 4000)
    datetime.timedelta(seconds=3)
    >>> stall_threshold(0.75, None, None) is None
    True
    """
    candidates = [t for t in (configured, timedelta(milliseconds=op_timeout_ms) if op_timeout_ms
                              else None) if t is not None]
    return fraction * min(candidates) if candidates else None
