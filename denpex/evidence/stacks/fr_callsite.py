"""Where a rank called a collective, from its Flight Recorder entry's own ``frames``.

Pickle dumps record, per entry, the Python stack at the call (innermost first; JSON dumps carry
none)::

    {"process_group": ("1", "tp"), "collective_seq_id": 3, "thread_name": "python",
     "thread_id": "139642850589568", "profiling_name": "gloo:all_reduce",
     "frames": [{"name": "all_reduce", "filename": ".../torch/distributed/distributed_c10d.py",
                 "line": 3245},
                {"name": "wrapper", "filename": ".../torch/distributed/c10d_logger.py", "line": 83},
                {"name": "step", "filename": "/job/train.py", "line": 73}, ...]}

:func:`fr_callsite_stacks` finds the entry of one op in a decoded dump and returns its frames as a
:class:`RankStacks` with source ``fr-callsite``: one thread, the one that issued the op. It says
where the rank *entered* the op it waits in, not where it is now.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from denpex.evidence.dump_ref import DumpRef
from denpex.evidence.errors import EvidenceError
from denpex.evidence.fr_dump import decode_dump
from denpex.evidence.stacks.bounds import validated
from denpex.evidence.stacks.model import RankStacks, StackError, StackSource
from denpex.evidence.store import EvidenceStore, store_for

__all__ = ["FrCallsites", "entry_callsite", "fr_callsite_stacks", "read_fr_callsites"]


class FrCallsites(BaseModel):
    """The call sites read from some ranks' dumps, and why the others gave none."""

    model_config = ConfigDict(frozen=True)

    records: list[RankStacks] = Field(default_factory=list)
    missing: dict[int, str] = Field(default_factory=dict)
    """Rank -> why: no entry for the op (it never called it), a JSON dump (no frames), unreadable."""


def read_fr_callsites(refs: Iterable[DumpRef], *, group_name: str, seq_id: int, p2p: bool = False,
                      max_bytes: int, store: EvidenceStore | None = None) -> FrCallsites:
    """The call site of one op in each of ``refs``' dumps (a few ranks: the candidates and some
    peers; the triage's own pass keeps no frames, so these dumps are decoded once more, with the
    same safe decoder and budgets).

    A ref in ``store`` is read through it (its S3 client); any other is reopened from its URI.
    """
    records: list[RankStacks] = []
    missing: dict[int, str] = {}
    stores: dict[str, EvidenceStore] = {store.uri: store} if store is not None else {}
    for ref in refs:
        try:
            decoded = decode_dump(store_for(ref.store_uri, stores).read(ref.name, max_bytes=max_bytes), source=ref.name)
            stacks = fr_callsite_stacks(decoded.raw, rank=ref.rank, group_name=group_name, seq_id=seq_id, p2p=p2p)
        except EvidenceError as exc:  # DumpError, StackError
            missing[ref.rank] = f"{ref.name}: {exc}"
            continue
        if stacks is None:
            missing[ref.rank] = (f"{ref.name}: no entry of this op with frames (JSON dumps carry none; a rank "
                                 "that never called the op has no entry)")
        else:
            records.append(stacks)
    return FrCallsites(records=records, missing=missing)


def fr_callsite_stacks(raw_dump: Mapping[str, Any], *, rank: int, group_name: str, seq_id: int,
                       p2p: bool = False, taken_at: datetime | None = None) -> RankStacks | None:
    """The call site of the op ``seq_id`` of the group FR names ``group_name`` (its
    ``process_group[0]``), from the newest entry that has frames; None when the dump has none.

    ``seq_id`` is a ``collective_seq_id``, or a ``p2p_seq_id`` when ``p2p``.
    """
    entries = raw_dump.get("entries")
    if not isinstance(entries, Sequence):
        return None
    key = "p2p_seq_id" if p2p else "collective_seq_id"
    for entry in reversed(entries):
        if not isinstance(entry, Mapping) or entry.get(key) != seq_id or bool(entry.get("is_p2p")) != p2p:
            continue
        group = entry.get("process_group")
        if not isinstance(group, Sequence) or not group or group[0] != group_name:
            continue
        stacks = entry_callsite(entry, rank=rank, taken_at=taken_at)
        if stacks is not None:
            return stacks
    return None


def entry_callsite(entry: Mapping[str, Any], *, rank: int, taken_at: datetime | None = None) -> RankStacks | None:
    """One FR entry's ``frames`` as a one-thread :class:`RankStacks`; None without frames.

    Malformed frames (from a hostile dump) are a :class:`StackError`, never a crash.
    """
    frames = entry.get("frames")
    if not isinstance(frames, Sequence) or isinstance(frames, (str, bytes)) or not frames:
        return None
    shaped_frames = []
    for frame in frames:
        if not isinstance(frame, Mapping):
            raise StackError(f"rank {rank}: an FR entry's frame is a {type(frame).__name__}, not a mapping")
        shaped_frames.append({"file": frame.get("filename"), "line": frame.get("line"),
                              "function": frame.get("name")})
    thread_id = entry.get("thread_id")
    thread = {"name": entry.get("thread_name"), "frames": shaped_frames,
              "id": int(thread_id) if isinstance(thread_id, str) and thread_id.isascii()
              and thread_id.isdigit() and len(thread_id) <= 20 else None}
    return validated({"rank": rank, "source": StackSource.FR_CALLSITE.value, "taken_at": taken_at,
                      "threads": [thread]}, what=f"rank {rank}'s FR call site")
