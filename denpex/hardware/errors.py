"""Errors of the hardware layer. Unparseable telemetry lines are counted, never raised.

    HardwareError              anything this layer refuses
    ├── CatalogError           the Xid catalog file is unreadable or invalid
    ├── TelemetryFileError     a telemetry file cannot be read at all (missing, a folder, no access)
    └── CollectorError         the NVML collector cannot run
        └── NvmlUnavailableError   pynvml is missing, or NVML did not initialise on this host
"""

from __future__ import annotations

__all__ = [
    "HardwareError",
    "CatalogError",
    "TelemetryFileError",
    "CollectorError",
    "NvmlUnavailableError",
]


class HardwareError(Exception):
    """Something the hardware layer refuses; the message names the thing and the next step."""


class CatalogError(HardwareError):
    """The Xid catalog file is unreadable or invalid."""


class TelemetryFileError(HardwareError):
    """A telemetry file cannot be read at all; bad lines inside a readable file are only counted."""


class CollectorError(HardwareError):
    """The NVML collector cannot run."""


class NvmlUnavailableError(CollectorError):
    """pynvml is not installed, or NVML did not initialise (no driver, no GPU, no permission)."""
