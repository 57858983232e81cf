"""Read telemetry files: kernel log text and collector JSON lines, mixed freely.

A line whose first non-blank character is ``{`` is a collector record; every other line is read as
kernel log text. So a file may be a ``journalctl -k -o short-iso`` capture, a
``denpex collect-telemetry`` output, or both concatenated.

    >>> result = parse_telemetry_lines([
    ...     "2026-11-29T18:45:02+00:00 gpu-node-002 kernel: Out of memory: Killed process 4242 (python) total-vm:1kB",
    ...     '{"v": 1, "type": "xid", "host": "gpu-node-003", "time": "2026-11-29T18:45:05Z", "code": 13}',
    ...     "garbage",
    ... ])
    >>> [(e.kind.value, e.host) for e in result.events]
    [('oom', 'gpu-node-002'), ('xid', 'gpu-node-003')]
    >>> result.rejected
    1
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from denpex.hardware.collector_log import CollectorLogReader
from denpex.hardware.errors import TelemetryFileError
from denpex.hardware.events import TelemetryParseResult
from denpex.hardware.kernel_log import KernelLogReader
from denpex.hardware.xid_catalog import XidCatalog

__all__ = ["parse_telemetry_lines", "load_telemetry", "MAX_TELEMETRY_FILE_BYTES"]

# A week of a busy node's kernel log is a few hundred MiB at most; beyond this, the file is wrong.
MAX_TELEMETRY_FILE_BYTES = 1024 * 1024 * 1024


def parse_telemetry_lines(
    lines: Iterable[str], *, source: str = "<text>", catalog: XidCatalog | None = None
) -> TelemetryParseResult:
    """Parse kernel log lines and collector JSON lines from one source, in any mix."""
    kernel = KernelLogReader(catalog=catalog)
    collector = CollectorLogReader(catalog=catalog)
    for line in lines:
        if line.lstrip().startswith("{"):
            collector.feed(line)
        else:
            kernel.feed(line)
    merged = kernel.result().merged(collector.result())
    return merged.model_copy(update={"sources": [source]})


def load_telemetry(paths: list[Path], *, catalog: XidCatalog | None = None) -> TelemetryParseResult:
    """Read every telemetry file (``--telemetry FILE``, repeatable) into one result.

    Bad lines are counted, never fatal. A file that cannot be opened at all raises
    ``TelemetryFileError`` naming the file, since the user asked for it explicitly.
    """
    result = TelemetryParseResult()
    for path in paths:
        try:
            if path.is_dir():
                raise TelemetryFileError(f"{path}: is a folder; pass the telemetry files inside it")
            size = path.stat().st_size
            if size > MAX_TELEMETRY_FILE_BYTES:
                raise TelemetryFileError(
                    f"{path}: {size} bytes, over the {MAX_TELEMETRY_FILE_BYTES}-byte cap; "
                    "cut it to the hours around the hang (journalctl --since/--until)"
                )
            # Undecodable bytes become U+FFFD: the line is then counted as unknown, not fatal.
            # utf-8-sig drops a leading byte-order mark, which would otherwise spoil line one.
            with path.open("r", encoding="utf-8-sig", errors="replace", newline="") as handle:
                parsed = parse_telemetry_lines(handle, source=str(path), catalog=catalog)
        except OSError as exc:
            raise TelemetryFileError(
                f"{path}: cannot read telemetry file: {exc.strerror or exc}; check the path"
            ) from exc
        result = result.merged(parsed)
    return result
