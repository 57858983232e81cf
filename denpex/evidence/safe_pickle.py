"""Load pickled Flight Recorder dumps without ever importing or calling anything.

A real FR dump is a protocol-2 pickle of plain dicts, lists, tuples, strings and numbers, so an
unpickler that refuses every global loads it completely. Anything that asks for a global (the
way ``__reduce__`` payloads run code) is refused before the global is resolved, so nothing runs.
"""

from __future__ import annotations

import io
import time
import pickle

from denpex.evidence.errors import DumpError, UnsafePickleError
from denpex.evidence.memory_budget import decode_budget, memory_budget

__all__ = ["safe_loads"]

_BUFFER = 1 << 20


class _RestrictedUnpickler(pickle.Unpickler):
    """Refuses every ``GLOBAL``/``STACK_GLOBAL``; plain containers load at C speed."""

    def find_class(self, module: str, name: str) -> object:
        raise UnsafePickleError(
            f"pickle asks for {module}.{name}; Flight Recorder dumps hold only plain data, "
            "so this file was refused and nothing in it ran"
        )

    def persistent_load(self, pid: object) -> object:
        raise UnsafePickleError("pickle uses persistent ids; refused")


# The cap is process-wide while a decode holds it: other threads' allocations meanwhile (a thread
# started, a file read) count against it, and under load they can exhaust it. A hostile memo
# table fails on every try, at once; a decode that met someone else's allocation passes the next.
_DECODE_TRIES = 3


def _load_within(budget: int, data: bytes) -> object:
    for attempt in range(_DECODE_TRIES):
        try:
            # A buffered reader lets the C unpickler take whole frames instead of one opcode per
            # read call: about 2x faster on real dumps.
            with memory_budget(budget):
                return _RestrictedUnpickler(io.BufferedReader(io.BytesIO(data), _BUFFER)).load()
        except MemoryError:
            if attempt == _DECODE_TRIES - 1:
                raise
            time.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")


def safe_loads(data: bytes) -> object:
    """Unpickle ``data`` that may come from anyone.

    >>> safe_loads(pickle.dumps({"version": "2.10", "entries": []}, protocol=2))
    {'version': '2.10', 'entries': []}
    """
    budget = decode_budget(len(data))
    try:
        return _load_within(budget, data)
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
