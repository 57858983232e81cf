"""When a rank that dumped has moved on, so that its dump no longer says where it is.

A rank dumps once per incident. If the job then recovers (a stopped rank is continued), a flow
waiting for approval must see it, so the rank dumps once more (trigger ``recovered``). What
"moved on" means depends on what the rank was doing at its dump:

- it had ops in flight (it was blocked): every one of them completed (then confirmed, below);
- it had nothing in flight and answered another rank's request: it was between collectives,
  perhaps *behind* the others (not yet in the collective they wait in); it moved on once it
  completes any collective it had not enqueued at the dump (then confirmed, below). A stopped rank that is continued
  shows this: its watchdog thread may answer the pending request before the main thread
  re-enters the collective, and that dump alone would call it "behind" forever;
- it had nothing in flight and dumped for another reason (a manual dump at the end of a healthy
  run): nothing to wait for, no second dump.

A collective that completed is not yet a recovery: Gloo counts a collective that ended in an
error as completed. When its timeout fires, or a peer's death closes the connection (the op raises
before its deadline), ``pg_status.last_completed_collective`` reaches its sequence id and its entry
is ``retired``, exactly as for a success (both seen with torch 2.13 on 2 Gloo ranks, one absent),
and FR entries carry no error. So the completions the watch waited for only arm a confirmation
(``confirm_by_next``): the rank dumps again once it completes an op enqueued after that, in any
group, before that op's own deadline (FR ``time_created_ns`` + ``timeout_ms``, read when the
completion is seen). An op seen complete at or past its deadline, or whose deadline the ring does
not give, may have ended by its timeout: the confirmation waits for a newer one again.

What this cannot tell: a job that catches the error and runs another collective (a retry or an
error-path barrier; on Gloo an op on a group whose connection closed fails at once, and counts as
completed in time) looks recovered, and any dump taken after a failed Gloo op shows it completed.
A body run under ``with HangDumper(...)`` that returns cleanly while the confirmation is armed
(the stuck op was the job's last collective) is a recovery.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from denpex.collector.flight_recorder import GroupProgress

__all__ = ["MovedPast"]

# FR sequence ids start at 1: a group created after the dump has completed nothing at 0.
_NOTHING_YET = 0


@dataclass(frozen=True, slots=True)
class MovedPast:
    """What a rank must complete after its dump before it dumps again (rank-local ``pg_id`` keys)."""

    in_flight: Mapping[str, int] = field(default_factory=dict)
    """The op each group had in flight at the dump: all of them must complete."""
    enqueued: Mapping[str, int] = field(default_factory=dict)
    """With nothing in flight (or while confirming): each group's last enqueued op; completing any
    later one, or any op of a group created since, is enough."""
    confirming: bool = False
    """Whether the ops watched for are the confirmation (``confirm_by_next``): a completion in time
    then shows the rank moved on; before it, a completion only arms the confirmation."""

    @classmethod
    def at_dump(cls, progress: Mapping[str, GroupProgress], *, answered_request: bool) -> MovedPast | None:
        """What to watch for after a dump taken at ``progress``; None when no second dump is due."""
        in_flight = {pg: p.in_flight for pg, p in progress.items() if p.in_flight is not None}
        if in_flight:
            return cls(in_flight=in_flight)
        if answered_request:
            return cls(enqueued={pg: p.last_enqueued for pg, p in progress.items()})
        return None

    def completed(self, progress: Mapping[str, GroupProgress]) -> dict[str, int]:
        """The ops completed since the dump (since the arming, while confirming) that this watch
        waits for; empty while there are none."""
        if self.in_flight:
            done = all(pg in progress and progress[pg].last_completed >= seq for pg, seq in self.in_flight.items())
            return dict(self.in_flight) if done else {}
        return {pg: p.last_completed for pg, p in progress.items()
                if p.last_completed > self.enqueued.get(pg, _NOTHING_YET)}

    @staticmethod
    def confirm_by_next(progress: Mapping[str, GroupProgress]) -> MovedPast:
        """The watch once the ops it waited for completed, perhaps by an error or a timeout: an op
        enqueued after ``progress`` completed, in any group (the stuck one may be used rarely: a
        checkpoint group, a pipeline's p2p)."""
        return MovedPast(enqueued={pg: p.last_enqueued for pg, p in progress.items()}, confirming=True)
