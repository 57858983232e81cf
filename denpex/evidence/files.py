"""Writing evidence files whole (readers see the complete file or none of it), and reading them
within a cap."""

from __future__ import annotations

import os
import threading
from pathlib import Path

__all__ = ["write_atomic", "temporary_name", "read_at_most"]


def temporary_name(path: Path) -> Path:
    """Hidden and ending in ``.tmp``, unique per writer: evidence readers skip a leftover one."""
    return path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary name, flush it to disk, then rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(path)
    try:
        with tmp.open("wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def read_at_most(path: Path, max_bytes: int) -> bytes:
    """The file's first ``max_bytes + 1`` bytes: a longer result means the file is over its cap,
    and nothing past it was read. Raises OSError as ``open`` does."""
    with path.open("rb") as handle:
        return handle.read(max_bytes + 1)
