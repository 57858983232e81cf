"""The rank's own Python stacks at a dump: every thread's frames, written beside the dump.

:class:`~denpex.collector.fr_watchdog.HangDumper` calls :func:`write_rank_stacks` from its
watchdog thread as it dumps: the main thread is then wherever the hang holds it (blocked in a
collective, sleeping in a data loader), which is what the operator asks first. It needs the GIL:
a rank whose interpreter is wedged (the GIL held in C code) never gets here, and the py-spy
sidecar (:mod:`denpex.collector.pyspy_sidecar`) reads it from outside instead.

Writing stacks never fails a dump: any error is logged and the dump goes on.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from datetime import datetime
from pathlib import Path
from types import FrameType

from denpex.collector.layout import stacks_path, write_atomic
from denpex.evidence.stacks import MAX_FRAMES, MAX_TEXT, MAX_THREADS, RankStacks, StackFrame, StackSource, ThreadStack
from denpex.evidence.stacks.model import clean_text

__all__ = ["capture_stacks", "write_rank_stacks"]

_log = logging.getLogger(__name__)


def capture_stacks(rank: int, *, taken_at: datetime) -> RankStacks:
    """Every Python thread's stack in this process, innermost frame first, main thread first.

    Thread names come from :func:`threading.enumerate`; a thread Python did not start (a C++
    thread that called into Python) is listed by id only. Which thread holds the GIL is not known
    from inside (the caller does, while it runs), so ``holds_gil`` stays unknown.
    """
    names = {t.ident: t.name for t in threading.enumerate()}
    main_id = threading.main_thread().ident
    current = sys._current_frames()
    order = sorted(current, key=lambda ident: (ident != main_id, names.get(ident) is None, ident))
    threads = [_thread(ident, names.get(ident), current[ident]) for ident in order[:MAX_THREADS]]
    notes = ([f"{len(order):,} threads, over the limit of {MAX_THREADS}: kept {MAX_THREADS} (the main thread first)"]
             if len(order) > MAX_THREADS else [])
    return RankStacks(rank=rank, source=StackSource.COLLECTOR, taken_at=taken_at, pid=os.getpid(),
                      threads=threads, threads_dropped=max(0, len(order) - MAX_THREADS), notes=notes)


def _thread(ident: int, name: str | None, top: FrameType) -> ThreadStack:
    frames: list[StackFrame] = []
    dropped = 0
    frame: FrameType | None = top
    while frame is not None:
        if len(frames) < MAX_FRAMES:
            code = frame.f_code
            # Built without validation: the dump waits for this, and 20,000 validated frames take
            # half a second. Every value is bounded right here, as the model would require.
            frames.append(StackFrame.model_construct(file=_text(code.co_filename),
                                                     line=max(frame.f_lineno or 0, 0),
                                                     function=_text(code.co_qualname)))
        else:
            dropped += 1
        frame = frame.f_back
    return ThreadStack(name=clean_text(name) if name is not None else None, id=ident, frames=frames,
                       frames_dropped=dropped)


def _text(value: str) -> str:
    return value if len(value) <= MAX_TEXT and value.isprintable() else clean_text(value)


def write_rank_stacks(out_dir: Path, rank: int, *, taken_at: datetime) -> Path | None:
    """Capture this rank's stacks and write them to ``<out>/collector/rank_<rank>.stacks.json``.

    Returns the path, or None when it could not (logged: a dump never fails for its stacks).
    """
    try:
        path = stacks_path(out_dir, rank)
        write_atomic(path, capture_stacks(rank, taken_at=taken_at).model_dump_json().encode())
        return path
    except Exception:  # noqa: BLE001 - stacks are extra evidence; the dump must go on without them
        _log.exception("rank %d: writing its Python stacks failed; the dump goes on without them", rank)
        return None
