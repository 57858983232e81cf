"""The kernel log reader: one line at a time, each line's prefix checked (time, host, and that the
kernel wrote it), then the message dispatched to the Xid, SXid, OOM or PCIe (``pcie.py``) reading."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from datetime import datetime

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
)
from denpex.hardware.kernel_log.patterns import (
    AER_DETAIL,
    DEVICE_PREFIX,
    GHES,
    GPU_AT,
    LINK,
    MAX_CODE,
    NAME,
    OOM,
    OOM_KILLED,
    OOM_SUMMARY,
    PID,
    PREFIX,
    PRINTK_TIME,
    RECOVERY,
    SXID,
    XID,
    XID_PCI,
    parse_time,
    same_report,
    small_int,
)
from denpex.hardware.kernel_log.pcie import PcieReading
from denpex.hardware.line_reader import LineReader
from denpex.hardware.pci import canonical_pci
from denpex.hardware.xid_catalog import XidCatalog

__all__ = ["parse_kernel_log", "KernelLogReader"]


def parse_kernel_log(
    lines: Iterable[str], *, catalog: XidCatalog | None = None
) -> TelemetryParseResult:
    """Parse kernel log lines into events; every line that yields nothing is counted by reason."""
    reader = KernelLogReader(catalog=catalog)
    for line in lines:
        reader.feed(line)
    return reader.result()



class KernelLogReader(PcieReading, LineReader):
    """Line-at-a-time kernel log parser. State only links detail lines to the report they belong to."""

    def __init__(self, *, catalog: XidCatalog | None = None) -> None:
        super().__init__(catalog=catalog)
        self._spans: dict[str, tuple[datetime, datetime]] = {}
        self._continuations = 0
        # Index into _events of the last AER event per (host, device), the last SXid per
        # (host, switch, code) and the last OOM kill per (host, pid).
        self._last_aer = {}
        self._last_sxid: dict[tuple[str, str, int], int] = {}
        self._last_oom: dict[tuple[str, int], int] = {}
        self._aer_merged = set()
        self._ghes = {}
        self._last_ghes = {}

    def _line_of(self, raw: str) -> str:
        return raw.rstrip("\r\n")  # leading blanks are the message's own

    def _read_line(self, line: str) -> RejectReason | None:
        prefix = PREFIX.match(line)
        if prefix is None:
            return RejectReason.NO_PREFIX
        time = parse_time(prefix["ts"])
        if time is None:
            return RejectReason.BAD_TIME
        if prefix["ident"] != "kernel":
            # `logger "NVRM: Xid ... 79"` or `myapp[123]: NVRM: Xid ...` is a program's text, not
            # the driver's report: it must never support a drain.
            return RejectReason.NOT_KERNEL
        host = prefix["host"]
        self._hosts.add(host)
        first, last = self._spans.get(host, (time, time))
        self._spans[host] = (min(first, time), max(last, time))
        msg = PRINTK_TIME.sub("", prefix["msg"], count=1).strip()
        return self._read_message(host, time, msg, line[:MAX_SOURCE_LINE_CHARS])

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
        ghes = GHES.match(msg)
        if ghes is not None:
            return self._ghes_line(host, time, ghes, line)
        device = DEVICE_PREFIX.match(msg)
        if device is not None and ("AER" in msg or "PCIe Bus Error" in msg or AER_DETAIL.match(device["body"])):
            return self._aer(host, time, device, line)
        return RejectReason.UNKNOWN_LINE

    # -- Xid --------------------------------------------------------------------------------------

    def _xid(self, host: str, time: datetime, msg: str, line: str) -> RejectReason | None:
        match = XID.search(msg)
        if match is None or len(match["code"]) > 7 or int(match["code"]) > MAX_CODE:
            return RejectReason.MALFORMED_SIGNAL
        code = int(match["code"])
        pci_match = XID_PCI.search(msg)
        pci = canonical_pci(pci_match["pci"]) if pci_match else None
        rest = match["rest"]
        recovery = RECOVERY.search(rest)
        action = int(recovery["to"], 16) if recovery else None
        pid_match, name_match = PID.search(rest), NAME.search(rest)
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
                pid=small_int(pid_match["pid"]) if pid_match else None,
                comm=comm if comm and comm != "<unknown>" else None,
                detail=detail[:MAX_SOURCE_LINE_CHARS],
                source=SignalSource.KERNEL_LOG,
                line=line,
            )
        )
        return None

    def _gpu_at(self, host: str, time: datetime, msg: str) -> RejectReason | None:
        match = GPU_AT.search(msg)
        pci = canonical_pci(match["pci"]) if match else None
        if match is None or pci is None:
            return RejectReason.MALFORMED_SIGNAL
        self._gpus.append(GpuIdentity(host=host, gpu=GpuRef(pci_bus_id=pci, uuid=match["uuid"]), time=time))
        return None

    # -- SXid -------------------------------------------------------------------------------------

    def _sxid(self, host: str, time: datetime, msg: str, line: str) -> RejectReason | None:
        match = SXID.search(msg)
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
        if severity is Severity.UNKNOWN and previous is not None and same_report(self._events[previous].time, time):
            self._continuations += 1
            return None
        link = LINK.search(rest)
        self._last_sxid[key] = len(self._events)
        self._events.append(
            HardwareEvent(
                host=host,
                kind=SignalKind.SXID,
                time=time,
                severity=severity,
                code=code,
                device_pci=pci,
                link=small_int(link["link"]) if link else None,
                detail=rest[:MAX_SOURCE_LINE_CHARS],
                source=SignalSource.KERNEL_LOG,
                line=line,
            )
        )
        return None

    # -- OOM killer -------------------------------------------------------------------------------

    def _oom(self, host: str, time: datetime, msg: str, line: str) -> RejectReason | None:
        match = OOM.search(msg) or OOM_KILLED.match(msg) or OOM_SUMMARY.match(msg)
        if match is None:
            # "Out of memory" with no killed process: the kill line, if any, follows.
            return RejectReason.MALFORMED_SIGNAL if "Kill" in msg else RejectReason.UNKNOWN_LINE
        pid = small_int(match["pid"])
        if pid is None:
            return RejectReason.MALFORMED_SIGNAL
        comm = match["comm"].strip() or None
        previous = self._last_oom.get((host, pid))
        if previous is not None and same_report(self._events[previous].time, time):
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
