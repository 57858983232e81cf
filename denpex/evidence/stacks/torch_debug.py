"""torch's debug server's periodic ``stacks_<time>.txt`` files, read as per-rank stack evidence.

``torch.distributed.debug.start_debug_server(dump_dir=...)`` (torch 2.13) makes rank 0 fetch every
rank's ``dump_traceback`` (faulthandler's text) and write them to one file, one section per rank::

    PARTIAL DATA: 3/4 workers responded          <- only when some rank did not answer
      Rank 2: <why>
    === Rank 0: http://node-1:49949/handler/dump_traceback? ===
    Current thread 0x00007f6572ffd6c0 (most recent call first):
      <no Python frame>

    Thread 0x00007f65a2fd0b80 (most recent call first):
      File ".../torch/distributed/distributed_c10d.py", line 3252 in all_reduce
      File "/job/train.py", line 10 in step
      File "/job/train.py", line 23 in <module>

    === Rank 2: http://node-2:43529/handler/dump_traceback? ===
    Error: 500

The file name carries rank 0's local time (``time.strftime("%Y%m%d_%H%M%S")``). faulthandler
names no threads: the one whose outermost frame runs the script (``<module>``, or runpy's entry
for ``python -m``) is named ``MainThread``, and the ``Current thread`` is the one that served the
request (never the training). The whole file is bounded in bytes, each section by the per-rank
limit, and its threads and frames by the model's.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, tzinfo
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from denpex.evidence.errors import EvidenceError
from denpex.evidence.stacks.bounds import validated
from denpex.evidence.stacks.model import (
    MAX_BYTES,
    MAX_NOTES,
    RankStacks,
    StackError,
    StackSource,
    Unavailable,
    clean_text,
)
from denpex.evidence.store import EvidenceStore, open_store

__all__ = ["DEBUG_FILE_MAX_BYTES", "DebugStacks", "DebugStacksFile", "debug_stacks_files",
           "is_debug_stacks_name", "nearest_debug_stacks", "parse_debug_stacks", "read_debug_stacks"]

DEBUG_FILE_MAX_BYTES = 128 << 20
"""A whole file: 4,096 ranks of 30 KiB deep stacks each."""

_NAME = re.compile(r"stacks_(\d{8}_\d{6})\.txt")
_RANK = re.compile(r"=== Rank (\d{1,8}): (.{0,2000}) ===")
_THREAD = re.compile(r"(Current thread|Thread) (0x[0-9a-fA-F]{1,16}) \(most recent call first\):")
_FRAME = re.compile(r'  File "(.*)", line (\d{1,9}) in (.*)')
_FAILED = re.compile(r"  Rank (\d{1,8}): (.*)")
_ERROR = re.compile(r"Error: (.*)")
_ENTRY_FUNCTIONS = {"<module>", "_run_module_as_main"}


class DebugStacksFile(BaseModel):
    """One ``stacks_<time>.txt`` in a folder or store, and the time its name gives."""

    model_config = ConfigDict(frozen=True)

    name: str
    size: int
    taken_at: datetime


class DebugStacks(BaseModel):
    """Every rank's section of one file; ranks whose worker failed carry ``unavailable``."""

    model_config = ConfigDict(frozen=True)

    taken_at: datetime | None
    ranks: dict[int, RankStacks]
    notes: list[str] = Field(default_factory=list, max_length=MAX_NOTES)


def is_debug_stacks_name(name: str) -> bool:
    """``stacks_20261202_190811.txt``: a debug-server stacks file (stack evidence, not a dump)."""
    return _NAME.fullmatch(name) is not None


def debug_stacks_files(location: EvidenceStore | Path, *, tz: tzinfo = UTC) -> list[DebugStacksFile]:
    """The debug server's stacks files directly in ``location`` (a folder or store), oldest first.

    ``tz`` is the time zone of rank 0's host (the name holds its local time; clusters run UTC).
    A location that cannot be listed has none.
    """
    store = location if not isinstance(location, Path) else open_store(location)
    try:
        objects = store.list()
    except EvidenceError:
        return []
    found = []
    for obj in objects:
        taken_at = debug_stacks_time(obj.name, tz=tz)
        if taken_at is not None:
            found.append(DebugStacksFile(name=obj.name, size=obj.size, taken_at=taken_at))
    return sorted(found, key=lambda f: (f.taken_at, f.name))


def debug_stacks_time(name: str, *, tz: tzinfo = UTC) -> datetime | None:
    """``stacks_20261202_190811.txt`` -> 2026-12-02 19:08:11 in ``tz``; None for other names."""
    match = _NAME.fullmatch(name)
    if match is None:
        return None
    try:
        return datetime.strptime(match.group(1), "%Y%m%d_%H%M%S").replace(tzinfo=tz)
    except ValueError:
        return None


def nearest_debug_stacks(files: list[DebugStacksFile], at: datetime,
                         max_gap: timedelta = timedelta(minutes=5)) -> DebugStacksFile | None:
    """The file taken nearest to ``at`` (the dump time), if one is within ``max_gap``.

    The server dumps every ``dump_interval`` (60 s by default): a hung rank stays where it is,
    so the nearest file on either side of the dump shows it; one much older may predate the hang.
    """
    best = min(files, key=lambda f: abs(f.taken_at - at), default=None)
    return best if best is not None and abs(best.taken_at - at) <= max_gap else None


def read_debug_stacks(location: EvidenceStore | Path, file: DebugStacksFile) -> DebugStacks:
    """:func:`parse_debug_stacks` of ``file`` in ``location``, never reading past the limit."""
    if file.size > DEBUG_FILE_MAX_BYTES:
        raise StackError(f"{file.name} is {file.size:,} bytes, over the limit of {DEBUG_FILE_MAX_BYTES:,}: refused")
    store = location if not isinstance(location, Path) else open_store(location)
    try:
        data = store.read(file.name, max_bytes=DEBUG_FILE_MAX_BYTES)
    except EvidenceError as exc:
        raise StackError(f"{file.name}: cannot be read ({exc})") from exc
    return parse_debug_stacks(data, taken_at=file.taken_at, what=file.name)


def parse_debug_stacks(data: bytes, *, taken_at: datetime | None = None,
                       what: str = "debug server stacks") -> DebugStacks:
    """Every ``=== Rank i ===`` section of ``data`` as a :class:`RankStacks` (source ``torch-debug``)."""
    if len(data) > DEBUG_FILE_MAX_BYTES:
        raise StackError(f"{what} is {len(data):,} bytes, over the limit of {DEBUG_FILE_MAX_BYTES:,}: refused")
    text = data.decode("utf-8", errors="replace")
    lines = text.split("\n")
    failures: dict[int, str] = {}
    sections: list[tuple[int, list[str]]] = []
    current: list[str] | None = None
    notes: list[str] = []
    for line in lines:
        rank_match = _RANK.fullmatch(line)
        if rank_match:
            current = []
            sections.append((int(rank_match.group(1)), current))
        elif current is not None:
            current.append(line)
        elif (failed := _FAILED.fullmatch(line)) is not None:
            failures[int(failed.group(1))] = failed.group(2)
    if not sections:
        raise StackError(f"{what} has no '=== Rank i: ... ===' section: not a debug server stacks file")
    ranks: dict[int, RankStacks] = {}
    for rank, body in sections:
        if rank in ranks:
            _note(notes, f"rank {rank} has more than one section: the first is kept")
            continue
        try:
            ranks[rank] = _section(rank, body, taken_at, failures.get(rank))
        except StackError as exc:
            _note(notes, f"rank {rank}: {exc}")
    return DebugStacks(taken_at=taken_at, ranks=dict(sorted(ranks.items())), notes=notes)


def _note(notes: list[str], text: str) -> None:
    if len(notes) < MAX_NOTES:
        notes.append(clean_text(text))


def _section(rank: int, body: list[str], taken_at: datetime | None, failure: str | None) -> RankStacks:
    what = f"rank {rank}'s section"
    size = sum(len(line) + 1 for line in body)
    if size > MAX_BYTES:
        raise StackError(f"{what} is {size:,} characters, over the limit of {MAX_BYTES:,}: refused")
    base: dict[str, Any] = {"rank": rank, "source": StackSource.TORCH_DEBUG.value, "taken_at": taken_at}
    error = next((m.group(1) for line in body if (m := _ERROR.fullmatch(line))), None)
    if error is not None:
        detail = f"the debug server could not fetch this rank: {failure or error}"
        return validated({**base, "unavailable": Unavailable.WORKER_UNREACHABLE.value, "detail": detail},
                         what=what)
    threads: list[dict[str, Any]] = []
    unread = 0
    for line in body:
        if (head := _THREAD.fullmatch(line)) is not None:
            threads.append({"id": int(head.group(2), 16), "frames": [],
                            "current": head.group(1) == "Current thread"})
        elif (frame := _FRAME.fullmatch(line)) is not None and threads:
            threads[-1]["frames"].append({"file": frame.group(1), "line": int(frame.group(2)),
                                          "function": frame.group(3)})
        elif line.strip() not in ("", "<no Python frame>", "..."):
            unread += 1
    for thread in threads:
        current = thread.pop("current")
        frames = thread["frames"]
        if not current and frames and frames[-1]["function"] in _ENTRY_FUNCTIONS:
            thread["name"] = "MainThread"
    notes = [f"{unread} line(s) that are not faulthandler's were skipped"] if unread else []
    return validated({**base, "threads": threads}, what=what, notes=notes)
