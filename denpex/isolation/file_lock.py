"""One exclusive file lock (``flock``), for every file Denpex's workers share on one machine: the
audit log (each append), its run lock, the audit copy's lock and the breaker's state.

    with file_lock(path, what="the breaker lock", error=ConfigError):
        ...   # read, decide, write: no other process holds ``path``'s lock meanwhile

An flock is the kernel's: it is released when its holder dies, so a crash never leaves it held.
It binds processes on one machine only, as the state directory is one machine's.
"""

from __future__ import annotations

import fcntl
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

__all__ = ["file_lock", "LockHeld"]


class LockHeld(Exception):
    """``file_lock(wait=False)`` found the lock held; ``note`` is what the holder wrote in the file."""

    def __init__(self, path: Path, note: str) -> None:
        super().__init__(f"{path} is locked by another process ({note or 'unknown'})")
        self.path = path
        self.note = note


@contextmanager
def file_lock(path: Path, *, what: str, error: Callable[[str], Exception], wait: bool = True,
              mode: str = "a", buffering: int = -1) -> Iterator[IO[Any]]:
    """Hold an exclusive lock on ``path`` (created, with its folder, if missing) and yield the open
    file. ``wait=False`` raises LockHeld at once instead of waiting. A file that cannot be opened
    raises ``error("{path}: cannot open {what}: {reason}")``."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = path.open(mode, buffering=buffering)
    except OSError as exc:
        raise error(f"{path}: cannot open {what}: {exc.strerror or exc}") from exc
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            raise LockHeld(path, _note_in(handle)) from None
        try:
            yield handle
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _note_in(handle: IO[Any]) -> str:
    """What the holder wrote in the lock file (its pid), where this handle can read it."""
    try:
        handle.seek(0)
        note = handle.read(200)
    except OSError:  # opened for appending only
        return ""
    return (note.decode("utf-8", "replace") if isinstance(note, bytes) else str(note)).strip()
