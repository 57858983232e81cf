"""``py-spy dump --pid PID --json`` output, as a :class:`RankStacks` with source ``py-spy``.

py-spy 0.4 prints a list of threads, each with its frames innermost first::

    [{"pid": 11683, "thread_id": 139928379644800, "thread_name": "MainThread",
      "os_thread_id": 11683, "active": true, "owns_gil": true,
      "frames": [{"name": "match", "filename": "/usr/lib/python3.11/re/__init__.py",
                  "short_filename": "re/__init__.py", "line": 166, "locals": null, ...},
                 {"name": "wedge_in_regex", "filename": "/job/wedge.py", "line": 5, ...}]}]

which becomes ``threads=[ThreadStack(name="MainThread", id=139928379644800, holds_gil=True,
active=True, frames=[StackFrame(file="/usr/lib/python3.11/re/__init__.py", line=166,
function="match"), ...])]``. Locals, if py-spy was asked for them, are never kept.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from denpex.evidence.stacks.bounds import load_json, validated
from denpex.evidence.stacks.model import RankStacks, StackError, StackSource

__all__ = ["parse_pyspy_dump"]


def parse_pyspy_dump(data: bytes, *, rank: int, taken_at: datetime | None = None,
                     pid: int | None = None) -> RankStacks:
    """The threads py-spy printed for ``rank``'s process; :class:`StackError` for anything else."""
    what = f"py-spy output for rank {rank}"
    raw = load_json(data, what=what)
    if not isinstance(raw, list):
        raise StackError(f"{what} holds a {type(raw).__name__}, not py-spy's list of threads")
    # The byte limit bounds how many there can be; trimming to the model's limits comes after.
    shaped: dict[str, Any] = {"rank": rank, "source": StackSource.PY_SPY.value, "pid": pid,
                              "taken_at": taken_at, "threads": [_thread(t, i, what) for i, t in enumerate(raw)]}
    return validated(shaped, what=what)


def _thread(raw: object, index: int, what: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise StackError(f"{what}: thread {index} is a {type(raw).__name__}, not an object")
    frames = raw.get("frames")
    if not isinstance(frames, list):
        raise StackError(f"{what}: thread {index} has no list of frames")
    return {"name": raw.get("thread_name"), "id": raw.get("thread_id"), "holds_gil": raw.get("owns_gil"),
            "active": raw.get("active"), "frames": [_frame(f, index, what) for f in frames]}


def _frame(raw: object, index: int, what: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise StackError(f"{what}: a frame of thread {index} is a {type(raw).__name__}, not an object")
    return {"file": raw.get("filename"), "line": raw.get("line"), "function": raw.get("name")}
