"""Hardware and host signals, lined up with the candidates of a triage.

    telemetry files --load_telemetry--> TelemetryParseResult (events, GPU identities, gaps, rejects)
    TriageResult + manifest + telemetry --correlate--> TriageResult with candidates[].hardware
    GPU host --collect_telemetry (NVML)--> JSON lines that load_telemetry reads

Modules: ``pci`` (address spelling), ``events`` (models), ``xid_catalog`` (+ ``xid_catalog.json``),
``kernel_log`` and ``collector_log`` (parsers), ``records`` (collector wire format), ``telemetry``
(file loading), ``placement`` (rank -> host/GPU), ``bearing`` (what an event means), ``correlate``,
``describe`` (text), ``nvml_collector``, ``errors``.
"""

from denpex.hardware.correlate import CorrelationOptions, HangWindow, correlate, hang_window, supports_isolation
from denpex.hardware.describe import describe_hardware
from denpex.hardware.errors import (
    CatalogError,
    CollectorError,
    HardwareError,
    NvmlUnavailableError,
    TelemetryFileError,
)
from denpex.hardware.events import (
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
from denpex.hardware.pci import canonical_pci
from denpex.hardware.telemetry import load_telemetry, parse_telemetry_lines
from denpex.hardware.xid_catalog import XidBucket, XidCatalog, XidEntry, default_xid_catalog, load_xid_catalog

__all__ = [
    "CorrelationOptions",
    "HangWindow",
    "correlate",
    "hang_window",
    "supports_isolation",
    "describe_hardware",
    "HardwareError",
    "CatalogError",
    "TelemetryFileError",
    "CollectorError",
    "NvmlUnavailableError",
    "GpuIdentity",
    "GpuRef",
    "HardwareEvent",
    "RejectReason",
    "Severity",
    "SignalKind",
    "SignalSource",
    "TelemetryParseResult",
    "Unavailable",
    "canonical_pci",
    "load_telemetry",
    "parse_telemetry_lines",
    "XidBucket",
    "XidCatalog",
    "XidEntry",
    "default_xid_catalog",
    "load_xid_catalog",
]
