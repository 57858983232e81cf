"""The rank's own Flight Recorder, as the hang dumper needs it: cheap progress, one op, whole dumps.

:class:`TorchFlightRecorder` reads it through ``torch._C._distributed_c10d`` (torch imported
lazily); tests use an in-memory :class:`FlightRecorderSource`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

__all__ = ["DumpFormat", "GroupProgress", "InFlightOp", "FlightRecorderSource", "TorchFlightRecorder", "op_deadlines"]


class DumpFormat(StrEnum):
    """An encoding of the FR dump."""

    PICKLE = "pickle"
    """torch's pickle (protocol 2, plain containers): the full dump, stack traces included."""
    JSON = "json"
    """torch's JSON dump: no stack traces, and a few encoding differences from the pickle."""

    @property
    def suffix(self) -> str:
        return ".pkl" if self is DumpFormat.PICKLE else ".json"


@dataclass(frozen=True, slots=True)
class GroupProgress:
    """One process group's counters from FR ``pg_status`` (keyed by the rank-local ``pg_id``)."""

    last_enqueued: int
    last_completed: int

    @property
    def in_flight(self) -> int | None:
        """The sequence id of the newest op enqueued but not completed, if any.

        >>> GroupProgress(last_enqueued=5, last_completed=4).in_flight
        5
        >>> GroupProgress(last_enqueued=5, last_completed=5).in_flight is None
        True
        """
        return self.last_enqueued if self.last_enqueued > self.last_completed else None


@dataclass(frozen=True, slots=True)
class InFlightOp:
    """What FR says about one op still in flight: enough to name it and to know its timeout."""

    pg_id: str
    seq: int
    group_name: str
    profiling_name: str
    timeout_ms: int | None


class FlightRecorderSource(Protocol):
    """The rank's own Flight Recorder. :class:`TorchFlightRecorder` is the real one."""

    def progress(self) -> Mapping[str, GroupProgress]:
        """``pg_status`` per rank-local ``pg_id``; cheap enough to call every second."""
        ...

    def in_flight_op(self, pg_id: str, seq: int) -> InFlightOp | None:
        """The unretired collective ``seq`` of group ``pg_id``, or None when FR has no such entry."""
        ...

    def op_deadlines(self, ops: Mapping[str, int], default_timeout_ms: int | None = None) -> dict[str, float]:
        """When each op ``{pg_id: seq}`` times out, in seconds since the epoch (FR's
        ``time_created_ns`` + ``timeout_ms``, else ``default_timeout_ms``), read in one pass, retired
        or not; ops FR holds no entry for, or no creation time or timeout, are left out. Called only when a completion
        is seen after a dump, so its cost (a full read of the ring) is paid once or twice."""
        ...

    def dump(self, fmt: DumpFormat) -> bytes:
        """The whole dump, encoded as ``fmt``."""
        ...


class TorchFlightRecorder:
    """Reads this process's Flight Recorder through ``torch._C._distributed_c10d``."""

    def __init__(self) -> None:
        # Imported here so that the collector module loads where torch is not installed.
        from torch._C import _distributed_c10d as c10d

        # The _dump_fr_trace* bindings are private and absent from torch's type stubs.
        self._c10d: Any = c10d

    def progress(self) -> Mapping[str, GroupProgress]:
        # Without collectives the JSON dump is only pg_config and pg_status: ~0.1 ms.
        status = json.loads(self._c10d._dump_fr_trace_json(includeCollectives=False, onlyActive=False))
        return {
            str(pg_id): GroupProgress(
                last_enqueued=int(counters["last_enqueued_collective"]),
                last_completed=int(counters["last_completed_collective"]),
            )
            for pg_id, counters in status.get("pg_status", {}).items()
        }

    def in_flight_op(self, pg_id: str, seq: int) -> InFlightOp | None:
        # onlyActive filters on "completed" state, which Gloo never sets, so read all entries.
        dump = json.loads(self._c10d._dump_fr_trace_json(includeCollectives=True, onlyActive=False))
        for entry in reversed(dump.get("entries", [])):
            if (str(entry.get("pg_id")) == pg_id and entry.get("collective_seq_id") == seq
                    and not entry.get("is_p2p") and not entry.get("retired")):
                group = entry.get("process_group") or ["?"]
                return InFlightOp(pg_id=pg_id, seq=seq, group_name=str(group[0]),
                                  profiling_name=str(entry.get("profiling_name", "?")),
                                  timeout_ms=entry.get("timeout_ms"))
        return None

    def op_deadlines(self, ops: Mapping[str, int], default_timeout_ms: int | None = None) -> dict[str, float]:
        # Retired entries count too: the op may have timed out since the dump read its progress.
        dump = json.loads(self._c10d._dump_fr_trace_json(includeCollectives=True, onlyActive=False))
        return op_deadlines(dump.get("entries", []), ops, default_timeout_ms)

    def dump(self, fmt: DumpFormat) -> bytes:
        if fmt is DumpFormat.PICKLE:
            return bytes(self._c10d._dump_fr_trace(
                includeCollectives=True, includeStackTraces=True, onlyActive=False))
        return bytes(self._c10d._dump_fr_trace_json(includeCollectives=True, onlyActive=False))


def op_deadlines(entries: Iterable[Mapping[str, Any]], ops: Mapping[str, int],
                 default_timeout_ms: int | None = None) -> dict[str, float]:
    """Each op's timeout deadline (seconds since the epoch) from FR ``entries``, newest entry first.

    >>> op_deadlines([{"pg_id": 1, "collective_seq_id": 5, "time_created_ns": 10**9, "timeout_ms": 3000}],
    ...              {"1": 5})
    {'1': 4.0}
    """
    wanted = dict(ops)
    found: dict[str, float] = {}
    for entry in reversed(list(entries)):
        pg = str(entry.get("pg_id"))
        if wanted.get(pg) != entry.get("collective_seq_id") or entry.get("is_p2p") or pg in found:
            continue
        created, timeout_ms = entry.get("time_created_ns"), entry.get("timeout_ms") or default_timeout_ms
        if isinstance(created, int) and created > 0 and isinstance(timeout_ms, int) and timeout_ms > 0:
            found[pg] = created / 1e9 + timeout_ms / 1000
    return found
