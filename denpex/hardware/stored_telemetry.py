"""Telemetry stored beside an incident's dumps, split by whether it may support a drain.

The ingest service files telemetry under the incident and lists it in ``telemetry.json``::

    {"trusted": [{"name": "telemetry/trusted/gpu-node-002-ab12cd34ef56.log", "host": "gpu-node-002"}],
     "untrusted": ["telemetry/untrusted/0f1e2d3c4b5a.log"]}

Trusted files came from a node agent's key bound to ``host``; only their events *on that host*
may support isolation. Everything else (a job's key, or a node agent speaking about another
host) is shown in the report and never supports a drain: a job could otherwise claim an Xid on
any node.

What is only shown is summarized as it is read, never held event by event: one note per signal
kind and host with its count, its codes and its first and last time, for the
``MAX_SHOWN_GROUPS`` kinds and hosts with the most events, and one note for the rest. At most
``MAX_SHOWN_BYTES`` of it is read per incident (a note says how much was left unread): it can
change nothing in the verdict or the plan, so it may not cost more than a few seconds. Sixteen
parts of 2 MiB of repeated Xid lines from a job's key once made 288,001 notes (45 MiB of JSON,
51 s and 781 MB of triage); they make a handful now, whatever is sent.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from pydantic import BaseModel, ConfigDict, ValidationError

from denpex.evidence.errors import DumpError, EvidenceSourceError
from denpex.evidence.store import EvidenceStore
from denpex.hardware.errors import TelemetryFileError
from denpex.hardware.events import HardwareEvent, SignalKind, TelemetryParseResult
from denpex.hardware.telemetry import MAX_TELEMETRY_FILE_BYTES, parse_telemetry_lines

__all__ = ["TELEMETRY_INDEX", "MAX_SHOWN_GROUPS", "TrustedFile", "TelemetryIndex", "ShownGroup", "ShownTelemetry",
           "StoredTelemetry", "load_stored_telemetry", "untrusted_notes"]

TELEMETRY_INDEX = "telemetry.json"
MAX_SHOWN_GROUPS = 32
"""Kinds and hosts whose shown-only events get a note each (those with the most events); the rest share one."""
_GROUPS_HELD = 1024
"""Kinds and hosts counted one by one while reading; events of any further ones are counted together
(a host name is the sender's to choose: one per line must not grow the summary)."""
_CHUNK_LINES = 8192
"""Shown-only lines parsed at a time, so that a file's events are never all held at once (a multi-line
record cut at a chunk's edge is counted as a reject: these events are only shown)."""
_CODES_SHOWN = 5
MAX_SHOWN_BYTES = 4 << 20
"""Shown-only telemetry read per incident (about 36,000 kernel log lines)."""


class TrustedFile(BaseModel):
    """A telemetry file sent with a key bound to ``host``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    host: str


class TelemetryIndex(BaseModel):
    """``telemetry.json``."""

    model_config = ConfigDict(extra="forbid")

    trusted: list[TrustedFile] = []
    untrusted: list[str] = []


class ShownGroup(BaseModel):
    """The shown-only events of one signal kind on one host."""

    model_config = ConfigDict(frozen=True)

    kind: SignalKind
    host: str | None
    count: int
    codes: dict[int, int] = {}
    """Events per code (Xid, SXid...), for the kinds that have one."""
    first: datetime
    last: datetime


class ShownTelemetry(BaseModel):
    """Events shown in the report that never support isolation, summarized (module docstring)."""

    model_config = ConfigDict(frozen=True)

    groups: list[ShownGroup] = []
    """The kinds and hosts with the most events, most first, at most MAX_SHOWN_GROUPS."""
    other_events: int = 0
    other_groups: int = 0
    """Events, and kinds and hosts, beyond ``groups`` (or beyond what was counted one by one)."""
    other_groups_uncounted: bool = False
    """More kinds and hosts came than are counted one by one: ``other_groups`` is a lower bound."""
    unread_bytes: int = 0
    unread_files: int = 0
    """Shown-only telemetry past MAX_SHOWN_BYTES, not read (in bytes, and in files not read at all)."""

    @property
    def events(self) -> int:
        """Every shown-only event read."""
        return sum(g.count for g in self.groups) + self.other_events

    @property
    def noted(self) -> bool:
        """Whether anything is worth a note: events, or telemetry left unread."""
        return bool(self.events or self.unread_bytes)


class StoredTelemetry(BaseModel):
    """The incident's telemetry: what may support isolation, and what is only shown."""

    trusted: TelemetryParseResult
    shown: ShownTelemetry


def load_stored_telemetry(store: EvidenceStore, *, shown: bool = True,
                          max_shown_bytes: int = MAX_SHOWN_BYTES) -> StoredTelemetry | None:
    """Read ``telemetry.json`` and its files from ``store``; None when the incident has none.

    ``shown``: also read and summarize what may only be shown (the report's notes); the flow,
    which shows none of it, leaves it unread.
    """
    if not any(obj.name == TELEMETRY_INDEX for obj in store.list()):
        return None
    try:
        index = TelemetryIndex.model_validate(json.loads(store.read(TELEMETRY_INDEX, max_bytes=16 << 20)))
    except (DumpError, ValueError, ValidationError) as exc:
        raise TelemetryFileError(f"{store.uri}/{TELEMETRY_INDEX}: unreadable telemetry index ({exc})") from exc
    trusted = TelemetryParseResult()
    fold = _ShownFold()
    for item in index.trusted:
        parsed = parse_telemetry_lines(_read(store, item.name).decode("utf-8-sig", errors="replace").splitlines(),
                                       source=f"{store.uri}/{item.name}")
        if shown:
            fold.add(e for e in parsed.events if e.host != item.host)
        trusted = trusted.merged(parsed.model_copy(update={"events": [e for e in parsed.events if e.host == item.host]}))
    for name in index.untrusted if shown else []:
        budget = max_shown_bytes - fold.bytes_read
        if fold.spent:
            fold.unread_files += 1
            continue
        data = _read(store, name)
        # Whole lines only, within the budget; what is left is counted, never parsed, and the
        # files after it are not even read.
        taken = data if len(data) <= budget else data[:data.rfind(b"\n", 0, budget) + 1]
        fold.spent = len(taken) < len(data)
        fold.bytes_read += len(taken)
        fold.unread_bytes += len(data) - len(taken)
        lines = taken.decode("utf-8-sig", errors="replace").splitlines()
        del data, taken
        for start in range(0, len(lines), _CHUNK_LINES):
            fold.add(parse_telemetry_lines(lines[start:start + _CHUNK_LINES], source=f"{store.uri}/{name}").events)
    return StoredTelemetry(trusted=trusted, shown=fold.summary())


def untrusted_notes(shown: ShownTelemetry) -> list[str]:
    """The report's notes on what is shown and may not support isolation: one per kind and host
    (one event keeps its own sentence), and one for the rest.

    >>> from datetime import UTC
    >>> t = datetime(2026, 11, 29, 20, 28, 50, tzinfo=UTC)
    >>> untrusted_notes(ShownTelemetry(groups=[ShownGroup(kind=SignalKind.XID, host="gpu-node-003", count=3,
    ...                                                   codes={79: 2, 31: 1}, first=t, last=t)]))
    ["xid on gpu-node-003: 3 events (xid 79 x2, xid 31 x1) from 2026-11-29T20:28:50+00:00 to \
2026-11-29T20:28:50+00:00: reported with a key that is not that host's node-agent key, so they are shown \
here and never support isolation"]
    """
    notes = []
    for g in shown.groups:
        if g.count == 1:
            code = next(iter(g.codes), None)
            notes.append(f"{g.kind.value}{f' {code}' if code is not None else ''} on {g.host or 'an unknown host'} at "
                         f"{g.first.isoformat()}: reported with a job's key, not the host's node-agent key, so it is "
                         "shown here and never supports isolation")
            continue
        top = sorted(g.codes.items(), key=lambda kv: (-kv[1], kv[0]))
        codes = ", ".join(f"{g.kind.value} {code} x{n:,}" for code, n in top[:_CODES_SHOWN])
        codes += f", {len(top) - _CODES_SHOWN} more codes" if len(top) > _CODES_SHOWN else ""
        notes.append(f"{g.kind.value} on {g.host or 'an unknown host'}: {g.count:,} events"
                     f"{f' ({codes})' if codes else ''} from {g.first.isoformat()} to {g.last.isoformat()}: "
                     "reported with a key that is not that host's node-agent key, so they are shown here and never "
                     "support isolation")
    if shown.other_events:
        at_least = "at least " if shown.other_groups_uncounted else ""
        notes.append(f"{shown.other_events:,} more events on {at_least}{shown.other_groups:,} other kinds and hosts, "
                     "reported with keys that are not those hosts' node-agent keys: shown only, never supporting "
                     "isolation")
    if shown.unread_bytes or shown.unread_files:
        files = f" and {shown.unread_files:,} more files" if shown.unread_files else ""
        notes.append(f"{shown.unread_bytes:,} bytes{files} of telemetry from keys that are not the hosts' node-agent "
                     f"keys were not read: past the {MAX_SHOWN_BYTES >> 20} MiB shown per incident; they could never "
                     "support isolation")
    return notes


@dataclass
class _ShownFold:
    """Counts shown-only events as they are read, by kind and host (a bounded number of them)."""

    groups: dict[tuple[SignalKind, str | None], _Group] = field(default_factory=dict)
    overflow_events: int = 0
    overflow_groups: set[tuple[SignalKind, str | None]] = field(default_factory=set)
    uncounted: bool = False
    bytes_read: int = 0
    spent: bool = False
    unread_bytes: int = 0
    unread_files: int = 0

    def add(self, events: Iterable[HardwareEvent]) -> None:
        for event in events:
            key = (event.kind, event.host)
            group = self.groups.get(key)
            if group is None and len(self.groups) >= _GROUPS_HELD:
                self.overflow_events += 1
                if len(self.overflow_groups) < _GROUPS_HELD:  # counted, not listed: bounded too
                    self.overflow_groups.add(key)
                elif key not in self.overflow_groups:
                    self.uncounted = True
                continue
            if group is None:
                group = self.groups[key] = _Group(first=event.time, last=event.time)
            group.count += 1
            group.first, group.last = min(group.first, event.time), max(group.last, event.time)
            if event.code is not None:
                group.codes[event.code] += 1

    def summary(self) -> ShownTelemetry:
        ranked = sorted(self.groups.items(), key=lambda kv: (-kv[1].count, kv[0][0].value, kv[0][1] or ""))
        kept = [ShownGroup(kind=kind, host=host, count=g.count, codes=dict(g.codes), first=g.first, last=g.last)
                for (kind, host), g in ranked[:MAX_SHOWN_GROUPS]]
        rest = ranked[MAX_SHOWN_GROUPS:]
        return ShownTelemetry(groups=kept, other_events=sum(g.count for _, g in rest) + self.overflow_events,
                              other_groups=len(rest) + len(self.overflow_groups),
                              other_groups_uncounted=self.uncounted, unread_bytes=self.unread_bytes,
                              unread_files=self.unread_files)


@dataclass
class _Group:
    first: datetime
    last: datetime
    count: int = 0
    codes: Counter[int] = field(default_factory=Counter)


def _read(store: EvidenceStore, name: str) -> bytes:
    try:
        return store.read(name, max_bytes=MAX_TELEMETRY_FILE_BYTES)
    except (DumpError, EvidenceSourceError) as exc:
        raise TelemetryFileError(f"{store.uri}/{name}: cannot read stored telemetry ({exc})") from exc
