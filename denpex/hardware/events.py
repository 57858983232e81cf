"""Normalised hardware and host events, and what a telemetry parse returns.

Every parser (kernel log, NVML collector lines) produces the same ``HardwareEvent``: where (host,
GPU or PCI device), what (kind, code, severity), when (UTC), and the line it came from. Lines that
say nothing usable are counted per ``RejectReason``, never raised.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timezone
from enum import StrEnum

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator

from denpex.hardware.pci import canonical_pci

__all__ = [
    "SignalKind",
    "Severity",
    "SignalSource",
    "GpuRef",
    "HardwareEvent",
    "GpuIdentity",
    "Unavailable",
    "RejectReason",
    "TelemetryParseResult",
    "MAX_SOURCE_LINE_CHARS",
    "to_utc",
]

# Kept lines are evidence for a human; a few hundred characters show everything that matters.
MAX_SOURCE_LINE_CHARS = 1000


class SignalKind(StrEnum):
    """The kind of signal; the first five are the ``candidates[].hardware[].kind`` contract values."""

    XID = "xid"
    """An NVIDIA driver Xid error on one GPU (kernel log or NVML event)."""
    SXID = "sxid"
    """An NVSwitch SXid error: the node's NVLink fabric, not one GPU."""
    NVLINK = "nvlink"
    """NVLink error counters that rose between two NVML snapshots, or a link that went down."""
    PCIE_AER = "pcie_aer"
    """A PCIe Advanced Error Reporting message about a device or the port above it."""
    OOM = "oom"
    """The kernel OOM killer (global or cgroup) killed a process."""
    ROW_REMAP = "row_remap"
    """GPU memory row remapping: a failure, new uncorrectable errors, or a pending remap."""


class Severity(StrEnum):
    """How bad the event is by its own account, before any correlation."""

    FATAL = "fatal"
    """The device or link cannot continue without a reset (fatal AER, fatal SXid, reset/reboot Xid)."""
    NON_FATAL = "non_fatal"
    """An uncorrected error the device survived, or an Xid that needs no reset."""
    CORRECTABLE = "correctable"
    """Corrected by hardware (corrected AER, link replays); a trend signal only."""
    UNKNOWN = "unknown"
    """The source does not say, and the catalog does not know the code."""


class SignalSource(StrEnum):
    """Where an event was read."""

    KERNEL_LOG = "kernel_log"
    """A ``journalctl -k -o short-iso`` line."""
    NVML = "nvml"
    """A JSON line written by ``denpex collect-telemetry``."""


class GpuRef(BaseModel):
    """Whatever identifies a GPU in one source. The PCI address is stored in canonical form."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pci_bus_id: str | None = None
    uuid: str | None = None
    index: int | None = Field(default=None, ge=0)

    @field_validator("pci_bus_id", mode="before")
    @classmethod
    def _canonical(cls, value: object) -> object:
        if value is None or not isinstance(value, (str, bytes)):
            return value
        canonical = canonical_pci(value)
        if canonical is None:
            raise ValueError(f"not a PCI address: {value!r}")
        return canonical

    def label(self) -> str:
        """A short human name: the PCI address if known, else the UUID, else the index."""
        if self.pci_bus_id:
            return self.pci_bus_id
        if self.uuid:
            return self.uuid
        return f"index {self.index}" if self.index is not None else "unknown GPU"


def to_utc(value: datetime) -> datetime:
    """``value`` in UTC; ``ValueError`` when that leaves the calendar (``0001-01-01T00:00+01:00``)."""
    # Every time is compared in UTC; the parsers already refuse times without an offset.
    try:
        return value.astimezone(timezone.utc)
    except OverflowError as exc:
        raise ValueError(f"time {value.isoformat()} is outside the UTC calendar") from exc


class HardwareEvent(BaseModel):
    """One normalised hardware or host event.

    Example, from ``2026-11-29T18:45:02+0000 gpu-node-002 kernel: NVRM: Xid (PCI:0000:3b:00): 79,
    pid=4242, name=python, GPU has fallen off the bus.``::

        HardwareEvent(host="gpu-node-002", gpu=GpuRef(pci_bus_id="0000:3b:00.0"), kind="xid",
                      code=79, severity="fatal", time=2026-11-29T18:45:02Z, pid=4242,
                      comm="python", detail="GPU has fallen off the bus.", ...)
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str | None
    kind: SignalKind
    time: AwareDatetime
    # For a change seen between two readings (NVLink counters, remapped rows): the earlier
    # reading's time. The change happened somewhere after ``since`` and by ``time``.
    since: AwareDatetime | None = None
    severity: Severity = Severity.UNKNOWN
    code: int | None = None
    gpu: GpuRef | None = None
    # The PCI device a non-GPU line names: the AER device (or the device a root port received
    # the error from), or the NVSwitch of an SXid.
    device_pci: str | None = None
    # The root port that logged an AER "error received from <device>" message.
    reporter_pci: str | None = None
    link: int | None = None
    pid: int | None = None
    comm: str | None = None
    # Xid 154: the recovery action the driver now requires, numbered as NVML's
    # nvmlDeviceGpuRecoveryAction_t (0 none, 1 GPU reset, 2 node reboot, ...). The catalog reads it.
    recovery_action: int | None = Field(default=None, ge=0)
    detail: str = ""
    source: SignalSource
    line: str = Field(default="", max_length=MAX_SOURCE_LINE_CHARS)

    @field_validator("time", "since")
    @classmethod
    def _to_utc(cls, value: datetime | None) -> datetime | None:
        return to_utc(value) if value is not None else None


class GpuIdentity(BaseModel):
    """What the NVML collector (or an ``NVRM: GPU at PCI:...`` line) says about one GPU on a host."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str | None
    gpu: GpuRef
    name: str | None = None
    # PCI addresses of the bridges above the GPU, root port first; None when not known.
    pcie_path: tuple[str, ...] | None = None
    time: AwareDatetime | None = None


class Unavailable(BaseModel):
    """A signal the collector could not read: "not available", which never means "healthy"."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str | None
    what: str
    detail: str
    gpu: GpuRef | None = None
    link: int | None = None
    time: AwareDatetime | None = None


class RejectReason(StrEnum):
    """Why a telemetry line produced nothing. Rejects are counted, never fatal."""

    NO_PREFIX = "no_prefix"
    """Not in ``TIME HOST IDENT: message`` form (syslog dates, raw dmesg, journal banners)."""
    BAD_TIME = "bad_time"
    """The timestamp does not parse or has no UTC offset, so it cannot be placed in the window."""
    NOT_KERNEL = "not_kernel"
    """Written by a user-space program (its identifier is not ``kernel``): any program can log a
    line shaped like an Xid, so only the kernel's own lines carry hardware signals."""
    UNKNOWN_LINE = "unknown_line"
    """A well-formed kernel line about something else (most kernel lines)."""
    MALFORMED_SIGNAL = "malformed_signal"
    """Looks like an Xid, SXid, AER or OOM line, but its code, address or pid cannot be read."""
    ORPHAN_CONTINUATION = "orphan_continuation"
    """An AER detail line, or a firmware (GHES) record line, with no report before it on that host."""
    LINE_TOO_LONG = "line_too_long"
    """Longer than the per-line cap; not read, to bound memory on hostile input."""
    BAD_JSON = "bad_json"
    """Starts like a collector JSON record but is not valid JSON."""
    UNKNOWN_RECORD = "unknown_record"
    """Valid JSON with a ``type`` the collector format does not define."""
    UNSUPPORTED_VERSION = "unsupported_version"
    """A collector record of a format version this Denpex does not read."""
    INVALID_RECORD = "invalid_record"
    """A collector record whose fields do not validate."""


class TelemetryParseResult(BaseModel):
    """Everything read from telemetry files: events, GPU identities, gaps, and counted rejects."""

    events: list[HardwareEvent] = Field(default_factory=list)
    gpus: list[GpuIdentity] = Field(default_factory=list)
    unavailable: list[Unavailable] = Field(default_factory=list)
    # Hosts that any well-formed line came from: telemetry "covers" them, even with no events.
    hosts: list[str] = Field(default_factory=list)
    kernel_log_spans: dict[str, tuple[datetime, datetime]] = Field(default_factory=dict)
    """Per host, the first and last time of the kernel log lines read from it: when that host's
    driver reports (Xid, AER) would have been seen. Other sources (a short NVML session) listen
    for a moment only, so only this span can show a GPU clean."""
    sources: list[str] = Field(default_factory=list)
    lines_read: int = 0
    # Lines folded into an event (AER details, SXid data, repeated OOM reports, and the other lines
    # of a firmware-first PCIe record: its header before the PCIe section and its data after it).
    continuation_lines: int = 0
    rejects: dict[RejectReason, int] = Field(default_factory=dict)

    @property
    def rejected(self) -> int:
        """How many lines were rejected, for every reason together."""
        return sum(self.rejects.values())

    def merged(self, other: "TelemetryParseResult") -> "TelemetryParseResult":
        """Both results in one (files are parsed one by one, then merged)."""
        rejects = Counter(self.rejects)
        rejects.update(other.rejects)
        return TelemetryParseResult(
            events=sorted([*self.events, *other.events], key=lambda e: e.time),
            gpus=[*self.gpus, *other.gpus],
            unavailable=[*self.unavailable, *other.unavailable],
            hosts=sorted({*self.hosts, *other.hosts}),
            kernel_log_spans=_merged_spans(self.kernel_log_spans, other.kernel_log_spans),
            sources=[*self.sources, *other.sources],
            lines_read=self.lines_read + other.lines_read,
            continuation_lines=self.continuation_lines + other.continuation_lines,
            rejects=dict(rejects),
        )


def _merged_spans(a: dict[str, tuple[datetime, datetime]],
                  b: dict[str, tuple[datetime, datetime]]) -> dict[str, tuple[datetime, datetime]]:
    """Both files' spans per host; two files of one host count as one span from first to last."""
    merged = dict(a)
    for host, (first, last) in b.items():
        seen = merged.get(host)
        merged[host] = (first, last) if seen is None else (min(seen[0], first), max(seen[1], last))
    return merged
