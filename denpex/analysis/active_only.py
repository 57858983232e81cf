"""Dumps taken with ``onlyActive=True``: what the entries that were left out still say.

``_dump_fr_trace(..., onlyActive=True)`` (and collectors that ask for it) reads the ring as usual,
then leaves out every entry whose state reads ``completed`` (torch's ``getCollectiveTrace``:
``if (onlyActive && e.time_discovered_completed_.has_value()) continue;``). ``record_id`` is one
counter per process, contiguous in the ring, so an id missing *between* two ids a dump holds is an
entry that completed.

That matters for the members of a ``batch_isend_irecv`` batch: NCCL records each send and recv
without events (``scheduled``, never retired) and the batch's state on the ``nccl:coalesced`` entry
right after them (the next ``record_id``). When that closing entry completed, an ``onlyActive``
dump drops it and keeps the members, which then look in flight forever::

    record_id 41 nccl:send 0->1 (p2p_seq_id 7, scheduled)   kept: null events
    record_id 42 nccl:coalesced (p2p_seq_id 7, completed)   left out
    record_id 43 nccl:all_reduce #12 (scheduled)             kept
    -> the send at 41 belongs to a batch that completed: it is not in flight

In a dump of the whole ring the ids are contiguous, so nothing here changes it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["drop_closed_batch_members", "left_out_completed"]


def left_out_completed(entries: list[Any], saw_completed: bool) -> bool:
    """Whether the dump left its completed entries out (``onlyActive``): none of its entries is
    completed, and ``record_id`` skips ids between the ones it holds. ``saw_completed`` comes from
    the summary's one pass, so a dump of the whole ring (nearly always holding retired entries)
    costs nothing more here."""
    if saw_completed:
        return False
    ids: list[int] = [i for e in entries if type(e) is dict and type(i := e.get("record_id")) is int]
    return len(ids) >= 2 and max(ids) - min(ids) + 1 > len(set(ids))


def drop_closed_batch_members(pending: list[dict[str, Any]], entries: Iterable[Any]) -> list[dict[str, Any]]:
    """``pending`` without the p2p entries whose closing entry (the id right after the batch's
    last member) was left out of the dump while later entries were kept: their batch completed."""
    suspects = [p for p in pending if _unclosed_member(p)]
    if not suspects:
        return pending
    present: set[int] = set()
    newest = -1
    for e in entries:
        record_id = e.get("record_id") if type(e) is dict else None
        if type(record_id) is int:
            present.add(record_id)
            newest = max(newest, record_id)
    # A batch's members share one p2p_seq_id and consecutive ids; its closer follows the last one.
    last_of_batch: dict[tuple[object, object], int] = {}
    for p in suspects:
        key = (tuple(p.get("process_group") or ())[:1], p.get("p2p_seq_id"))
        last_of_batch[key] = max(last_of_batch.get(key, -1), p["record_id"])
    closed = {id(p) for p in suspects
              if (closer := last_of_batch[(tuple(p.get("process_group") or ())[:1], p.get("p2p_seq_id"))] + 1)
              not in present and closer < newest}
    return [p for p in pending if id(p) not in closed] if closed else pending


def _unclosed_member(e: dict[str, Any]) -> bool:
    """A send or recv recorded without events (a batch member): ``scheduled``, never discovered."""
    return (e.get("is_p2p") is True and not e.get("_in_batch") and e.get("state") == "scheduled"
            and not e.get("time_discovered_started_ns") and not e.get("time_discovered_completed_ns")
            and type(e.get("record_id")) is int)
