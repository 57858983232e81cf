"""A CPU-time ceiling around decoding untrusted bytes, so a small pathological file cannot hold a
worker for minutes.

A plain-data pickle of a dict whose int keys all hash to 0 (``k * (2**61 - 1)``) needs no global
and no memory, yet CPython builds it in quadratic time: 250 KiB take seconds, 1 MiB half a
minute. No check on the bytes catches every such shape (tuples and floats collide too), so the
general bound is time: the decode gets CPU seconds in proportion to its size.

Mechanism: ``RLIMIT_CPU``'s soft limit is set to the CPU already used plus the budget, and the
``SIGXCPU`` it raises becomes a ``DumpError`` at the next Python frame (the safe unpickler reads
through a Python-level stream, so a decode returns to the interpreter every chunk). A decode
stuck in C past the limit (one huge ``SETITEMS``) never reaches a Python frame: the parent that
owns the worker kills it (``denpex.analysis.lanes``). The limit only ever applies in a process
that armed it (a disposable decode worker): in the CLI or the server a late signal would land in
unrelated code. The hard limit is never touched, so an unprivileged worker can keep raising the
soft limit for its next decode.
"""

from __future__ import annotations

import math
import resource
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType

from denpex.evidence.errors import DumpError

__all__ = ["CpuBudget", "DEFAULT_CPU_BUDGET", "arm_cpu_limit", "cpu_limit"]


@dataclass(frozen=True, slots=True)
class CpuBudget:
    """CPU seconds a decode of ``n`` bytes may take: ``floor_s + per_mib_s * n / MiB``.

    Measured on this project's 2-core CI host: a real pickle decodes at about 0.02 CPU-s per MiB
    (31 MiB of the Gloo template: 0.59 s; 256 MiB, the upload cap: about 5 s), JSON at about
    0.012 s per MiB. The default gives 256 MiB 27.6 s, five times what a real dump needs, and a
    250 KiB hostile pickle 2 s.
    """

    floor_s: float = 2.0
    per_mib_s: float = 0.1

    def seconds_for(self, input_bytes: int) -> float:
        """The budget for ``input_bytes`` of dump."""
        return self.floor_s + self.per_mib_s * input_bytes / (1 << 20)


DEFAULT_CPU_BUDGET = CpuBudget()


class _OverBudget(BaseException):
    """Raised by the SIGXCPU handler. A BaseException, so that no ``except Exception`` inside the
    decode (or in a stream the unpickler reads) swallows it."""


class _Arming:
    """This process's arming: the budget, and whether a decode is under the limit right now."""

    def __init__(self, budget: CpuBudget) -> None:
        self.budget = budget
        self.active = False


_armed: _Arming | None = None


def _on_sigxcpu(signum: int, frame: FrameType | None) -> None:
    # A SIGXCPU outside a decode (the kernel repeats it each second until the limit is lifted)
    # must not break the worker's own code.
    if _armed is not None and _armed.active:
        raise _OverBudget


def arm_cpu_limit(budget: CpuBudget = DEFAULT_CPU_BUDGET) -> None:
    """Make every later :func:`cpu_limit` in this process enforce ``budget``.

    Call it once, from the main thread of a dedicated worker process (a pool's initializer).
    """
    global _armed
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("arm_cpu_limit must run on the worker's main thread (signal handlers live there)")
    signal.signal(signal.SIGXCPU, _on_sigxcpu)
    _armed = _Arming(budget)


def _cpu_used() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@contextmanager
def cpu_limit(input_bytes: int) -> Iterator[None]:
    """Run the decode of ``input_bytes`` under this process's armed CPU budget.

    Outside an armed worker (the CLI, the server, a nested call) this does nothing. Over the
    budget, the block ends with a ``DumpError`` that says so.
    """
    arming = _armed
    if arming is None or arming.active or threading.current_thread() is not threading.main_thread():
        yield
        return
    seconds = arming.budget.seconds_for(input_bytes)
    soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
    # Whole seconds only; rounding up never refuses a decode that fits.
    cap = math.ceil(_cpu_used() + seconds)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    try:
        arming.active = True
        resource.setrlimit(resource.RLIMIT_CPU, (cap, hard))
        yield
    except _OverBudget:
        raise DumpError(
            f"the dump took more than {seconds:.1f} s of CPU to decode ({input_bytes:,} bytes; a real "
            "dump of this size needs a fraction of that): hostile or pathological (for example dict "
            "keys that all share one hash)"
        ) from None
    finally:
        # Clear the flag first: a signal between the two steps is then ignored, never raised here.
        arming.active = False
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
