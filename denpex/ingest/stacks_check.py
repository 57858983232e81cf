"""Checking an upload's stacks parts: the record must already be within every bound, and be its rank's.

The readers (:func:`denpex.evidence.stacks.parse_stacks_record`) trim a hostile file to fit and go
on; the service does not: what it stores is exactly what it acknowledged (the sha256 in the
receipt), so a part that would need trimming is refused, with the reason, and the collector,
which writes within the bounds, never sees that. Example::

    part "stacks" of rank 2's upload, {"rank": 3, ...}
      -> 422 "the stacks part names rank 3; an upload carries the stacks of its own rank 2 only"
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass

from pydantic import ValidationError

from denpex.evidence.stacks import RankStacks, StackError, StackSource, parse_stacks_record
from denpex.evidence.stacks.model import MAX_BYTES, MAX_FRAMES, MAX_NOTES, MAX_TEXT, MAX_THREADS
from denpex.ingest.errors import InvalidRequestError
from denpex.ingest.upload_form import STACKS_PARTS

__all__ = ["CheckedStacks", "check_stacks_part", "check_stacks_parts"]

_PART_OF = {source: name for name, source in STACKS_PARTS.items()}


@dataclass(frozen=True, slots=True)
class CheckedStacks:
    """One accepted stacks part: its source, its bytes as sent, and their sha256."""

    source: StackSource
    data: bytes
    sha256: str


def check_stacks_parts(parts: dict[StackSource, bytes], rank: int) -> list[CheckedStacks]:
    """Every stacks part of an upload checked (422 for the first that fails), collector's first."""
    return [check_stacks_part(parts[source], source, rank) for source in StackSource if source in parts]


def check_stacks_part(data: bytes, source: StackSource, rank: int) -> CheckedStacks:
    """``data`` as a stacks record of ``source`` for ``rank``, within every bound; else a 422 saying why."""
    part = _PART_OF[source]
    record = _strict(data, part)
    if record.rank != rank:
        raise InvalidRequestError(f"the {part} part names rank {record.rank}; an upload carries the stacks of its "
                                  f"own rank {rank} only")
    if record.source is not source:
        raise InvalidRequestError(f"the {part} part holds stacks from source {record.source.value!r}; that part "
                                  f"takes source {source.value!r} only")
    return CheckedStacks(source=source, data=data, sha256=hashlib.sha256(data).hexdigest())


def _strict(data: bytes, part: str) -> RankStacks:
    if len(data) > MAX_BYTES:  # the form's cap is this limit; a caller with a larger cap still stops here
        raise InvalidRequestError(f"the {part} part is {len(data):,} bytes, over the limit of {MAX_BYTES:,}")
    try:
        record = RankStacks.model_validate_json(data)
    except ValidationError:
        pass  # the readers' long way says why, in one sentence
    else:
        # Only on bytes within the bounds: the Python hook costs 20x pydantic on a flood of objects.
        _no_repeated_keys(data, part)
        return record
    try:
        parse_stacks_record(data, what=f"the {part} part")
    except StackError as exc:
        raise InvalidRequestError(str(exc)) from exc
    # The readers could trim it to fit: over a bound on threads, frames or strings, or strings with
    # control characters. The service stores only what needs no trimming.
    raise InvalidRequestError(f"the {part} part is over the stacks bounds (at most {MAX_THREADS} threads of "
                              f"{MAX_FRAMES} frames, {MAX_NOTES} notes, strings of at most {MAX_TEXT} printable "
                              "characters): trim it before sending")


def _no_repeated_keys(data: bytes, part: str) -> None:
    """A key named twice in one object is refused: this service reads the last one, another reader
    of the stored bytes may read the first (``{"rank": 3, ..., "rank": 0}``) and see another rank."""
    def pairs(items: list[tuple[str, object]]) -> dict[str, object]:
        counts = Counter(k for k, _ in items)
        if len(counts) != len(items):
            # Counted once: ``keys.count`` per key made 4 MiB of one repeated key quadratic.
            repeated = sorted(k for k, n in counts.items() if n > 1)
            raise InvalidRequestError(f"the {part} part names {', '.join(map(repr, repeated[:3]))} twice in "
                                      "one object")
        return dict(items)
    try:
        json.loads(data, object_pairs_hook=pairs)
    except (ValueError, RecursionError):
        return  # not JSON, or nested past Python's limit: the readers' own checks say why
