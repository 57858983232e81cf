"""Groups destroyed and built again in the same processes: triage the newest incarnation.

c10d facts this rests on (torch 2.13, measured on Gloo in ``tests/fixtures/gloo_cases/restart_withheld``):
``destroy_process_group`` leaves the Flight Recorder ring alone; ``init_process_group`` /
``new_group`` after it build the group again under the same name (Python numbers groups from 0
again) but a new ``pg_id`` (a per-process backend counter that only goes up), and its sequence
ids restart at 1. In-process restart wrappers and torchft quorums do the same. So a ring can hold
two incarnations of one group, and their seq ids are unrelated: read as one, the old one's higher
ids hide the new one's stuck op. The summary already splits each rank's ring at the pg_id change
and keeps the newest incarnation (``GroupProgress.earlier_incarnations``); here the ranks are made
to agree on which incarnation that is, and the older ones are reported::

    rank 0: "0" pg_id 0 #1-8 (done), pg_id 1 #1-3 (done), #4 in flight    -> new: #4 in flight
    rank 1: "0" pg_id 0 #1-8 (done), pg_id 1 #1-3 (done)                  -> new: #3 done
    rank 3: "0" pg_id 0 #1-8 (done), all before rank 0's restart          -> new: nothing yet

A rank whose ring shows one incarnation is in the newest one unless every entry it holds of the
group predates every other rank's restart of it: ``init_process_group`` is a rendezvous, so no
rank runs an op of the new incarnation before every rank finished the old one. Then what it holds
is the old incarnation, and it has enqueued nothing in the new one (it had not got there, or its
dump predates the restart; the staleness checks decide which). Host clocks are compared there, so
a skew larger than the pause between the incarnations misreads it; the note says which ranks
were read this way.
"""

from __future__ import annotations

from denpex.analysis.summary import EarlierIncarnation, GroupProgress, RankSummary
from denpex.analysis.wording import ranks_phrase

__all__ = ["settle_incarnations"]


def settle_incarnations(summaries: dict[int, RankSummary]) -> tuple[dict[int, RankSummary], list[str]]:
    """The summaries with every group read in its newest incarnation, and notes on the older ones."""
    restarted: dict[str, list[int]] = {}
    for rank, summary in sorted(summaries.items()):
        for name, group in summary.groups.items():
            if group.earlier_incarnations:
                restarted.setdefault(name, []).append(rank)
    if not restarted:
        return summaries, []
    settled = dict(summaries)
    notes = []
    for name, ranks in sorted(restarted.items()):
        moments = [t for r in ranks if (t := summaries[r].groups[name].incarnation_started_ns) is not None]
        only_old = _holding_only_the_old(summaries, name, set(ranks), min(moments) if moments else None)
        for rank in only_old:
            summary = settled[rank]
            group = summary.groups[name]
            emptied = GroupProgress(name=name, desc=group.desc, pg_id_changed=True, earlier_incarnations=[
                EarlierIncarnation(pg_id=group.pg_id, last_enqueued=group.last_enqueued,
                                   last_completed=group.last_completed, entry_count=group.entry_count,
                                   abandoned=len(group.pending))])
            settled[rank] = summary.model_copy(update={"groups": {**summary.groups, name: emptied}})
        notes.append(_note(name, ranks, only_old, summaries))
    return settled, notes


def _holding_only_the_old(summaries: dict[int, RankSummary], name: str, restarted: set[int],
                          moment: int | None) -> list[int]:
    """Ranks whose entries of ``name`` all predate the earliest restart another rank shows."""
    if moment is None:
        return []
    found = []
    for rank, summary in sorted(summaries.items()):
        group = summary.groups.get(name)
        if rank in restarted or group is None or not group.entry_count:
            continue
        times = [op.time_created_ns for op in (group.last_op, *group.pending)
                 if op is not None and op.time_created_ns is not None]
        if times and max(times) < moment:
            found.append(rank)
    return found


def _note(name: str, ranks: list[int], only_old: list[int], summaries: dict[int, RankSummary]) -> str:
    first = summaries[ranks[0]].groups[name]
    older = first.earlier_incarnations[-1]
    upto = f"up to #{older.last_enqueued}" if older.last_enqueued >= 0 else "no collective"
    abandoned = sum(i.abandoned for r in ranks for i in summaries[r].groups[name].earlier_incarnations)
    text = (f"process group {name!r} was destroyed and built again in the same processes (an in-process "
            f"restart): the rings of {ranks_phrase(ranks)} hold {len(first.earlier_incarnations)} older "
            f"incarnation(s) (on rank {ranks[0]}: pg_id {older.pg_id}, {upto}) before the newest (pg_id "
            f"{first.pg_id}). Sequence ids restart with each incarnation, so only the newest is compared; "
            "the older ones are set aside")
    if abandoned:
        text += (f"; {abandoned} op(s) were still in flight in an older incarnation when it was destroyed "
                 "(the destroy abandoned them, so they say nothing about the newest)")
    if only_old:
        text += (f". {ranks_phrase(only_old)} hold only entries from before every other rank's restart: "
                 "they have enqueued nothing in the newest incarnation (read from host clocks)")
    return text
