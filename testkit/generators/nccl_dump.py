"""Turn a simulated rank into the Flight Recorder dump torch 2.13 would write for it.

Follows ``FlightRecorder<EventType>::dump`` / ``dump_json`` and ``getCollectiveTrace`` in
``FlightRecorderDetail.hpp``, field by field and in the same key order (see NCCL_FORMAT.md):

- an entry's ``state`` is ``completed`` once its end event fired, else ``started`` once its start
  event fired (only with timing: without it the start event is null), else ``scheduled``;
- the watchdog retires a completed work at its next poll; retiring sets both
  ``time_discovered_*`` and, with timing, ``duration_ms``. A dump queries unretired events on a
  copy, so an op still in flight shows ``time_discovered_started_ns`` = the dump time;
- coalesced members have null events: ``scheduled``, never retired, no times;
- ``pg_status`` is keyed by ``str(pg_id)``; its counters are ``WorkNCCL::seq_`` values, so in a
  p2p-only group they are p2p sequence numbers.
"""

from __future__ import annotations

import json
import pickle
import struct
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from testkit.generators.nccl_frames import frames_for
from testkit.generators.nccl_program import Phase
from testkit.generators.nccl_sim import Record, Simulation, Work

__all__ = ["DumpFormat", "DumpSettings", "rank_dump", "json_form", "encode_dump", "torch26_form", "VERSION"]

VERSION = "2.10"
_MS = 1_000_000


class DumpFormat(StrEnum):
    """The two encodings torch writes."""

    PICKLE = "pickle"
    """``_dump_fr_trace`` and the dump-on-timeout file: protocol-2 pickle, stack frames included."""
    JSON = "json"
    """``_dump_fr_trace_json``: sorted keys, no frames, lists for tuples, 0 for None."""


@dataclass(frozen=True, slots=True)
class DumpSettings:
    """Job-wide settings that shape every rank's dump."""

    epoch_ns: int  # wall-clock time of simulation time 0
    timing: bool  # TORCH_NCCL_ENABLE_TIMING
    ring_size: int  # TORCH_FR_BUFFER_SIZE
    timeout_ms: int = 600_000
    comm_lib_version: str = "2.27.5"
    watchdog_poll_ns: int = 100 * _MS
    # ``onlyActive=True`` (``_dump_fr_trace(..., onlyActive=True)``, and what production collectors
    # often ask for): the ring is read as usual, then every entry whose state reads ``completed``
    # (retired, or found complete by the dump's own query) is left out (D ``getCollectiveTrace``:
    # ``if (onlyActive && e.time_discovered_completed_.has_value()) continue;``).
    only_active: bool = False
    # The schema torch writes: "2.10" (torch 2.9 to 2.14, measured) or "2.4" (torch 2.6:
    # FlightRecorder.hpp ``version_val``; its dump has no ``comm_lib_version`` and its entries no
    # ``thread_name`` / ``thread_id``, measured on the 2.6.0 wheel and read in its recorder source).
    schema: str = VERSION


def rank_dump(sim: Simulation, rank: int, dump_ns: int, settings: DumpSettings) -> dict[str, Any]:
    """Rank ``rank``'s pickle-form dump taken at simulation time ``dump_ns``."""
    topology = sim.topology
    view = _View(rank, dump_ns, settings)
    records = [r for r in sim.records[rank] if r.created_ns <= dump_ns]
    groups = topology.groups_of(rank)
    pg_config = {
        info.name: {"name": info.name, "desc": info.desc, "ranks": info.ranks_str()}
        for info in sorted(groups, key=lambda g: (g.name, g.desc))
    }
    pg_status = {}
    for info in groups:  # creation order is pg_id order
        base = sim.start_counters[rank].group(info.name).last_work_seq
        works = [r.work for r in records if r.group == info.name and r.work is not None]
        pg_status[str(topology.pg_id(rank, info.name))] = view.status(works, base)
    ring = records[-settings.ring_size:]
    entries = [e for e in (view.entry(r, topology.groups[r.group].desc) for r in ring)
               if not (settings.only_active and e["state"] == "completed")]
    dump = {
        "version": VERSION,
        "pg_config": pg_config,
        "comm_lib_version": settings.comm_lib_version,
        "pg_status": pg_status,
        "entries": entries,
    }
    return torch26_form(dump) if settings.schema == "2.4" else dump


def torch26_form(dump: dict[str, Any]) -> dict[str, Any]:
    """The same dump as torch 2.6 writes it (schema ``"2.4"``): no ``comm_lib_version``, and
    entries without the issuing thread (``thread_name`` and ``thread_id`` came with later
    schemas); every other field, its order and its meaning are the same."""
    entries = [{k: v for k, v in e.items() if k not in ("thread_name", "thread_id")} for e in dump.get("entries", [])]
    return {"version": "2.4", "pg_config": dump["pg_config"], "pg_status": dump["pg_status"], "entries": entries}


def json_form(dump: dict[str, Any]) -> dict[str, Any]:
    """The same dump as ``_dump_fr_trace_json`` writes it (``dump_json`` in the header)."""
    out: dict[str, Any] = {
        "version": dump["version"],
        "pg_config": dump["pg_config"],
        "pg_status": {pg: {k: str(v) for k, v in status.items()} for pg, status in dump["pg_status"].items()},
        # getNCCLCommDumpMap() is empty on stock NCCL: JSON writes {}, the pickle omits the key.
        "nccl_comm_state": {},
    }
    if "comm_lib_version" in dump:
        out["comm_lib_version"] = dump["comm_lib_version"]
    entries = []
    for entry in dump.get("entries", []):
        converted = {k: v for k, v in entry.items() if k != "frames"}
        converted["process_group"] = list(entry["process_group"])
        for key in ("time_discovered_started_ns", "time_discovered_completed_ns"):
            if converted[key] is None:
                converted[key] = 0
        entries.append(converted)
    if entries:
        out["entries"] = entries
    return out


def encode_dump(dump: dict[str, Any], fmt: DumpFormat) -> bytes:
    """Bytes as torch writes them. JSON keys are sorted: nlohmann's objects are std::maps."""
    if fmt is DumpFormat.PICKLE:
        return pickle.dumps(dump, protocol=2)
    return json.dumps(json_form(dump), sort_keys=True, separators=(",", ":")).encode()


class _View:
    """What one rank's Flight Recorder shows at one instant."""

    def __init__(self, rank: int, dump_ns: int, settings: DumpSettings) -> None:
        self.rank = rank
        self.now = dump_ns
        self.settings = settings
        # The watchdog of each process polls on its own phase.
        self.phase = (rank * 7_919_003) % settings.watchdog_poll_ns

    def discovered(self, t: int | None) -> int | None:
        """When the watchdog noticed an event that happened at ``t``: its next poll."""
        if t is None:
            return None
        period = self.settings.watchdog_poll_ns
        polls = -(-(t - self.phase) // period)
        return self.phase + polls * period

    def status(self, works: list[Work], base: int) -> dict[str, int]:
        started = [w.seq for w in works if _le(self.discovered(w.ready_ns), self.now)]
        completed = [w.seq for w in works if _le(self.discovered(w.complete_ns), self.now)]
        return {
            "last_enqueued_collective": works[-1].seq if works else base,
            "last_started_collective": (max(started, default=base) if self.settings.timing else -1),
            "last_completed_collective": max(completed, default=base),
        }

    def entry(self, record: Record, desc: str) -> dict[str, Any]:
        epoch = self.settings.epoch_ns
        state, started, completed, retired, duration = self._progress(record.work)
        entry: dict[str, Any] = {
            "frames": list(frames_for(record.site, _in_batch(record),
                                      record.profiling_name.startswith("nccl:recv"))),
            "record_id": record.record_id,
            "pg_id": record.pg_id,
            "process_group": (record.group, desc),
            "thread_name": record.thread.value,
            "thread_id": str(_thread_id(self.rank, record.thread)),
            "collective_seq_id": record.collective_seq_id,
            "p2p_seq_id": record.p2p_seq_id,
            "op_id": record.op_id,
            "profiling_name": record.profiling_name,
            "time_created_ns": epoch + record.created_ns,
        }
        if duration is not None:
            entry["duration_ms"] = duration
        entry.update({
            "input_sizes": [list(s) for s in record.input_sizes],
            "input_dtypes": list(record.input_dtypes),
            "output_sizes": [list(s) for s in record.output_sizes],
            "output_dtypes": list(record.output_dtypes),
            "state": state,
            "time_discovered_started_ns": None if started is None else epoch + started,
            "time_discovered_completed_ns": None if completed is None else epoch + completed,
            "retired": retired,
            "timeout_ms": self.settings.timeout_ms,
            "is_p2p": record.is_p2p,
        })
        return entry

    def _progress(self, work: Work | None
                  ) -> tuple[str, int | None, int | None, bool, float | None]:
        """(state, discovered started, discovered completed, retired, duration_ms)."""
        timing = self.settings.timing
        if work is None:
            return "scheduled", None, None, False, None
        if work.complete_ns is not None and work.complete_ns <= self.now:
            retire = self.discovered(work.complete_ns)
            if retire is not None and retire <= self.now:
                # retire_id -> update_state: the start query, then the end query, then duration.
                duration = _float32((work.complete_ns - (work.ready_ns or 0)) / _MS) if timing else None
                return "completed", retire if timing else None, retire + 2_000, True, duration
            # Completed but not yet retired: the dump's own query discovers it on a copy.
            return "completed", self.now if timing else None, self.now + 2_000, False, None
        if timing and work.ready_ns is not None and work.ready_ns <= self.now:
            return "started", self.now, None, False, None
        return "scheduled", None, None, False, None


def _le(t: int | None, now: int) -> bool:
    return t is not None and t <= now


def _in_batch(record: Record) -> bool:
    """Members of a p2p batch and the batch's closing entry carry batch_isend_irecv's frames."""
    return (record.work is None and record.is_p2p) or record.profiling_name == "nccl:coalesced"


def _thread_id(rank: int, thread: Phase) -> int:
    """``str(std::this_thread::get_id())`` is a pthread_t: a large, address-like number."""
    base = 139_843_000_000_000 + rank * 2_621_440
    return base if thread is Phase.MAIN else base + 1_342_177_280


def _float32(value: float) -> float:
    """``duration_ms`` is a C++ float widened to double when dumped."""
    return float(struct.unpack("f", struct.pack("f", value))[0])
