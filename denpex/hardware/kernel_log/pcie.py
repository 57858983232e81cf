"""PCIe errors in the kernel log: native AER lines (a device's header, a root port's summary, their
detail lines folded in) and firmware-first ones (APEI GHES CPER records, whose PCIe section becomes
the same event). Part of ``KernelLogReader``, kept apart because a record spans lines."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from datetime import datetime

from denpex.hardware.events import (
    MAX_SOURCE_LINE_CHARS,
    HardwareEvent,
    RejectReason,
    Severity,
    SignalKind,
    SignalSource,
)
from denpex.hardware.kernel_log.patterns import (
    ADDR_IN_TEXT,
    AER_DETAIL,
    AER_HEADER,
    GHES_DEVICE,
    GHES_HEADER,
    GHES_SECTION,
    GHES_SECTION_TYPE,
    GHES_SEVERITY,
    aer_severity,
    cper_severity,
    same_report,
)
from denpex.hardware.pci import canonical_pci

__all__ = ["PcieReading", "GhesRecord"]


@dataclass
class GhesRecord:
    """What is known so far of one firmware (CPER) record on one host."""

    time: datetime
    # Lines read before the record showed whether it has a PCIe section (see ``_ghes_line``).
    pending: int = 0
    # "event severity": the worst of the record's sections; "Error N, type": this section's own.
    severity: Severity | None = None
    section_severity: Severity | None = None
    severity_text: str = ""
    section_text: str = ""
    # After the current section's "section_type" line; ``event`` is set when that section is PCIe.
    in_section: bool = False
    event: int | None = None

    def severity_words(self) -> list[str]:
        """``event severity: recoverable``, ``Error 0, type: recoverable``: the record's own words."""
        return [text for text in (self.severity_text, self.section_text) if text]



class PcieReading:
    """The PCIe part of the kernel log reader: the state it links lines by is the reader's."""

    _events: list[HardwareEvent]
    _rejects: Counter[RejectReason]
    _continuations: int
    # Index into _events of the last AER event per (host, device).
    _last_aer: dict[tuple[str, str], int]
    # Root-port AER events that already took in their device's header.
    _aer_merged: set[int]
    # Firmware-first records being read, per (host, {N}), and the last PCIe event one made per host.
    _ghes: dict[tuple[str, str], GhesRecord]
    _last_ghes: dict[str, int]

    # -- PCIe AER ---------------------------------------------------------------------------------

    def _aer(self, host: str, time: datetime, device: re.Match[str], line: str) -> RejectReason | None:
        bdf = canonical_pci(device["bdf"])
        body = device["body"].strip()
        if bdf is None:
            return RejectReason.MALFORMED_SIGNAL
        header = AER_HEADER.match(body)
        if header is not None:
            return self._aer_header(host, time, bdf, header, line)
        # "AER: [Multiple] <severity> error [message] received[:| from] <bdf>", split without a
        # regex: nested lazy patterns made hostile lines cost hundreds of milliseconds each.
        what, found, source_text = body.partition(" received")
        if body.startswith("AER:") and found and "error" in what.lower():
            source = ADDR_IN_TEXT.search(source_text[:64])
            self._add_aer(
                host,
                time,
                device_pci=canonical_pci(source.group(0)) if source else None,
                reporter_pci=bdf,
                severity=aer_severity(what),
                detail=body,
                line=line,
            )
            return None
        if AER_DETAIL.match(body):
            index = self._last_aer.get((host, bdf))
            if index is None or not same_report(self._events[index].time, time):
                # The kernel's decode of a firmware-first record (cper_print_aer) may name the port
                # rather than the device the record names: it still belongs to that record.
                index = self._last_ghes.get(host)
            if index is None or not same_report(self._events[index].time, time):
                return RejectReason.ORPHAN_CONTINUATION
            self._append_detail(index, body)
            return None
        return RejectReason.UNKNOWN_LINE

    def _aer_header(
        self, host: str, time: datetime, bdf: str, header: re.Match[str], line: str
    ) -> RejectReason | None:
        severity = aer_severity(header["sev"])
        detail = f"severity={header['sev'].strip()}" + (f", type={header['type'].strip()}" if header["type"] else "")
        # A root port's "error received from <bdf>" and the device's own header are one report.
        index = self._last_aer.get((host, bdf))
        if index is not None and index not in self._aer_merged:
            earlier = self._events[index]
            if (
                earlier.reporter_pci is not None
                and earlier.device_pci == bdf
                and earlier.severity in (severity, Severity.UNKNOWN)
                and same_report(earlier.time, time)
            ):
                self._events[index] = earlier.model_copy(update={"severity": severity})
                self._aer_merged.add(index)
                self._append_detail(index, detail)
                return None
        self._add_aer(host, time, device_pci=bdf, reporter_pci=None, severity=severity, detail=detail, line=line)
        return None

    def _add_aer(
        self,
        host: str,
        time: datetime,
        *,
        device_pci: str | None,
        reporter_pci: str | None,
        severity: Severity,
        detail: str,
        line: str,
    ) -> None:
        index = len(self._events)
        self._events.append(
            HardwareEvent(
                host=host,
                kind=SignalKind.PCIE_AER,
                time=time,
                severity=severity,
                device_pci=device_pci,
                reporter_pci=reporter_pci,
                detail=detail[:MAX_SOURCE_LINE_CHARS],
                source=SignalSource.KERNEL_LOG,
                line=line,
            )
        )
        for address in (device_pci, reporter_pci):
            if address is not None:
                self._last_aer[(host, address)] = index

    def _append_detail(self, index: int, text: str) -> None:
        event = self._events[index]
        detail = f"{event.detail}; {text.strip()}" if event.detail else text.strip()
        self._events[index] = event.model_copy(update={"detail": detail[:MAX_SOURCE_LINE_CHARS]})
        self._continuations += 1

    # -- firmware-first PCIe errors (APEI GHES) ----------------------------------------------------

    def _ghes_line(self, host: str, time: datetime, match: re.Match[str], line: str) -> RejectReason | None:
        """One line of a CPER record; its PCIe sections become AER events, everything else is counted.

        A record's first lines (header, event severity, "Error N, type") come before anyone knows
        whether it has a PCIe section: they wait in ``pending`` and become that event's
        continuation lines, or unknown lines when the section is about something else.
        """
        key, body = (host, match["seq"] or ""), match["body"].strip()
        if body.startswith(GHES_HEADER):
            self._drop_pending(self._ghes.get(key))
            self._ghes[key] = GhesRecord(time=time, pending=1)
            return None
        record = self._ghes.get(key)
        if record is None or not same_report(record.time, time):
            return RejectReason.ORPHAN_CONTINUATION
        section_type = GHES_SECTION_TYPE.match(body)
        if section_type is not None:
            return self._ghes_section(host, record, section_type["type"].strip(), line)
        section = GHES_SECTION.match(body)
        if section is not None:
            record.section_severity, record.event, record.in_section = cper_severity(section["sev"]), None, False
            record.section_text = body
            record.pending += 1
            return None
        severity = GHES_SEVERITY.match(body)
        if severity is not None and not record.in_section:
            record.severity, record.severity_text = cper_severity(severity["sev"]), body
            record.pending += 1
            return None
        if record.event is not None:
            device = GHES_DEVICE.match(body)
            if device is not None:
                self._set_ghes_device(host, record.event, canonical_pci(device["bdf"]))
            self._append_detail(record.event, body)
            return None
        if not record.in_section:
            # "It has been corrected by h/w ...", fru_id, fru_text, tstamp: part of the preamble.
            record.pending += 1
            return None
        return RejectReason.UNKNOWN_LINE

    def _ghes_section(self, host: str, record: "GhesRecord", section_type: str, line: str) -> RejectReason | None:
        record.in_section = True
        if section_type != "PCIe error":
            # A memory or processor error: not a PCIe event, and the model has no kind for it.
            self._drop_pending(record)
            record.event = None
            return RejectReason.UNKNOWN_LINE
        severity = record.section_severity or record.severity or Severity.UNKNOWN
        record.event = len(self._events)
        self._events.append(
            HardwareEvent(
                host=host,
                kind=SignalKind.PCIE_AER,
                time=record.time,
                severity=severity,
                detail="; ".join(["firmware-first PCIe error (APEI GHES)", *record.severity_words()]),
                source=SignalSource.KERNEL_LOG,
                line=line,
            )
        )
        self._last_ghes[host] = record.event
        self._continuations += record.pending
        record.pending = 0
        return None

    def _set_ghes_device(self, host: str, index: int, bdf: str | None) -> None:
        if bdf is None:
            return
        self._events[index] = self._events[index].model_copy(update={"device_pci": bdf})
        self._last_aer[(host, bdf)] = index

    def _drop_pending(self, record: "GhesRecord | None") -> None:
        if record is not None and record.pending:
            self._rejects[RejectReason.UNKNOWN_LINE] += record.pending
            record.pending = 0
