"""A memory ceiling around decoding untrusted bytes, so a tiny hostile file cannot take the host.

A 9-byte pickle whose one ``LONG_BINPUT`` names memo slot 2**26 makes CPython's C unpickler
allocate a 1 GiB memo table (2**30 would ask for 16 GiB) before anything can be checked, and no
unpickler hook runs first. Capping the process's data segment (``RLIMIT_DATA``) for the length
of the decode turns that allocation into a ``MemoryError`` the caller reports per file.

The cap is process-wide while it holds, so decodes are serialized by a lock. Unpickling holds
the GIL throughout, so that costs no parallelism; threads that allocate meanwhile share the
budget's headroom. Where the data segment cannot be read (not Linux), no cap is applied.
"""

from __future__ import annotations

import resource
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

__all__ = ["decode_budget", "memory_budget", "DECODE_FLOOR_BYTES", "DECODE_BYTES_PER_INPUT_BYTE",
           "JSON_DECODE_BYTES_PER_INPUT_BYTE", "decode_within"]

DECODE_FLOOR_BYTES = 256 << 20
# A real FR pickle grows about 11x when decoded (278 KiB -> 3 MiB measured on the template);
# 32x leaves room for dumps that share few strings, and still refuses a memo bomb.
DECODE_BYTES_PER_INPUT_BYTE = 32
# JSON is wordier and its decoder shares every key string: a real JSON dump grows about 4.6x
# (19 MiB -> 88 MiB of data segment, measured), while 47 MiB of ``{}, {}, ...`` grows 25x (to
# 1.16 GiB). 12x keeps 2.6x headroom over the real one and refuses the empty-dict flood.
JSON_DECODE_BYTES_PER_INPUT_BYTE = 12

_STATUS = Path("/proc/self/status")
_T = TypeVar("_T")
# The cap is process-wide while a decode holds it: other threads' allocations meanwhile (a thread
# started, a file read) count against it, and under load they can exhaust it. A hostile input
# fails on every try, at once; a decode that met someone else's allocation passes the next.
_DECODE_TRIES = 3
_lock = threading.RLock()


def decode_budget(input_bytes: int, per_input_byte: int = DECODE_BYTES_PER_INPUT_BYTE) -> int:
    """How much more memory decoding ``input_bytes`` of dump may take (``per_input_byte``: the
    encoding's worst real growth with headroom; the pickle's by default)."""
    return DECODE_FLOOR_BYTES + per_input_byte * input_bytes


def _data_segment_bytes() -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


@contextmanager
def memory_budget(extra_bytes: int) -> Iterator[None]:
    """Run the block with the data segment capped at its current size plus ``extra_bytes``.

    An existing lower cap (a container's, or an enclosing budget's) is kept.
    """
    with _lock:
        current = _data_segment_bytes()
        soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
        if current is None:
            yield
            return
        cap = current + extra_bytes
        if soft != resource.RLIM_INFINITY:
            cap = min(cap, soft)
        if hard != resource.RLIM_INFINITY:
            cap = min(cap, hard)
        resource.setrlimit(resource.RLIMIT_DATA, (cap, hard))
        try:
            yield
        finally:
            resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def decode_within(budget: int, decode: Callable[[], _T]) -> _T:
    """``decode()`` under :func:`memory_budget`, tried again if it met another thread's
    allocation; a ``MemoryError`` on the last try is the caller's to report."""
    for attempt in range(_DECODE_TRIES):
        try:
            with memory_budget(budget):
                return decode()
        except MemoryError:
            if attempt == _DECODE_TRIES - 1:
                raise
            time.sleep(0.05 * (attempt + 1))
    raise RuntimeError("unreachable: the last try returns or raises")
