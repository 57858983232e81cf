"""A fake of the ``pynvml`` module boundary for the collector tests (no GPU in CI).

It implements the functions the collector calls, with the real module's constants and exception
classes (``pynvml.NVMLError_NotSupported`` etc.), ctypes device handles like the real library's,
and a virtual clock so that "listen for 30 s" takes no time. Unsupported features raise exactly
what NVML raises on such GPUs.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pynvml
import pytest

__all__ = ["FakeClock", "FakeGpu", "FakeNvml", "skip_if_nvml_works"]

START = datetime(2026, 11, 29, 18, 40, tzinfo=timezone.utc)


class FakeClock:
    """Virtual time: sleeping and waiting advance it instantly."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def wall(self) -> datetime:
        return START + timedelta(seconds=self.now)


@dataclass
class FakeGpu:
    """One GPU. ``links=None``: no NVLink (NotSupported). ``remapped=None``: no row remapper."""

    uuid: str
    bus_id: bytes  # as NVML gives it: 8-digit domain, upper case
    name: str = "NVIDIA H100 80GB HBM3"
    links: list[bool] | None = field(default_factory=lambda: [True, True])
    # (link, counter constant) -> (value before change_at, value after)
    counters: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    unsupported_counters: set[int] = field(default_factory=set)
    remapped: tuple[tuple[int, int, int, int], tuple[int, int, int, int]] | None = ((0, 0, 0, 0), (0, 0, 0, 0))
    events_supported: bool = True
    # From this virtual time on, every call about this GPU raises NVMLError_GpuIsLost (fell off the bus).
    lost_at: float | None = None


class FakeNvml:
    """Stands in for the ``pynvml`` module object."""

    NVMLError = pynvml.NVMLError
    NVMLError_NotSupported = pynvml.NVMLError_NotSupported
    NVMLError_Timeout = pynvml.NVMLError_Timeout
    NVMLError_InvalidArgument = pynvml.NVMLError_InvalidArgument
    NVMLError_GpuIsLost = pynvml.NVMLError_GpuIsLost
    nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError
    NVML_NVLINK_MAX_LINKS = pynvml.NVML_NVLINK_MAX_LINKS
    NVML_NVLINK_ERROR_DL_REPLAY = pynvml.NVML_NVLINK_ERROR_DL_REPLAY
    NVML_NVLINK_ERROR_DL_RECOVERY = pynvml.NVML_NVLINK_ERROR_DL_RECOVERY
    NVML_NVLINK_ERROR_DL_CRC_FLIT = pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT
    NVML_NVLINK_ERROR_DL_CRC_DATA = pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA

    def __init__(
        self,
        gpus: list[FakeGpu],
        clock: FakeClock,
        *,
        xids: Sequence[tuple[float, int, int]] = (),  # (at seconds, GPU index, Xid)
        change_at: float = 1.0,
        init_error: int | None = None,
        event_set_error: int | None = None,
        wait_error_at: float | None = None,
    ) -> None:
        self.gpus, self.clock, self.change_at = gpus, clock, change_at
        self.pending_xids = sorted(xids)
        self.init_error, self.event_set_error, self.wait_error_at = init_error, event_set_error, wait_error_at
        self.initialized = False
        self.shutdown_called = False
        self.freed = False
        self.registered: list[int] = []

    # -- lifecycle --
    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self.shutdown_called = True

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    # -- devices --
    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> ctypes.c_void_p:
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError_InvalidArgument()
        return ctypes.c_void_p(0x1000 + index)  # a fresh pointer object each call, as in NVML

    def _gpu(self, handle: ctypes.c_void_p) -> FakeGpu:
        gpu = self.gpus[_index(handle)]
        if gpu.lost_at is not None and self.clock.now >= gpu.lost_at:
            raise pynvml.NVMLError_GpuIsLost()
        return gpu

    def nvmlDeviceGetUUID(self, handle: ctypes.c_void_p) -> str:
        return self._gpu(handle).uuid

    def nvmlDeviceGetPciInfo(self, handle: ctypes.c_void_p) -> SimpleNamespace:
        return SimpleNamespace(busId=self._gpu(handle).bus_id)

    def nvmlDeviceGetName(self, handle: ctypes.c_void_p) -> str:
        return self._gpu(handle).name

    def _after(self) -> bool:
        return self.clock.now >= self.change_at

    def nvmlDeviceGetNvLinkState(self, handle: ctypes.c_void_p, link: int) -> int:
        links = self._gpu(handle).links
        if links is None:
            raise pynvml.NVMLError_NotSupported()
        if link >= len(links):
            raise pynvml.NVMLError_InvalidArgument()
        return int(links[link])

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: ctypes.c_void_p, link: int, counter: int) -> int:
        gpu = self._gpu(handle)
        if counter in gpu.unsupported_counters:
            raise pynvml.NVMLError_NotSupported()
        before, after = gpu.counters.get((link, counter), (0, 0))
        return after if self._after() else before

    def nvmlDeviceGetRemappedRows(self, handle: ctypes.c_void_p) -> tuple[int, int, int, int]:
        remapped = self._gpu(handle).remapped
        if remapped is None:
            raise pynvml.NVMLError_NotSupported()
        return remapped[1] if self._after() else remapped[0]

    # -- events --
    def nvmlEventSetCreate(self) -> object:
        if self.event_set_error is not None:
            raise pynvml.NVMLError(self.event_set_error)
        return object()

    def nvmlDeviceRegisterEvents(self, handle: ctypes.c_void_p, event_types: int, event_set: object) -> None:
        if not self._gpu(handle).events_supported:
            raise pynvml.NVMLError_NotSupported()
        self.registered.append(_index(handle))

    def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int) -> SimpleNamespace:
        horizon = self.clock.now + timeout_ms / 1000
        if self.wait_error_at is not None and horizon >= self.wait_error_at:
            self.clock.now = self.wait_error_at
            raise pynvml.NVMLError_GpuIsLost()
        if self.pending_xids and self.pending_xids[0][0] <= horizon:
            at, index, code = self.pending_xids.pop(0)
            self.clock.now = max(self.clock.now, at)
            return SimpleNamespace(device=ctypes.c_void_p(0x1000 + index),
                                   eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=code)
        self.clock.now = horizon
        raise pynvml.NVMLError_Timeout()

    def nvmlEventSetFree(self, event_set: object) -> None:
        self.freed = True


def _index(handle: ctypes.c_void_p) -> int:
    """The GPU index behind a handle of ``nvmlDeviceGetHandleByIndex`` (a NULL one is invalid)."""
    if handle.value is None:
        raise pynvml.NVMLError_InvalidArgument()
    return handle.value - 0x1000


def skip_if_nvml_works() -> None:
    """Skip a "no driver" test on a host where the real NVML initialises (a GPU machine)."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return
    pynvml.nvmlShutdown()
    pytest.skip("an NVIDIA driver is present here; scripts/check_nvml.py covers real GPUs")
