"""What every telemetry line reader shares (the kernel log's and the node collector's JSON
lines): the events, GPUs and hosts read so far, the count of lines and of each reason a line
yielded nothing, and a line's first checks. A reader never raises on a line: a bad one is counted.
"""

from __future__ import annotations

from collections import Counter

from denpex.hardware.events import GpuIdentity, HardwareEvent, RejectReason
from denpex.hardware.xid_catalog import XidCatalog, default_xid_catalog

__all__ = ["LineReader", "MAX_LINE_CHARS"]

# Longer lines are not parsed at all: real kernel lines are far shorter, and it bounds regex work.
MAX_LINE_CHARS = 8192


class LineReader:
    """Feed it lines; a subclass reads each one (``_read_line``) and says why it yielded nothing."""

    def __init__(self, *, catalog: XidCatalog | None = None) -> None:
        self._catalog = catalog or default_xid_catalog()
        self._events: list[HardwareEvent] = []
        self._gpus: list[GpuIdentity] = []
        self._hosts: set[str] = set()
        self._rejects: Counter[RejectReason] = Counter()
        self._lines = 0

    def feed(self, raw: str) -> None:
        """Read one line (with or without its newline); a blank one is not counted."""
        line = self._line_of(raw)
        if not line.strip():
            return
        self._lines += 1
        if len(line) > MAX_LINE_CHARS:
            self._rejects[RejectReason.LINE_TOO_LONG] += 1
            return
        reason = self._read_line(line)
        if reason is not None:
            self._rejects[reason] += 1

    def _line_of(self, raw: str) -> str:
        return raw.strip()

    def _read_line(self, line: str) -> RejectReason | None:
        raise NotImplementedError
