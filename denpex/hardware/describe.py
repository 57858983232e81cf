"""One line of text per hardware entry, for the text report.

    >>> from datetime import datetime, timezone
    >>> from denpex.analysis.models import CandidateHardware, HardwareBearing
    >>> describe_hardware(CandidateHardware(
    ...     kind="xid", code=79, time=datetime(2026, 11, 29, 18, 45, 2, tzinfo=timezone.utc),
    ...     summary="Xid 79 (GPU has fallen off the bus; reboot_node) on this rank's GPU 0000:3b:00.0: "
    ...             "consistent with a hardware fault",
    ...     bearing=HardwareBearing.SUPPORTS_HARDWARE_FAULT, host="gpu-node-002", gpu="0000:3b:00.0"))
    "[supports a hardware fault] 2026-11-29T18:45:02Z gpu-node-002: Xid 79 (GPU has fallen off the bus; reboot_node) on this rank's GPU 0000:3b:00.0: consistent with a hardware fault"
"""

from __future__ import annotations

from denpex.analysis.models import CandidateHardware, HardwareBearing

__all__ = ["describe_hardware", "BEARING_PHRASES"]

# Phrases chosen so that no line claims a root cause: "supports", "consistent with".
BEARING_PHRASES = {
    HardwareBearing.SUPPORTS_HARDWARE_FAULT: "supports a hardware fault",
    HardwareBearing.POINTS_AT_APPLICATION: "consistent with an application error",
    HardwareBearing.EXPLAINS_MISSING_DUMP: "consistent with the missing dump",
    HardwareBearing.UNRELATED: "unrelated",
}


def describe_hardware(c: CandidateHardware) -> str:
    """``[bearing] time host: summary`` for one hardware entry."""
    when = c.time.isoformat().replace("+00:00", "Z") if c.time else "time unknown"
    where = f" {c.host}" if c.host else ""
    return f"[{BEARING_PHRASES[c.bearing]}] {when}{where}: {c.summary}"
