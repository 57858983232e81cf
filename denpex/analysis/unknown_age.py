"""No ``no_hang`` while an op is in flight and nothing says how long it has waited.

The README's rule for an unknown age: a slow op and a hung one look the same, so the verdict may
not say the job is fine. The comparison excuses a partly entered op as progress only when the
incident time or a dump time shows it young; but other paths (an op queued behind the rank's own
op, a p2p batch read as a queue) can still leave no blockage at all while ops are in flight.
Whatever the path, a ``no_hang`` stands only when every op still in flight has a known age or is
one that a peer of its group completed (for a collective every member must enter before it
completes anywhere, the op itself is then done: its rank had not retired it yet).

The default incident time (the newest time in the evidence) is not a known age: it is the time of
the very ops in question.
"""

from __future__ import annotations

from dataclasses import dataclass

from denpex.analysis.models import Verdict
from denpex.analysis.summary import OpKind, PendingOp, RankSummary
from denpex.analysis.wording import ranks_phrase

__all__ = ["InFlightOfUnknownAge", "in_flight", "in_flight_of_unknown_age", "predates_alert_note",
           "unknown_age_note"]


@dataclass(frozen=True, slots=True)
class InFlightOfUnknownAge:
    """One rank's op in flight whose age nothing records."""

    rank: int
    group: str
    op: PendingOp


def in_flight_of_unknown_age(summaries: dict[int, RankSummary], dump_times: dict[int, int], *,
                             as_of_given: bool) -> list[InFlightOfUnknownAge]:
    """Ops in flight (oldest per rank and group) of unknown age that no peer shows completed."""
    if as_of_given:
        return []
    return in_flight(summaries, skip=set(dump_times))


def in_flight(summaries: dict[int, RankSummary], *, skip: set[int] | frozenset[int] = frozenset()
              ) -> list[InFlightOfUnknownAge]:
    """Ops in flight (oldest per rank and group), whatever their age, that no peer shows completed;
    the ranks in ``skip`` are not looked at (their peers' completions still count)."""
    done_by_all = _completed_by_all(summaries)
    found = []
    for rank, summary in sorted(summaries.items()):
        if rank in skip:
            continue
        for name, group in sorted(summary.groups.items()):
            for op in group.pending:
                if op.kind is OpKind.COLLECTIVE and done_by_all.get(name, -1) >= op.collective_seq_id:
                    continue  # a peer completed it: every member had entered it, it is done
                found.append(InFlightOfUnknownAge(rank, name, op))
                break
    return found


def unknown_age_note(found: list[InFlightOfUnknownAge]) -> str:
    ranks = sorted({f.rank for f in found})
    first = found[0]
    return (f"{ranks_phrase(ranks)} {'has' if len(ranks) == 1 else 'have'} ops in flight (e.g. rank "
            f"{first.rank}'s {first.op.signature.describe()} in process group {first.group!r}) and "
            "nothing records how long they have waited (no dump time, no --as-of): a slow op and a "
            f"hung one look the same, so the verdict is {Verdict.INCOMPLETE.value}, not "
            f"{Verdict.NO_HANG.value}. Pass --as-of with the alert time, or dumps with their dump times")


def predates_alert_note(found: list[InFlightOfUnknownAge]) -> str:
    ranks = sorted({f.rank for f in found})
    first = found[0]
    return (f"an alert time was given (--as-of), which says an op reached its timeout, yet the ops in "
            f"flight on {ranks_phrase(ranks)} (e.g. rank {first.rank}'s {first.op.signature.describe()} "
            f"in process group {first.group!r}) were young at that time: the dumps predate the hang, or "
            f"the alert's time is wrong. The verdict is {Verdict.INCOMPLETE.value} "
            "(evidence_predates_alert), not no_hang: take the dumps again, or check the alert's time")


def _completed_by_all(summaries: dict[int, RankSummary]) -> dict[str, int]:
    """Per group, the newest all-member collective that some member completed."""
    done: dict[str, int] = {}
    for summary in summaries.values():
        for name, group in summary.groups.items():
            done[name] = max(done.get(name, -1), group.last_completed_by_all)
    return done
