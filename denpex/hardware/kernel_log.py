"""Parse kernel log text (``journalctl -k -o short-iso``) into hardware events.

Each line is ``TIME HOST IDENT: message``; the time must carry a UTC offset (``+0000`` or
``+00:00``). Recognised messages:

- Xid: ``NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, GPU has fallen off the bus.``;
  for Xid 154 the new recovery action (``... changed from 0x0 (None) to 0x2 (Node Reboot Required)``)
- GPU identity: ``NVRM: GPU at PCI:0000:3b:00: GPU-5d1e...`` (maps a PCI address to a UUID)
- SXid: ``nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress ...``
  (data lines with the same code and no Fatal/Non-fatal word are folded into it)
- PCIe AER: ``nvidia 0000:3b:00.0: PCIe Bus Error: severity=Uncorrectable (Fatal), type=...``,
  root ports' ``AER: Multiple Uncorrected (Non-Fatal) error message received from 0000:73:00.1``,
  and detail lines (``device [10de:2330] error status/mask=...``, ``[14] CmpltTO``) folded in
- Firmware-first PCIe errors (APEI GHES), as servers whose firmware owns AER log them: a CPER
  record of ``{N}[Hardware Error]: ...`` lines (``{N}`` groups one record) whose
  ``section_type: PCIe error`` section becomes the same PCIe AER event as the native lines, with
  its severity (fatal, recoverable -> non-fatal, corrected) and ``device_id: 0000:3b:00.0``; the
  kernel's AER decode after it (``pcieport ...: AER: aer_status: ...``) is folded in. Other
  sections (memory, processor errors) are counted as unknown lines.
- OOM: ``Out of memory: Killed process 1234 (python) ...``, the ``Memory cgroup out of memory:``
  form, the older ``Kill process ... or sacrifice child`` / ``Killed process`` pair and the
  ``oom-kill:...,task=python,pid=1234`` summary (one event per killed pid)

Example::

    >>> result = parse_kernel_log([
    ...     "2026-11-29T18:45:02+0000 gpu-node-002 kernel: NVRM: Xid (PCI:0000:3b:00): 79, "
    ...     "pid=4242, name=python, GPU has fallen off the bus.",
    ...     "2026-11-29T18:45:03+0000 gpu-node-002 kernel: usb 1-1: new device",
    ... ])
    >>> e = result.events[0]
    >>> (e.kind.value, e.code, e.gpu.pci_bus_id, e.pid, e.severity.value)
    ('xid', 79, '0000:3b:00.0', 4242, 'fatal')
    >>> dict(result.rejects)
    {<RejectReason.UNKNOWN_LINE: 'unknown_line'>: 1}
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

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
    to_utc,
)
from denpex.hardware.pci import PCI_ADDRESS_PATTERN, canonical_pci
from denpex.hardware.xid_catalog import XidCatalog, default_xid_catalog

__all__ = ["parse_kernel_log", "KernelLogReader", "MAX_LINE_CHARS"]

# Longer lines are not parsed at all: real kernel lines are far shorter, and it bounds regex work.
MAX_LINE_CHARS = 8192
# Lines of one report (root-port AER + device header, repeated OOM lines) arrive within this.
_SAME_REPORT = timedelta(seconds=5)
# Codes are small integers; anything longer is garbage, not a code.
_MAX_CODE = 1_000_000

_ADDR = PCI_ADDRESS_PATTERN
# A host name never ends in ":"; "TIME kernel: msg" (journalctl --no-hostname) has no host at all.
_PREFIX = re.compile(r"^(?P<ts>\d{4}-\d\d-\d\d[T ]\S+)\s+(?P<host>\S*[^\s:])\s+(?P<ident>[^\s:]+):\s?(?P<msg>.*)$")
_PRINTK_TIME = re.compile(r"^\[\s*\d+\.\d+\]\s*")

_XID = re.compile(r"NVRM: Xid\b.*?:\s*(?P<code>\d+)\s*(?:,|$)\s*(?P<rest>.*)$")
_XID_PCI = re.compile(rf"NVRM: Xid\s*\((?:PCI:)?(?P<pci>{_ADDR})\)")
_PID = re.compile(r"\bpid='?(?P<pid>\d+)'?")
_NAME = re.compile(r"\bname=(?P<name>[^,]*)")
_GPU_AT = re.compile(rf"NVRM: GPU at PCI:(?P<pci>{_ADDR}): (?P<uuid>GPU-[0-9A-Fa-f-]+)")
# Xid 154. The text in parentheses varies between drivers ("Node Reboot Required", "OS Reboot"); the
# number is NVML's recovery action and is what the catalog reads.
_RECOVERY = re.compile(
    r"recovery action changed from\s+(?:0x)?[0-9a-fA-F]+(?:\s*\([^()]{0,64}\))?\s+to\s+(?:0x)?(?P<to>[0-9a-fA-F]{1,8})\b"
)

_SXID = re.compile(rf"SXid\s*\((?:PCI:)?(?P<pci>{_ADDR})\):\s*(?P<code>\d+)\s*,?\s*(?P<rest>.*)$")
_LINK = re.compile(r"\b[Ll]ink\s*#?(?P<link>\d+)")

_DEVICE_PREFIX = re.compile(rf"^(?:(?P<drv>\S+)\s+)?(?P<bdf>{_ADDR}):\s+(?P<body>.*)$")
_AER_HEADER = re.compile(
    r"^(?:AER:\s*)?PCIe Bus Error:\s*severity=(?P<sev>[^,]+)(?:,\s*type=(?P<type>[^,]+))?(?:,\s*(?P<agent>.*))?$"
)
_AER_DETAIL = re.compile(
    r"^(?:AER:\s*)?(?:device \[[0-9a-fA-F]{4}:[0-9a-fA-F]{4}\]|\[\s*\d+\]|TLP Header|"
    r"(?:Uncorrectable|Correctable) error status|aer_\w+:|aer_layer=|error status/mask)"
)
_ADDR_IN_TEXT = re.compile(_ADDR)

# Firmware-first (APEI GHES) CPER records, as drivers/firmware/efi/cper.c prints them. ``{N}`` is
# a counter per record: records printed at the same time interleave, and N restarts at each boot.
_GHES = re.compile(r"^(?:\{(?P<seq>\d{1,10})\})?\[Hardware Error\]:\s*(?P<body>.*)$")
_GHES_HEADER = "Hardware error from APEI Generic Hardware Error Source"
_GHES_SEVERITY = re.compile(r"^event severity:\s*(?P<sev>\w+)")
_GHES_SECTION = re.compile(r"^Error \d+, type:\s*(?P<sev>\w+)")
_GHES_SECTION_TYPE = re.compile(r"^section[_ ]type:\s*(?P<type>.*)$")
# The section's address. "vendor_id: 0x10de, device_id: 0x2330" names the PCI device id instead;
# anchoring at the start of the body keeps the two apart.
_GHES_DEVICE = re.compile(rf"^device_id:\s*(?P<bdf>{_ADDR})\s*$")
# CPER severities (cper_severity_str); the kernel maps them to AER ones the same way.
_CPER_SEVERITY = {"fatal": Severity.FATAL, "recoverable": Severity.NON_FATAL, "corrected": Severity.CORRECTABLE}

_OOM = re.compile(
    r"(?:Memory cgroup out of memory|Out of memory(?: \([^)]*\))?):\s*Kill(?:ed)? process\s+"
    r"(?P<pid>\d+)\s+\((?P<comm>[^)]*)\)"
)
_OOM_KILLED = re.compile(r"^Killed process\s+(?P<pid>\d+)\s+\((?P<comm>[^)]*)\)")
_OOM_SUMMARY = re.compile(r"^oom-kill:.*?\btask=(?P<comm>[^,]*),pid=(?P<pid>\d+)")


def parse_kernel_log(
    lines: Iterable[str], *, catalog: XidCatalog | None = None
) -> TelemetryParseResult:
    """Parse kernel log lines into events; every line that yields nothing is counted by reason."""
    reader = KernelLogReader(catalog=catalog)
    for line in lines:
        reader.feed(line)
    return reader.result()


class KernelLogReader:
    """Line-at-a-time kernel log parser. State only links detail lines to the report they belong to."""

    def __init__(self, *, catalog: XidCatalog | None = None) -> None:
        self._catalog = catalog or default_xid_catalog()
        self._events: list[HardwareEvent] = []
        self._gpus: list[GpuIdentity] = []
        self._hosts: set[str] = set()
        self._spans: dict[str, tuple[datetime, datetime]] = {}
        self._rejects: Counter[RejectReason] = Counter()
        self._lines = 0
        self._continuations = 0
        # Index into _events of the last AER event per (host, device), the last SXid per
        # (host, switch, code) and the last OOM kill per (host, pid).
        self._last_aer: dict[tuple[str, str], int] = {}
        self._last_sxid: dict[tuple[str, str, int], int] = {}
        self._last_oom: dict[tuple[str, int], int] = {}
        # Root-port AER events that already took in their device's header.
        self._aer_merged: set[int] = set()
        # Firmware-first records being read, per (host, {N}), and the last PCIe event one made per host.
        self._ghes: dict[tuple[str, str], _GhesRecord] = {}
        self._last_ghes: dict[str, int] = {}

    def feed(self, raw: str) -> None:
        """Read one line (with or without its newline)."""
        line = raw.rstrip("\r\n")
        if not line.strip():
            return
        self._lines += 1
        if len(line) > MAX_LINE_CHARS:
            self._rejects[RejectReason.LINE_TOO_LONG] += 1
            return
        prefix = _PREFIX.match(line)
        if prefix is None:
            self._rejects[RejectReason.NO_PREFIX] += 1
            return
        time = _parse_time(prefix["ts"])
        if time is None:
            self._rejects[RejectReason.BAD_TIME] += 1
            return
        if prefix["ident"] != "kernel":
            # `logger "NVRM: Xid ... 79"` or `myapp[123]: NVRM: Xid ...` is a program's text, not
            # the driver's report: it must never support a drain.
            self._rejects[RejectReason.NOT_KERNEL] += 1
            return
        host = prefix["host"]
        self._hosts.add(host)
        first, last = self._spans.get(host, (time, time))
        self._spans[host] = (min(first, time), max(last, time))
        msg = _PRINTK_TIME.sub("", prefix["msg"], count=1).strip()
        reason = self._read_message(host, time, msg, line[:MAX_SOURCE_LINE_CHARS])
        if reason is not None:
            self._rejects[reason] += 1

    def result(self) -> TelemetryParseResult:
        """Everything read so far."""
        rejects = Counter(self._rejects)
        # Lines of firmware records that never reached a PCIe section said nothing usable.
        undecided = sum(record.pending for record in self._ghes.values())
        if undecided:
            rejects[RejectReason.UNKNOWN_LINE] += undecided
        return TelemetryParseResult(
            events=sorted(self._events, key=lambda e: e.time),
            gpus=list(self._gpus),
            hosts=sorted(self._hosts),
            kernel_log_spans=dict(self._spans),
            lines_read=self._lines,
            continuation_lines=self._continuations,
            rejects=dict(rejects),
        )

    # -- dispatch -------------------------------------------------------------------------------

    def _read_message(self, host: str, time: datetime, msg: str, line: str) -> RejectReason | None:
        if "NVRM: Xid" in msg:
            return self._xid(host, time, msg, line)
        if "NVRM: GPU at PCI:" in msg:
            return self._gpu_at(host, time, msg)
        if "SXid" in msg:
            return self._sxid(host, time, msg, line)
        if "out of memory" in msg.lower() or msg.startswith(("Killed process", "oom-kill:")):
            return self._oom(host, time, msg, line)
        ghes = _GHES.match(msg)
        if ghes is not None:
            return self._ghes_line(host, time, ghes, line)
        device = _DEVICE_PREFIX.match(msg)
        if device is not None and ("AER" in msg or "PCIe Bus Error" in msg or _AER_DETAIL.match(device["body"])):
            return self._aer(host, time, device, line)
        return RejectReason.UNKNOWN_LINE

    # -- Xid --------------------------------------------------------------------------------------

    def _xid(self, host: str, time: datetime, msg: str, line: str) -> RejectReason | None:
        match = _XID.search(msg)
        if match is None or len(match["code"]) > 7 or int(match["code"]) > _MAX_CODE:
            return RejectReason.MALFORMED_SIGNAL
        code = int(match["code"])
        pci_match = _XID_PCI.search(msg)
        pci = canonical_pci(pci_match["pci"]) if pci_match else None
        rest = match["rest"]
        recovery = _RECOVERY.search(rest)
        action = int(recovery["to"], 16) if recovery else None
        pid_match, name_match = _PID.search(rest), _NAME.search(rest)
        comm = name_match["name"].strip().strip("'") if name_match else None
        detail = ", ".join(
            part.strip()
            for part in rest.split(",")
            if part.strip() and not part.strip().startswith(("pid=", "name="))
        )
        self._events.append(
            HardwareEvent(
                host=host,
                kind=SignalKind.XID,
                time=time,
                severity=self._catalog.severity_of(code, action),
                code=code,
                recovery_action=action,
                gpu=GpuRef(pci_bus_id=pci) if pci else None,
                pid=_small_int(pid_match["pid"]) if pid_match else None,
                comm=comm if comm and comm != "<unknown>" else None,
                detail=detail[:MAX_SOURCE_LINE_CHARS],
                source=SignalSource.KERNEL_LOG,
                line=line,
            )
        )
        return None

    def _gpu_at(self, host: str, time: datetime, msg: str) -> RejectReason | None:
        match = _GPU_AT.search(msg)
        pci = canonical_pci(match["pci"]) if match else None
        if match is None or pci is None:
            return RejectReason.MALFORMED_SIGNAL
        self._gpus.append(GpuIdentity(host=host, gpu=GpuRef(pci_bus_id=pci, uuid=match["uuid"]), time=time))
        return None

    # -- SXid -------------------------------------------------------------------------------------

    def _sxid(self, host: str, time: datetime, msg: str, line: str) -> RejectReason | None:
        match = _SXID.search(msg)
        pci = canonical_pci(match["pci"]) if match else None
        if match is None or pci is None or len(match["code"]) > 7:
            return RejectReason.MALFORMED_SIGNAL
        code, rest = int(match["code"]), match["rest"].strip()
        lowered = rest.lower()
        if lowered.startswith(("non-fatal", "nonfatal", "non fatal")):
            severity = Severity.NON_FATAL
        elif lowered.startswith("fatal"):
            severity = Severity.FATAL
        else:
            severity = Severity.UNKNOWN
        key = (host, pci, code)
        previous = self._last_sxid.get(key)
        # NVSwitch prints data lines ("Severity 1 Engine instance 28 ...") under the same code.
        if severity is Severity.UNKNOWN and previous is not None and _close(self._events[previous].time, time):
            self._continuations += 1
            return None
        link = _LINK.search(rest)
        self._last_sxid[key] = len(self._events)
        self._events.append(
            HardwareEvent(
                host=host,
                kind=SignalKind.SXID,
                time=time,
                severity=severity,
                code=code,
                device_pci=pci,
                link=_small_int(link["link"]) if link else None,
                detail=rest[:MAX_SOURCE_LINE_CHARS],
                source=SignalSource.KERNEL_LOG,
                line=line,
            )
        )
        return None

    # -- PCIe AER ---------------------------------------------------------------------------------

    def _aer(self, host: str, time: datetime, device: re.Match[str], line: str) -> RejectReason | None:
        bdf = canonical_pci(device["bdf"])
        body = device["body"].strip()
        if bdf is None:
            return RejectReason.MALFORMED_SIGNAL
        header = _AER_HEADER.match(body)
        if header is not None:
            return self._aer_header(host, time, bdf, header, line)
        # "AER: [Multiple] <severity> error [message] received[:| from] <bdf>", split without a
        # regex: nested lazy patterns made hostile lines cost hundreds of milliseconds each.
        what, found, source_text = body.partition(" received")
        if body.startswith("AER:") and found and "error" in what.lower():
            source = _ADDR_IN_TEXT.search(source_text[:64])
            self._add_aer(
                host,
                time,
                device_pci=canonical_pci(source.group(0)) if source else None,
                reporter_pci=bdf,
                severity=_aer_severity(what),
                detail=body,
                line=line,
            )
            return None
        if _AER_DETAIL.match(body):
            index = self._last_aer.get((host, bdf))
            if index is None or not _close(self._events[index].time, time):
                # The kernel's decode of a firmware-first record (cper_print_aer) may name the port
                # rather than the device the record names: it still belongs to that record.
                index = self._last_ghes.get(host)
            if index is None or not _close(self._events[index].time, time):
                return RejectReason.ORPHAN_CONTINUATION
            self._append_detail(index, body)
            return None
        return RejectReason.UNKNOWN_LINE

    def _aer_header(
        self, host: str, time: datetime, bdf: str, header: re.Match[str], line: str
    ) -> RejectReason | None:
        severity = _aer_severity(header["sev"])
        detail = f"severity={header['sev'].strip()}" + (f", type={header['type'].strip()}" if header["type"] else "")
        # A root port's "error received from <bdf>" and the device's own header are one report.
        index = self._last_aer.get((host, bdf))
        if index is not None and index not in self._aer_merged:
            earlier = self._events[index]
            if (
                earlier.reporter_pci is not None
                and earlier.device_pci == bdf
                and earlier.severity in (severity, Severity.UNKNOWN)
                and _close(earlier.time, time)
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
        if body.startswith(_GHES_HEADER):
            self._drop_pending(self._ghes.get(key))
            self._ghes[key] = _GhesRecord(time=time, pending=1)
            return None
        record = self._ghes.get(key)
        if record is None or not _close(record.time, time):
            return RejectReason.ORPHAN_CONTINUATION
        section_type = _GHES_SECTION_TYPE.match(body)
        if section_type is not None:
            return self._ghes_section(host, record, section_type["type"].strip(), line)
        section = _GHES_SECTION.match(body)
        if section is not None:
            record.section_severity, record.event, record.in_section = _cper_severity(section["sev"]), None, False
            record.section_text = body
            record.pending += 1
            return None
        severity = _GHES_SEVERITY.match(body)
        if severity is not None and not record.in_section:
            record.severity, record.severity_text = _cper_severity(severity["sev"]), body
            record.pending += 1
            return None
        if record.event is not None:
            device = _GHES_DEVICE.match(body)
            if device is not None:
                self._set_ghes_device(host, record.event, canonical_pci(device["bdf"]))
            self._append_detail(record.event, body)
            return None
        if not record.in_section:
            # "It has been corrected by h/w ...", fru_id, fru_text, tstamp: part of the preamble.
            record.pending += 1
            return None
        return RejectReason.UNKNOWN_LINE

    def _ghes_section(self, host: str, record: "_GhesRecord", section_type: str, line: str) -> RejectReason | None:
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

    def _drop_pending(self, record: "_GhesRecord | None") -> None:
        if record is not None and record.pending:
            self._rejects[RejectReason.UNKNOWN_LINE] += record.pending
            record.pending = 0

    # -- OOM killer -------------------------------------------------------------------------------

    def _oom(self, host: str, time: datetime, msg: str, line: str) -> RejectReason | None:
        match = _OOM.search(msg) or _OOM_KILLED.match(msg) or _OOM_SUMMARY.match(msg)
        if match is None:
            # "Out of memory" with no killed process: the kill line, if any, follows.
            return RejectReason.MALFORMED_SIGNAL if "Kill" in msg else RejectReason.UNKNOWN_LINE
        pid = _small_int(match["pid"])
        if pid is None:
            return RejectReason.MALFORMED_SIGNAL
        comm = match["comm"].strip() or None
        previous = self._last_oom.get((host, pid))
        if previous is not None and _close(self._events[previous].time, time):
            # The same kill reported again (summary line, then the "Killed process" line).
            earlier = self._events[previous]
            if earlier.comm is None and comm is not None:
                self._events[previous] = earlier.model_copy(update={"comm": comm})
            self._continuations += 1
            return None
        self._last_oom[(host, pid)] = len(self._events)
        cgroup = "Memory cgroup" in msg or "CONSTRAINT_MEMCG" in msg
        self._events.append(
            HardwareEvent(
                host=host,
                kind=SignalKind.OOM,
                time=time,
                severity=Severity.FATAL,
                pid=pid,
                comm=comm,
                detail="cgroup OOM kill" if cgroup else "OOM kill",
                source=SignalSource.KERNEL_LOG,
                line=line,
            )
        )
        return None


@dataclass
class _GhesRecord:
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


def _cper_severity(text: str) -> Severity:
    # "info" is not an error severity at all: the record does not say how bad it is.
    return _CPER_SEVERITY.get(text.strip().lower(), Severity.UNKNOWN)


def _parse_time(text: str) -> datetime | None:
    """``2026-11-29T18:45:02+0000`` (or ``+00:00``, fractions, ``Z``) to an aware datetime."""
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    # A time without an offset cannot be placed against the dumps' UTC times.
    if parsed.tzinfo is None:
        return None
    try:
        return to_utc(parsed)
    except ValueError:
        # "0001-01-01T00:00:00+0100" is valid ISO but lies before year 1 in UTC: garbage, not a crash.
        return None


def _aer_severity(text: str) -> Severity:
    """Loose: "Uncorrectable (Fatal)", "Uncorrected (Non-Fatal)", "Corrected", "Correctable"."""
    lowered = text.lower()
    if "non-fatal" in lowered or "nonfatal" in lowered:
        return Severity.NON_FATAL
    if "fatal" in lowered:
        return Severity.FATAL
    if "uncorrect" in lowered:
        return Severity.UNKNOWN
    if "correct" in lowered:
        return Severity.CORRECTABLE
    return Severity.UNKNOWN


def _close(a: datetime, b: datetime) -> bool:
    return abs(b - a) <= _SAME_REPORT


def _small_int(text: str) -> int | None:
    # pids and link numbers are small; a 40-digit "pid" is garbage, not a process.
    return int(text) if len(text) <= 10 else None
