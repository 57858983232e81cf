"""Parse the JSON lines written by ``denpex collect-telemetry`` into events.

Counters become events only as differences: NVLink error counters that rose between two snapshots
of the same link, a link that went down, new uncorrectable remapped rows, a row-remap failure or a
newly pending remap. Such an event carries ``since``, the earlier reading's time. A counter that
went back was reset in between (GPU reset, driver reload): a non-zero new value is reported as at
least that many errors, and a zero as a "not available" gap, never as "no errors". Xid records
become Xid events directly.

Example::

    >>> lines = [
    ...   '{"v":1,"type":"nvlink","host":"n2","time":"2026-11-29T18:40:00Z","snapshot":0,'
    ...   '"gpu":{"pci_bus_id":"00000000:3B:00.0"},"link":3,"active":true,"counters":{"dl_recovery":2}}',
    ...   '{"v":1,"type":"nvlink","host":"n2","time":"2026-11-29T18:45:00Z","snapshot":1,'
    ...   '"gpu":{"pci_bus_id":"00000000:3B:00.0"},"link":3,"active":true,"counters":{"dl_recovery":7}}',
    ... ]
    >>> e = parse_collector_lines(lines).events[0]
    >>> (e.kind.value, e.gpu.pci_bus_id, e.link, e.detail)
    ('nvlink', '0000:3b:00.0', 3, 'link 3: dl_recovery +5 (2 -> 7) between 18:40:00Z and 18:45:00Z')
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime

from pydantic import ValidationError

from denpex.hardware.events import (
    MAX_SOURCE_LINE_CHARS,
    GpuIdentity,
    GpuRef,
    HardwareEvent,
    RejectReason,
    Severity,
    SignalKind,
    SignalSource,
    TelemetryParseResult,
    Unavailable,
)
from denpex.hardware.line_reader import LineReader
from denpex.hardware.records import (
    KNOWN_RECORD_TYPES,
    RECORD_ADAPTER,
    RECORD_VERSION,
    GpuRecord,
    NotAvailableRecord,
    NvLinkCounter,
    NvLinkRecord,
    RemappedRowsRecord,
    XidRecord,
)
from denpex.hardware.xid_catalog import XidCatalog

__all__ = ["parse_collector_lines", "CollectorLogReader"]

# Replays and CRC errors are corrected by the link; recoveries mean it had to retrain.
_COUNTER_SEVERITY = {
    NvLinkCounter.DL_REPLAY: Severity.CORRECTABLE,
    NvLinkCounter.CRC_FLIT: Severity.CORRECTABLE,
    NvLinkCounter.CRC_DATA: Severity.CORRECTABLE,
    NvLinkCounter.DL_RECOVERY: Severity.NON_FATAL,
}
_SEVERITY_RANK = [Severity.UNKNOWN, Severity.CORRECTABLE, Severity.NON_FATAL, Severity.FATAL]


def parse_collector_lines(
    lines: Iterable[str], *, catalog: XidCatalog | None = None
) -> TelemetryParseResult:
    """Parse collector JSON lines; bad lines are counted per reason, never raised."""
    reader = CollectorLogReader(catalog=catalog)
    for line in lines:
        reader.feed(line)
    return reader.result()


class CollectorLogReader(LineReader):
    """Line-at-a-time reader; snapshots are kept until ``result()`` compares them."""

    def __init__(self, *, catalog: XidCatalog | None = None) -> None:
        super().__init__(catalog=catalog)
        self._unavailable: list[Unavailable] = []
        self._links: dict[tuple[str, GpuRef, int], list[NvLinkRecord]] = defaultdict(list)
        self._rows: dict[tuple[str, GpuRef], list[RemappedRowsRecord]] = defaultdict(list)

    def _read_line(self, line: str) -> RejectReason | None:
        """Read one JSON line."""
        try:
            data = json.loads(line)
        except (ValueError, RecursionError):
            # ValueError covers JSONDecodeError and integers past Python's digit limit.
            return RejectReason.BAD_JSON
        record_type = data.get("type") if isinstance(data, dict) else None
        if not isinstance(record_type, str) or record_type not in KNOWN_RECORD_TYPES:
            return RejectReason.UNKNOWN_RECORD
        if data.get("v") != RECORD_VERSION:
            return RejectReason.UNSUPPORTED_VERSION
        try:
            record = RECORD_ADAPTER.validate_python(data)
        except ValidationError:
            return RejectReason.INVALID_RECORD
        self._hosts.add(record.host)
        self._take(record, line[:MAX_SOURCE_LINE_CHARS])
        return None

    def _take(self, record: object, line: str) -> None:
        if isinstance(record, GpuRecord):
            path = tuple(record.pcie_path) if record.pcie_path is not None else None
            self._gpus.append(
                GpuIdentity(host=record.host, gpu=record.gpu, name=record.name, pcie_path=path, time=record.time)
            )
        elif isinstance(record, XidRecord):
            self._events.append(
                HardwareEvent(
                    host=record.host,
                    kind=SignalKind.XID,
                    time=record.time,
                    severity=self._catalog.severity_of(record.code),
                    code=record.code,
                    gpu=record.gpu,
                    source=SignalSource.NVML,
                    detail="NVML Xid critical-error event",
                    line=line,
                )
            )
        elif isinstance(record, NvLinkRecord):
            self._links[(record.host, record.gpu, record.link)].append(record)
        elif isinstance(record, RemappedRowsRecord):
            self._rows[(record.host, record.gpu)].append(record)
        elif isinstance(record, NotAvailableRecord):
            self._unavailable.append(
                Unavailable(
                    host=record.host,
                    what=record.what,
                    detail=record.detail,
                    gpu=record.gpu,
                    link=record.link,
                    time=record.time,
                )
            )
        # Session records only mark the host as covered.

    def result(self) -> TelemetryParseResult:
        """Everything read so far, with snapshot differences turned into events."""
        events = list(self._events)
        unavailable = list(self._unavailable)
        for snapshots in self._links.values():
            link_events, reset = _link_events(sorted(snapshots, key=lambda r: (r.time, r.snapshot)))
            events += link_events
            unavailable += reset
        for rows in self._rows.values():
            events += _row_events(sorted(rows, key=lambda r: (r.time, r.snapshot)))
        return TelemetryParseResult(
            events=sorted(events, key=lambda e: e.time),
            gpus=list(self._gpus),
            unavailable=unavailable,
            hosts=sorted(self._hosts),
            lines_read=self._lines,
            rejects=dict(self._rejects),
        )


def _link_events(snapshots: list[NvLinkRecord]) -> tuple[list[HardwareEvent], list[Unavailable]]:
    """Events for counters that rose or links that went down; gaps for counters that went back."""
    events, gaps = [], []
    for before, after in zip(snapshots, snapshots[1:]):
        span = f"between {_hms(before.time)} and {_hms(after.time)}"
        rises = []
        severity = Severity.UNKNOWN
        for counter in NvLinkCounter:
            if counter not in before.counters or counter not in after.counters:
                continue
            old, new = before.counters[counter], after.counters[counter]
            if new == old:
                continue
            if new == 0:
                # Reset in between (GPU reset, driver reload): the change is unknown, never "none".
                gaps.append(_reset_gap(after, counter, old, span))
                continue
            # A lower non-zero value was counted since a reset: at least that many errors.
            rises.append(f"{counter.value} +{new - old} ({old} -> {new})" if new > old
                         else f"{counter.value} reset ({old} -> {new}): at least +{new}")
            severity = max(severity, _COUNTER_SEVERITY[counter], key=_SEVERITY_RANK.index)
        went_down = before.active is True and after.active is False
        if went_down:
            rises.insert(0, "went down")
            severity = Severity.FATAL
        if rises:
            events.append(
                HardwareEvent(
                    host=after.host,
                    kind=SignalKind.NVLINK,
                    time=after.time,
                    since=before.time,
                    severity=severity,
                    gpu=after.gpu,
                    link=after.link,
                    detail=f"link {after.link}: {', '.join(rises)} {span}",
                    source=SignalSource.NVML,
                    line=after.model_dump_json(exclude_none=True)[:MAX_SOURCE_LINE_CHARS],
                )
            )
    return events, gaps


def _reset_gap(after: NvLinkRecord, counter: NvLinkCounter, old: int, span: str) -> Unavailable:
    return Unavailable(
        host=after.host,
        what=f"nvlink_{counter.value}",
        detail=f"{counter.value} went back from {old} to 0 {span} (reset): its change in between is unknown",
        gpu=after.gpu,
        link=after.link,
        time=after.time,
    )


def _row_events(rows: list[RemappedRowsRecord]) -> list[HardwareEvent]:
    events = []
    failure_seen = pending_seen = False
    previous: RemappedRowsRecord | None = None
    for row in rows:
        findings: list[tuple[Severity, str]] = []
        if row.failure and not failure_seen:
            findings.append((Severity.FATAL, "row remapping failed: the GPU needs service"))
        if previous is not None and row.uncorrectable > previous.uncorrectable:
            findings.append(
                (
                    Severity.NON_FATAL,
                    f"uncorrectable remapped rows +{row.uncorrectable - previous.uncorrectable} "
                    f"({previous.uncorrectable} -> {row.uncorrectable})",
                )
            )
        if row.pending and not pending_seen:
            findings.append((Severity.CORRECTABLE, "a row remap is pending until the next GPU reset"))
        failure_seen, pending_seen = failure_seen or row.failure, pending_seen or row.pending
        for severity, detail in findings:
            events.append(
                HardwareEvent(
                    host=row.host,
                    kind=SignalKind.ROW_REMAP,
                    time=row.time,
                    # Seen first at this reading: it changed after the previous one.
                    since=previous.time if previous is not None else None,
                    severity=severity,
                    gpu=row.gpu,
                    detail=detail,
                    source=SignalSource.NVML,
                    line=row.model_dump_json(exclude_none=True)[:MAX_SOURCE_LINE_CHARS],
                )
            )
        previous = row
    return events


def _hms(time: datetime) -> str:
    return time.strftime("%H:%M:%SZ")
