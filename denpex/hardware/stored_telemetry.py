"""Telemetry stored beside an incident's dumps, split by whether it may support a drain.

The ingest service files telemetry under the incident and lists it in ``telemetry.json``::

    {"trusted": [{"name": "telemetry/trusted/gpu-node-002-ab12cd34ef56.log", "host": "gpu-node-002"}],
     "untrusted": ["telemetry/untrusted/0f1e2d3c4b5a.log"]}

Trusted files came from a node agent's key bound to ``host``; only their events *on that host*
may support isolation. Everything else (a job's key, or a node agent speaking about another
host) is shown in the report and never supports a drain: a job could otherwise claim an Xid on
any node.
"""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, ValidationError

from denpex.evidence.errors import DumpError, EvidenceSourceError
from denpex.evidence.store import EvidenceStore
from denpex.hardware.errors import TelemetryFileError
from denpex.hardware.events import HardwareEvent, TelemetryParseResult
from denpex.hardware.telemetry import MAX_TELEMETRY_FILE_BYTES, parse_telemetry_lines

__all__ = ["TELEMETRY_INDEX", "TrustedFile", "TelemetryIndex", "StoredTelemetry", "load_stored_telemetry",
           "untrusted_notes"]

TELEMETRY_INDEX = "telemetry.json"


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


class StoredTelemetry(BaseModel):
    """The incident's telemetry: what may support isolation, and what is only shown."""

    trusted: TelemetryParseResult
    shown_only: list[HardwareEvent]


def load_stored_telemetry(store: EvidenceStore) -> StoredTelemetry | None:
    """Read ``telemetry.json`` and its files from ``store``; None when the incident has none."""
    if not any(obj.name == TELEMETRY_INDEX for obj in store.list()):
        return None
    try:
        index = TelemetryIndex.model_validate(json.loads(store.read(TELEMETRY_INDEX, max_bytes=16 << 20)))
    except (DumpError, ValueError, ValidationError) as exc:
        raise TelemetryFileError(f"{store.uri}/{TELEMETRY_INDEX}: unreadable telemetry index ({exc})") from exc
    trusted = TelemetryParseResult()
    shown: list[HardwareEvent] = []
    for item in index.trusted:
        parsed = _parse(store, item.name)
        own = [e for e in parsed.events if e.host == item.host]
        shown += [e for e in parsed.events if e.host != item.host]
        trusted = trusted.merged(parsed.model_copy(update={"events": own}))
    for name in index.untrusted:
        shown += _parse(store, name).events
    return StoredTelemetry(trusted=trusted, shown_only=sorted(shown, key=lambda e: e.time))


def untrusted_notes(events: list[HardwareEvent]) -> list[str]:
    """One report note per event that is shown but may not support isolation."""
    return [f"{e.kind.value}{f' {e.code}' if e.code is not None else ''} on {e.host or 'an unknown host'} at "
            f"{e.time.isoformat()}: reported with a job's key, not the host's node-agent key, so it is shown "
            "here and never supports isolation" for e in events]


def _parse(store: EvidenceStore, name: str) -> TelemetryParseResult:
    try:
        data = store.read(name, max_bytes=MAX_TELEMETRY_FILE_BYTES)
    except (DumpError, EvidenceSourceError) as exc:
        raise TelemetryFileError(f"{store.uri}/{name}: cannot read stored telemetry ({exc})") from exc
    return parse_telemetry_lines(data.decode("utf-8-sig", errors="replace").splitlines(), source=f"{store.uri}/{name}")
