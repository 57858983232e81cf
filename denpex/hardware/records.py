"""The JSON-lines format written by ``denpex collect-telemetry`` and read by the telemetry parser.

One JSON object per line, each with ``v`` (format version), ``type``, ``host`` and ``time`` (UTC,
ISO 8601). Both sides use these models, so the writer and the reader cannot drift apart.

    {"v": 1, "type": "session", "host": "gpu-node-002", "time": "...", "phase": "start", "duration_s": 30}
    {"v": 1, "type": "gpu", "host": "gpu-node-002", "time": "...",
     "gpu": {"index": 0, "uuid": "GPU-5d1e...", "pci_bus_id": "0000:3b:00.0"},
     "name": "NVIDIA H100 80GB HBM3", "pcie_path": ["0000:00:01.0", "0000:01:00.0"]}
    {"v": 1, "type": "nvlink", ..., "snapshot": 0, "gpu": {...}, "link": 3, "active": true,
     "counters": {"dl_replay": 0, "dl_recovery": 2, "crc_flit": 0, "crc_data": 0}}
    {"v": 1, "type": "remapped_rows", ..., "snapshot": 0, "gpu": {...}, "correctable": 0,
     "uncorrectable": 1, "pending": false, "failure": false}
    {"v": 1, "type": "xid", ..., "gpu": {...}, "code": 79}
    {"v": 1, "type": "not_available", ..., "what": "nvlink", "gpu": {...}, "detail": "Not Supported"}

A ``not_available`` record says a signal could not be read. It is never a healthy reading.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Literal, Union

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, TypeAdapter, field_validator

from denpex.hardware.events import GpuRef, to_utc

__all__ = [
    "RECORD_VERSION",
    "NvLinkCounter",
    "SessionRecord",
    "GpuRecord",
    "NvLinkRecord",
    "RemappedRowsRecord",
    "XidRecord",
    "NotAvailableRecord",
    "TelemetryRecord",
    "RECORD_ADAPTER",
    "KNOWN_RECORD_TYPES",
    "dump_record",
]

RECORD_VERSION: Literal[1] = 1


class NvLinkCounter(StrEnum):
    """The NVLink data-link error counters the collector reads (NVML_NVLINK_ERROR_DL_*)."""

    DL_REPLAY = "dl_replay"
    """Flits replayed after an error: corrected by the link, a trend signal."""
    DL_RECOVERY = "dl_recovery"
    """Link recoveries: the link retrained after errors."""
    CRC_FLIT = "crc_flit"
    """Flow-control unit CRC errors."""
    CRC_DATA = "crc_data"
    """Data CRC errors."""


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    v: Literal[1] = RECORD_VERSION
    host: str
    time: AwareDatetime

    @field_validator("time")
    @classmethod
    def _to_utc(cls, value: datetime) -> datetime:
        # Valid ISO, but before year 1 or after 9999 in UTC: an invalid record, not a crash.
        return to_utc(value)


class SessionRecord(_Record):
    """Start or end of one collection; the span during which Xid events were listened for."""

    type: Literal["session"] = "session"
    phase: Literal["start", "end"]
    duration_s: float | None = Field(default=None, ge=0)
    driver_version: str | None = None


class GpuRecord(_Record):
    """A GPU's identity, and the PCI bridges above it when sysfs shows them."""

    type: Literal["gpu"] = "gpu"
    gpu: GpuRef
    name: str | None = None
    pcie_path: list[str] | None = None


class NvLinkRecord(_Record):
    """One link's state and error counters in one snapshot (0 before listening, 1 after)."""

    type: Literal["nvlink"] = "nvlink"
    snapshot: int = Field(ge=0)
    gpu: GpuRef
    link: int = Field(ge=0)
    active: bool | None = None
    counters: dict[NvLinkCounter, int] = Field(default_factory=dict)


class RemappedRowsRecord(_Record):
    """Row-remapper state of one GPU in one snapshot."""

    type: Literal["remapped_rows"] = "remapped_rows"
    snapshot: int = Field(ge=0)
    gpu: GpuRef
    correctable: int = Field(ge=0)
    uncorrectable: int = Field(ge=0)
    pending: bool
    failure: bool


class XidRecord(_Record):
    """An Xid critical-error event delivered by NVML while listening."""

    type: Literal["xid"] = "xid"
    gpu: GpuRef | None = None
    code: int = Field(ge=0)


class NotAvailableRecord(_Record):
    """A signal that could not be read (not supported, no permission, GPU lost): never "healthy"."""

    type: Literal["not_available"] = "not_available"
    what: str
    detail: str
    gpu: GpuRef | None = None
    link: int | None = Field(default=None, ge=0)


TelemetryRecord = Annotated[
    Union[SessionRecord, GpuRecord, NvLinkRecord, RemappedRowsRecord, XidRecord, NotAvailableRecord],
    Field(discriminator="type"),
]

RECORD_ADAPTER: TypeAdapter[TelemetryRecord] = TypeAdapter(TelemetryRecord)

KNOWN_RECORD_TYPES = frozenset({"session", "gpu", "nvlink", "remapped_rows", "xid", "not_available"})


def dump_record(record: BaseModel) -> str:
    """One JSON line (no newline) for a record, with times in UTC ISO form and no unset noise."""
    return record.model_dump_json(exclude_none=True)
