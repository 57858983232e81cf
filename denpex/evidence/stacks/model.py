"""One rank's Python stacks, as evidence: who took them, when, and each thread's frames.

Every source (the collector inside the rank, py-spy from outside, torch's debug server, FR's own
call-site frames) is read into this one model, whatever arrived. The model itself holds the
bounds: a :class:`RankStacks` never has more than :data:`MAX_THREADS` threads of
:data:`MAX_FRAMES` frames, and no string longer than :data:`MAX_TEXT` characters or with a
control character in it (readers trim and clean hostile input to fit and say so in ``notes``;
what cannot be trimmed is refused with :class:`StackError`). Frames are innermost first, as py-spy prints them
and as FR records them.

Example (the collector's file for a rank sleeping in its data loader)::

    {"format": "denpex.stacks/1", "rank": 2, "source": "collector",
     "taken_at": "2026-12-02T19:08:11Z", "pid": 4242,
     "threads": [{"name": "MainThread", "id": 140, "frames": [
         {"file": "/job/data.py", "line": 45, "function": "next_batch"},
         {"file": "/job/train.py", "line": 88, "function": "step"}]}]}
"""

from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from denpex.evidence.errors import EvidenceError

__all__ = [
    "FORMAT",
    "MAX_BYTES",
    "MAX_FRAMES",
    "MAX_NOTES",
    "MAX_TEXT",
    "MAX_THREADS",
    "RankStacks",
    "StackError",
    "StackFrame",
    "StackSource",
    "ThreadStack",
    "Unavailable",
    "clean_text",
]

FORMAT = "denpex.stacks/1"
MAX_BYTES = 4 << 20
"""One rank's stacks file: 256 threads x 128 frames of real paths is about 3 MiB of JSON."""
MAX_THREADS = 256
MAX_FRAMES = 128
"""Per thread; the innermost ones are kept (that is where the rank is stuck)."""
MAX_TEXT = 512
MAX_NOTES = 16

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")


class StackError(EvidenceError):
    """A stacks file that cannot be used at all; the message says why (the triage goes on without it)."""


def clean_text(value: str, limit: int = MAX_TEXT) -> str:
    """``value`` on one line, control characters as spaces, cut to ``limit`` characters.

    >>> clean_text("step\\n## injected")
    'step ## injected'
    """
    flat = _CONTROL.sub(" ", value)
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


# Checked in pydantic-core, not in Python: 4,096 ranks' files hold a million strings. Readers
# clean and cut strings before validating (with a note); a model built directly must pass
# clean strings (``clean_text``).
_PRINTABLE = r"^[^\x00-\x1f\x7f-\x9f\u2028\u2029]*$"
Text = Annotated[str, StringConstraints(max_length=MAX_TEXT, pattern=_PRINTABLE)]


class StackSource(StrEnum):
    """Where a rank's stacks came from (the triage JSON's ``stack.source``)."""

    COLLECTOR = "collector"
    """Denpex's collector inside the rank, at its dump (``sys._current_frames``)."""
    PY_SPY = "py-spy"
    """``py-spy dump`` from outside the rank, when its interpreter could not dump by itself."""
    TORCH_DEBUG = "torch-debug"
    """A ``stacks_<time>.txt`` file of ``torch.distributed.debug``'s periodic dumps."""
    FR_CALLSITE = "fr-callsite"
    """The ``frames`` a Flight Recorder entry recorded where the collective was called."""


class Unavailable(StrEnum):
    """Why a source has no stacks for a rank, where it tried and could not."""

    PTRACE_REFUSED = "ptrace_refused"
    """The kernel refused to let py-spy read the process (Yama ``ptrace_scope``, no ``SYS_PTRACE``)."""
    PROCESS_GONE = "process_gone"
    """The rank's process had exited when its stacks were to be read."""
    TIMED_OUT = "timed_out"
    """The reader (py-spy) did not answer in time."""
    READER_MISSING = "reader_missing"
    """The program to read the stacks (py-spy) is not installed where the sidecar runs."""
    WORKER_UNREACHABLE = "worker_unreachable"
    """torch's debug server could not fetch this rank's stacks (its section is an error)."""
    FAILED = "failed"
    """Any other failure; ``detail`` says what the reader printed."""


class StackFrame(BaseModel):
    """One frame: ``train.py:88 step()``. Numbers and flags are strict: ``"88"`` is refused, as
    everywhere in this model, since no source writes numbers as text."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    file: Text
    line: int = Field(ge=0, le=10_000_000, strict=True)
    function: Text

    def short(self) -> str:
        """``train.py:88 step()``: the file's last component, the line, the function."""
        return f"{self.file.rsplit('/', 1)[-1]}:{self.line} {self.function}()"


class ThreadStack(BaseModel):
    """One thread's frames, innermost first, and what is known about its state."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: Text | None = None
    id: int | None = Field(default=None, ge=0, le=2**64, strict=True)
    holds_gil: bool | None = Field(default=None, strict=True)
    """None where the source cannot tell (the collector; torch's debug server)."""
    active: bool | None = Field(default=None, strict=True)
    """py-spy's ``active``: running on a CPU rather than waiting. None where unknown."""
    frames: list[StackFrame] = Field(default_factory=list, max_length=MAX_FRAMES)
    frames_dropped: int = Field(default=0, ge=0, strict=True)
    """Outermost frames left out to stay within :data:`MAX_FRAMES`."""


class RankStacks(BaseModel):
    """Every thread's stacks of one rank from one source, or why that source has none."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: Literal["denpex.stacks/1"] = "denpex.stacks/1"
    rank: int = Field(ge=0, le=10_000_000, strict=True)
    source: StackSource
    taken_at: datetime | None = None
    pid: int | None = Field(default=None, ge=0, le=2**32, strict=True)
    threads: list[ThreadStack] = Field(default_factory=list, max_length=MAX_THREADS)
    threads_dropped: int = Field(default=0, ge=0, strict=True)
    unavailable: Unavailable | None = None
    detail: Text | None = None
    """Why the stacks are unavailable, in the reader's words (bounded)."""
    notes: list[Text] = Field(default_factory=list, max_length=MAX_NOTES)
    """What a reader trimmed or skipped to fit the bounds, one sentence each."""

    def thread(self, name: str) -> ThreadStack | None:
        """The first thread called ``name``."""
        return next((t for t in self.threads if t.name == name), None)
