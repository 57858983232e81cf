"""The NVML collector behind ``denpex collect-telemetry``: runs on a GPU host, writes JSON lines.

    init -> identity of every GPU (UUID, PCI bus id, index, PCIe bridges from sysfs)
         -> snapshot 0 (NVLink state and error counters per link, remapped rows)
         -> listen for Xid critical-error events for ``duration_s``
         -> snapshot 1 -> shutdown

Every record is flushed as it is written, so a collector killed half-way still leaves what it saw.
A call the GPU does not support (``NVMLError_NotSupported``) or that fails is written as a
``not_available`` record: "not available" is never reported as "healthy".

The ``nvml`` argument is the ``pynvml`` module (``nvidia-ml-py``) or any object with the same
functions and exception classes; tests pass a fake at that boundary.
"""

from __future__ import annotations

import ctypes
import time as _time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import Any, TextIO

from pydantic import BaseModel

from denpex.hardware.errors import NvmlUnavailableError
from denpex.hardware.events import GpuRef
from denpex.hardware.pci import canonical_pci
from denpex.hardware.records import (
    GpuRecord,
    NotAvailableRecord,
    NvLinkCounter,
    NvLinkRecord,
    RemappedRowsRecord,
    SessionRecord,
    XidRecord,
    dump_record,
)

__all__ = ["CollectionSummary", "collect_telemetry", "load_pynvml", "SYSFS_PCI_DEVICES"]

SYSFS_PCI_DEVICES = Path("/sys/bus/pci/devices")
# pynvml's constant names for the counters we read.
_COUNTER_CONSTANTS = {
    NvLinkCounter.DL_REPLAY: "NVML_NVLINK_ERROR_DL_REPLAY",
    NvLinkCounter.DL_RECOVERY: "NVML_NVLINK_ERROR_DL_RECOVERY",
    NvLinkCounter.CRC_FLIT: "NVML_NVLINK_ERROR_DL_CRC_FLIT",
    NvLinkCounter.CRC_DATA: "NVML_NVLINK_ERROR_DL_CRC_DATA",
}


class CollectionSummary(BaseModel):
    """What one collection wrote, for the command's one-line report."""

    gpus: int = 0
    xid_events: int = 0
    unavailable: int = 0
    records: int = 0


def load_pynvml() -> ModuleType:
    """Import ``pynvml``; a missing package is an ``NvmlUnavailableError`` naming the fix."""
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlUnavailableError(
            "pynvml is not installed: pip install nvidia-ml-py (or denpex[collector])"
        ) from exc
    return pynvml


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


class _Writer:
    """Writes records to ``out`` and keeps the counts."""

    def __init__(self, out: TextIO, host: str, clock: Callable[[], datetime]) -> None:
        self.out, self.host, self.clock = out, host, clock
        self.summary = CollectionSummary()
        self._gaps_written: set[tuple[str, GpuRef | None, int | None, str]] = set()

    def write(self, record_type: type[BaseModel], **fields: Any) -> None:
        record = record_type(host=self.host, time=self.clock(), **fields)
        self.out.write(dump_record(record) + "\n")
        self.out.flush()
        self.summary.records += 1
        if isinstance(record, NotAvailableRecord):
            self.summary.unavailable += 1
        elif isinstance(record, XidRecord):
            self.summary.xid_events += 1
        elif isinstance(record, GpuRecord):
            self.summary.gpus += 1

    def gap(self, what: str, exc: BaseException, gpu: GpuRef | None = None, link: int | None = None) -> None:
        detail = _error_text(exc)
        key = (what, gpu, link, detail)
        # The second snapshot meets the same unsupported calls; only a new failure is news.
        if key not in self._gaps_written:
            self._gaps_written.add(key)
            self.write(NotAvailableRecord, what=what, detail=detail, gpu=gpu, link=link)


def collect_telemetry(
    out: TextIO,
    *,
    duration_s: float,
    host: str,
    nvml: Any,
    clock: Callable[[], datetime] = _utc_now,
    monotonic: Callable[[], float] = _time.monotonic,
    sleep: Callable[[float], None] = _time.sleep,
    sysfs_pci: Path | None = SYSFS_PCI_DEVICES,
    poll_s: float = 1.0,
) -> CollectionSummary:
    """Snapshot, listen for Xid events for ``duration_s`` seconds, snapshot again; write JSON lines."""
    writer = _Writer(out, host, clock)
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        writer.gap("nvml", exc)
        raise NvmlUnavailableError(
            f"NVML did not initialise on {host}: {_error_text(exc)}; check the NVIDIA driver and device access"
        ) from exc
    try:
        writer.write(SessionRecord, phase="start", duration_s=duration_s, driver_version=_optional(nvml, "nvmlSystemGetDriverVersion"))
        devices = _identify(nvml, writer, sysfs_pci)
        _snapshot(nvml, writer, devices, 0)
        _listen(nvml, writer, devices, duration_s, monotonic=monotonic, sleep=sleep, poll_s=poll_s)
        _snapshot(nvml, writer, devices, 1)
        writer.write(SessionRecord, phase="end", duration_s=duration_s)
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass  # nothing left to do with a library that will not shut down cleanly
    return writer.summary


def _identify(nvml: Any, writer: _Writer, sysfs_pci: Path | None) -> list[tuple[Any, GpuRef]]:
    try:
        count = nvml.nvmlDeviceGetCount()
    except nvml.NVMLError as exc:
        writer.gap("gpu_count", exc)
        return []
    if count == 0:
        # E.g. a container started without GPU access: nothing was read, which is not "healthy".
        writer.write(NotAvailableRecord, what="gpus", detail="NVML lists no GPUs on this host")
    devices = []
    for index in range(count):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except nvml.NVMLError as exc:
            writer.gap("gpu", exc, gpu=GpuRef(index=index))
            continue
        uuid = _text(_call(nvml, writer, "gpu_uuid", GpuRef(index=index), nvml.nvmlDeviceGetUUID, handle))
        pci_info = _call(nvml, writer, "gpu_pci_bus_id", GpuRef(index=index), nvml.nvmlDeviceGetPciInfo, handle)
        pci = canonical_pci(getattr(pci_info, "busId", None)) if pci_info is not None else None
        gpu = GpuRef(index=index, uuid=uuid, pci_bus_id=pci)
        path = _pcie_path(sysfs_pci, pci)
        if path is None:
            writer.write(NotAvailableRecord, what="pcie_path", detail="no sysfs entry for the GPU", gpu=gpu)
        writer.write(GpuRecord, gpu=gpu, name=_text(_optional(nvml, "nvmlDeviceGetName", handle)), pcie_path=path)
        devices.append((handle, gpu))
    return devices


def _snapshot(nvml: Any, writer: _Writer, devices: list[tuple[Any, GpuRef]], snapshot: int) -> None:
    for handle, gpu in devices:
        _nvlink_snapshot(nvml, writer, handle, gpu, snapshot)
        rows = _call(nvml, writer, "remapped_rows", gpu, nvml.nvmlDeviceGetRemappedRows, handle)
        if rows is not None:
            correctable, uncorrectable, pending, failure = rows
            writer.write(
                RemappedRowsRecord,
                snapshot=snapshot,
                gpu=gpu,
                correctable=int(correctable),
                uncorrectable=int(uncorrectable),
                pending=bool(pending),
                failure=bool(failure),
            )


def _nvlink_snapshot(nvml: Any, writer: _Writer, handle: Any, gpu: GpuRef, snapshot: int) -> None:
    for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except nvml.NVMLError_NotSupported as exc:
            if link == 0:
                writer.gap("nvlink", exc, gpu=gpu)  # no NVLink on this GPU: unknown, not healthy
            return
        except nvml.NVMLError_InvalidArgument:
            return  # past the GPU's last link
        except nvml.NVMLError_GpuIsLost as exc:
            writer.gap("nvlink", exc, gpu=gpu)  # the GPU is gone: one record, not one per link
            return
        except nvml.NVMLError as exc:
            writer.gap("nvlink", exc, gpu=gpu, link=link)
            continue
        active = bool(state)
        counters: dict[NvLinkCounter, int] = {}
        if active:
            for counter, constant in _COUNTER_CONSTANTS.items():
                try:
                    counters[counter] = int(nvml.nvmlDeviceGetNvLinkErrorCounter(handle, link, getattr(nvml, constant)))
                except nvml.NVMLError as exc:
                    writer.gap(f"nvlink_{counter.value}", exc, gpu=gpu, link=link)
        writer.write(NvLinkRecord, snapshot=snapshot, gpu=gpu, link=link, active=active, counters=counters)


def _listen(
    nvml: Any,
    writer: _Writer,
    devices: list[tuple[Any, GpuRef]],
    duration_s: float,
    *,
    monotonic: Callable[[], float],
    sleep: Callable[[float], None],
    poll_s: float,
) -> None:
    deadline = monotonic() + duration_s
    try:
        event_set = nvml.nvmlEventSetCreate()
    except nvml.NVMLError as exc:
        writer.gap("xid_events", exc)
        _sleep_until(deadline, monotonic, sleep)  # the second snapshot still shows counter changes
        return
    try:
        registered = 0
        for handle, gpu in devices:
            try:
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, event_set)
                registered += 1
            except nvml.NVMLError as exc:
                writer.gap("xid_events", exc, gpu=gpu)
        while registered and (remaining := deadline - monotonic()) > 0:
            try:
                data = nvml.nvmlEventSetWait_v2(event_set, max(1, int(min(remaining, poll_s) * 1000)))
            except nvml.NVMLError_Timeout:
                continue
            except nvml.NVMLError as exc:
                writer.gap("xid_events", exc)
                break
            if int(data.eventType) & int(nvml.nvmlEventTypeXidCriticalError):
                writer.write(XidRecord, gpu=_gpu_of(data.device, devices), code=int(data.eventData))
        _sleep_until(deadline, monotonic, sleep)
    finally:
        try:
            nvml.nvmlEventSetFree(event_set)
        except nvml.NVMLError:
            pass  # the set dies with the NVML session anyway


def _gpu_of(handle: Any, devices: list[tuple[Any, GpuRef]]) -> GpuRef | None:
    key = _handle_key(handle)
    for known, gpu in devices:
        if known is handle or _handle_key(known) == key:
            return gpu
    return None


def _handle_key(handle: Any) -> object:
    # NVML hands back a fresh ctypes pointer for the same device; compare the address it holds.
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return id(handle)


def _pcie_path(sysfs_pci: Path | None, pci: str | None) -> list[str] | None:
    """The bridges above the GPU, root port first, read from the sysfs device path."""
    if sysfs_pci is None or pci is None:
        return None
    try:
        resolved = (sysfs_pci / pci).resolve(strict=True)
    except OSError:
        return None
    addresses = [canonical_pci(part) for part in resolved.parts if part.count(":") == 2]
    return [a for a in addresses if a is not None and a != pci]


def _sleep_until(deadline: float, monotonic: Callable[[], float], sleep: Callable[[float], None]) -> None:
    remaining = deadline - monotonic()
    if remaining > 0:
        sleep(remaining)


def _call(nvml: Any, writer: _Writer, what: str, gpu: GpuRef, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, or ``None`` after writing a not_available record for ``what``."""
    try:
        return fn(*args)
    except nvml.NVMLError as exc:
        writer.gap(what, exc, gpu=gpu)
        return None


def _optional(nvml: Any, name: str, *args: Any) -> Any:
    """A nice-to-have value (driver version, GPU name); ``None`` when unavailable."""
    try:
        return getattr(nvml, name)(*args)
    except (nvml.NVMLError, AttributeError):
        return None


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def _error_text(exc: BaseException) -> str:
    # str() of an NVMLError may itself call into NVML for unknown codes; keep a fallback.
    try:
        return str(exc) or type(exc).__name__
    except Exception:  # noqa: BLE001 - any failure here must not hide the original error
        return type(exc).__name__
