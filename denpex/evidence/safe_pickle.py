"""Load pickled Flight Recorder dumps without ever importing or calling anything.

A real FR dump is a protocol-2 pickle of plain dicts, lists, tuples, strings and numbers, so an
unpickler that refuses every global loads it completely. Anything that asks for a global (the
way ``__reduce__`` payloads run code) is refused before the global is resolved, so nothing runs.
"""

from __future__ import annotations

import io
import pickle

from denpex.evidence.cpu_budget import cpu_limit
from denpex.evidence.errors import DumpError, UnsafePickleError
from denpex.evidence.memory_budget import decode_budget, decode_within

__all__ = ["safe_loads"]

_CHUNK = 16 << 10


class _RestrictedUnpickler(pickle.Unpickler):
    """Refuses every ``GLOBAL``/``STACK_GLOBAL``; plain containers load at C speed."""

    def find_class(self, module: str, name: str) -> object:
        raise UnsafePickleError(
            f"pickle asks for {module}.{name}; Flight Recorder dumps hold only plain data, "
            "so this file was refused and nothing in it ran"
        )

    def persistent_load(self, pid: object) -> object:
        raise UnsafePickleError("pickle uses persistent ids; refused")


class _Checkpoints(io.RawIOBase):
    """Hands the unpickler its input in chunks from Python code.

    Under the CPU limit (``denpex.evidence.cpu_budget``) the SIGXCPU handler runs only when the
    interpreter runs: a stream of C objects would let a pathological decode run on to the end.
    One Python call per chunk costs nothing measurable; the buffered reader above it still hands
    the C unpickler whole chunks.
    """

    def __init__(self, data: bytes) -> None:
        self._view = memoryview(data)
        self._at = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        n = min(len(buffer), len(self._view) - self._at)
        memoryview(buffer).cast("B")[:n] = self._view[self._at:self._at + n]
        self._at += n
        return n


def _load(data: bytes) -> object:
    # A buffered reader lets the C unpickler take whole chunks instead of one opcode per read
    # call: about 2x faster on real dumps. 16 KiB chunks give a checkpoint about every thousand
    # items, as often as the pickler batches them (64 KiB let a hostile dict run 2 s past).
    return _RestrictedUnpickler(io.BufferedReader(_Checkpoints(data), _CHUNK)).load()


def safe_loads(data: bytes) -> object:
    """Unpickle ``data`` that may come from anyone.

    >>> safe_loads(pickle.dumps({"version": "2.10", "entries": []}, protocol=2))
    {'version': '2.10', 'entries': []}
    """
    budget = decode_budget(len(data))
    try:
        with cpu_limit(len(data)):
            return decode_within(budget, lambda: _load(data))
    except UnsafePickleError:
        raise
    except MemoryError as exc:
        raise DumpError(f"decoding these {len(data):,} bytes needs more than the {budget >> 20} MiB "
                        "a real dump of this size could need (a memo table or length far larger "
                        "than the file): hostile or corrupt, so it was refused; collect it again") from exc
    except (pickle.UnpicklingError, EOFError) as exc:
        raise DumpError(f"not a complete pickle ({exc or 'ran out of data'}): the file was cut "
                        "short or damaged; collect it again") from exc
    except (ValueError, TypeError, IndexError, KeyError, AttributeError, OverflowError,
            RecursionError, UnicodeDecodeError) as exc:
        # Corrupt opcodes surface as assorted builtin errors; all mean "not a usable dump".
        raise DumpError(f"corrupt pickle ({type(exc).__name__}: {exc})") from exc
