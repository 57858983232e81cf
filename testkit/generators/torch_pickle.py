"""Write plain data as protocol-2 pickle bytes laid out the way torch's C++ pickler writes an FR dump.

Python's ``pickle.dumps`` memoizes every container by identity, so its dumps are about 27 % larger
than torch's and cost more to load. torch's pickler (``pickle_str`` in ``FlightRecorderDetail.hpp``)
memoizes differently, and the synthetic dumps must match it for the load-time floor to mean
anything:

- every string is memoized **by value**: its first occurrence is ``BINUNICODE`` + ``BINPUT``, and
  every later one is a 2-byte ``BINGET``;
- the frame dicts of stack traces are shared objects: one that occurs more than once in the dump
  is memoized by identity with a ``BINPUT`` after its ``SETITEMS`` (a frame seen once is not), and
  the top-level dict gets a ``BINPUT`` at the end;
- other lists, dicts and tuples are not memoized; a list is ``EMPTY_LIST MARK ... APPENDS`` even
  when empty;
- an int outside int32 is ``LONG1`` with 8 bytes, whatever its magnitude.

``encode_torch_style(safe_loads(real_dump)) == real_dump`` holds byte for byte for a real Gloo dump
(see ``tests/testing/test_expansion.py``).

The writer also reports where things landed, so that the expansion can reuse one encoded ring for
many ranks and patch only the bytes that differ: the memo slot of selected strings (the group
names and descriptions, referenced by 1-byte ``BINGET`` slots) and the 8-byte payload of every
``LONG1`` (the nanosecond timestamps).

Example::

    >>> w = TorchPickleWriter()
    >>> w.begin()
    >>> w.value({"a": ("x", "x")}, memo_dict=True)
    >>> w.end()
    >>> bytes(w.out)
    b'\\x80\\x02}(X\\x01\\x00\\x00\\x00aq\\x00X\\x01\\x00\\x00\\x00xq\\x01h\\x01\\x86uq\\x02.'
"""

from __future__ import annotations

import struct
from collections.abc import Collection, Mapping, Sequence
from typing import Any

__all__ = ["TorchPickleWriter", "encode_torch_style", "shared_frame_ids", "FRAMES_KEY"]

FRAMES_KEY = "frames"
"""Entries' stack traces: lists of frame dicts that torch shares between entries."""

_PROTO2 = b"\x80\x02"
_STOP = b"."
_MARK = b"("
_EMPTY_LIST = b"]"
_APPENDS = b"e"
_EMPTY_DICT = b"}"
_SETITEMS = b"u"
_EMPTY_TUPLE = b")"
_TUPLE = b"t"
_TUPLE_N = {1: b"\x85", 2: b"\x86", 3: b"\x87"}
_NONE = b"N"
_TRUE = b"\x88"
_FALSE = b"\x89"
_BINFLOAT = b"G"
_INT32_MIN = -(2**31)
_INT32_MAX = 2**31 - 1
_LONG1_8 = b"\x8a\x08"


class TorchPickleWriter:
    """An append-only encoder with torch's memo rules; see the module docstring.

    ``shared_frames`` holds the ``id()`` of the frame dicts that occur more than once in the
    dump (``shared_frame_ids``); only those are memoized, as torch does.
    ``watch`` is a set of strings whose ``BINGET`` slot byte positions are recorded in
    ``slot_refs`` (only references with a 1-byte slot, i.e. slot < 256, can be patched later).
    Positions of ``LONG1`` payloads go to ``long_payloads``.
    """

    def __init__(self, watch: Collection[str] = (), shared_frames: Collection[int] = ()) -> None:
        self.out = bytearray()
        self.memo_count = 0
        self._strings: dict[str, int] = {}
        self._objects: dict[int, int] = {}
        # Keep memoized objects alive: an id() may otherwise be reused by a new object.
        self._alive: list[object] = []
        self._watch = frozenset(watch)
        self._shared_frames = frozenset(shared_frames)
        self.slot_refs: dict[str, list[int]] = {s: [] for s in self._watch}
        self.long_payloads: list[int] = []

    # -- framing --------------------------------------------------------------------------
    def begin(self) -> None:
        """Write the protocol header."""
        self.out += _PROTO2

    def end(self) -> None:
        """Write STOP."""
        self.out += _STOP

    def put_memo(self) -> None:
        """Memoize the object on top of the stack (BINPUT / LONG_BINPUT)."""
        self._put(self.memo_count)
        self.memo_count += 1

    def slot_of(self, s: str) -> int | None:
        """The memo slot of an already written string, else None."""
        return self._strings.get(s)

    def required_slot(self, s: str) -> int:
        """The memo slot of a string this writer must already have written."""
        slot = self._strings.get(s)
        if slot is None:
            raise KeyError(f"string {s!r} was never written, so it has no memo slot to refer to")
        return slot

    # -- values ---------------------------------------------------------------------------
    def value(self, obj: object, *, memo_dict: bool = False) -> None:
        """Append one plain value. ``memo_dict`` memoizes a top-level dict after its items."""
        if isinstance(obj, str):
            self.string(obj)
        elif obj is None:
            self.out += _NONE
        elif obj is True:
            self.out += _TRUE
        elif obj is False:
            self.out += _FALSE
        elif isinstance(obj, int):
            self.integer(obj)
        elif isinstance(obj, float):
            self.out += _BINFLOAT + struct.pack(">d", obj)
        elif isinstance(obj, Mapping):
            self.mapping(obj, memo=memo_dict)
        elif isinstance(obj, list):
            self.sequence(obj)
        elif isinstance(obj, tuple):
            self.tuple_(obj)
        else:
            raise TypeError(
                f"cannot write a {type(obj).__name__} into a Flight Recorder dump; "
                "only str, int, float, bool, None, dict, list and tuple occur in one"
            )

    def string(self, s: str) -> None:
        slot = self._strings.get(s)
        if slot is not None:
            self._get(slot, s)
            return
        data = s.encode("utf-8")
        self.out += b"X" + struct.pack("<I", len(data)) + data
        self._strings[s] = self.memo_count
        self.put_memo()

    def integer(self, n: int) -> None:
        if 0 <= n <= 0xFF:
            self.out += b"K" + bytes((n,))
        elif 0 <= n <= 0xFFFF:
            self.out += b"M" + struct.pack("<H", n)
        elif _INT32_MIN <= n <= _INT32_MAX:
            self.out += b"J" + struct.pack("<i", n)
        else:
            self.out += _LONG1_8
            self.long_payloads.append(len(self.out))
            self.out += struct.pack("<q", n)

    def mapping(self, d: Mapping[Any, object], *, memo: bool = False) -> None:
        self.out += _EMPTY_DICT + _MARK
        for key, val in d.items():
            self.value(key)
            if key == FRAMES_KEY and isinstance(val, list):
                self.frames(val)
            else:
                self.value(val)
        self.out += _SETITEMS
        if memo:
            self.put_memo()

    def frames(self, frames: Sequence[Mapping[str, object]]) -> None:
        """A stack: a list of frame dicts, each memoized by identity as torch shares them."""
        self.out += _EMPTY_LIST + _MARK
        for frame in frames:
            slot = self._objects.get(id(frame))
            if slot is not None:
                self._get(slot, None)
                continue
            self.mapping(frame)
            if id(frame) in self._shared_frames:
                self._objects[id(frame)] = self.memo_count
                self._alive.append(frame)
                self.put_memo()
        self.out += _APPENDS

    def sequence(self, items: Sequence[object]) -> None:
        self.out += _EMPTY_LIST + _MARK
        for item in items:
            self.value(item)
        self.out += _APPENDS

    def tuple_(self, items: tuple[object, ...]) -> None:
        if not items:
            self.out += _EMPTY_TUPLE
            return
        if len(items) <= 3:
            for item in items:
                self.value(item)
            self.out += _TUPLE_N[len(items)]
            return
        self.out += _MARK
        for item in items:
            self.value(item)
        self.out += _TUPLE

    # -- memo opcodes ---------------------------------------------------------------------
    def _put(self, slot: int) -> None:
        self.out += b"q" + bytes((slot,)) if slot < 256 else b"r" + struct.pack("<I", slot)

    def _get(self, slot: int, s: str | None) -> None:
        if slot < 256:
            self.out += b"h"
            if s is not None and s in self._watch:
                self.slot_refs[s].append(len(self.out))
            self.out += bytes((slot,))
        else:
            self.out += b"j" + struct.pack("<I", slot)


def shared_frame_ids(entries: Sequence[Mapping[str, object]]) -> set[int]:
    """The ``id()`` of every frame dict that occurs more than once across ``entries``' stacks."""
    seen: set[int] = set()
    shared: set[int] = set()
    for entry in entries:
        frames = entry.get(FRAMES_KEY)
        if not isinstance(frames, list):
            continue
        for frame in frames:
            key = id(frame)
            if key in seen:
                shared.add(key)
            else:
                seen.add(key)
    return shared


def encode_torch_style(dump: Mapping[str, object]) -> bytes:
    """Encode a whole FR dump (a top-level dict) with torch's memo rules."""
    entries = dump.get("entries")
    shared = shared_frame_ids(entries) if isinstance(entries, list) else set()
    writer = TorchPickleWriter(shared_frames=shared)
    writer.begin()
    writer.mapping(dump, memo=True)
    writer.end()
    return bytes(writer.out)
