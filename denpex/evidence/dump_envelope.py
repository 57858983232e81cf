"""Check that bytes are a Flight Recorder dump without building it: what the ingest service's
check workers run on every upload.

Triage decodes a dump whole (:mod:`denpex.evidence.fr_dump`); the service only needs to know
that it is one, of a version Denpex reads, and how many entries it holds. For a JSON dump that
difference is most of the memory: Python builds an object for every number, list and mapping, so
a real JSON dump takes about 4x its size (9.5x when coalesced ops list dozens of tensor sizes),
and the decode budget allowed 256 MiB + 12x the size, about 3.25 GiB per check worker at the
256 MiB cap, over the file's bytes and their text that the worker held as well.

Here a JSON dump is read as text (no second copy in bytes) and parsed by the same decoder (the
same errors, at the same byte), but every mapping is dropped as soon as it is parsed: an entry
lives while its own fields are read, and the list of entries holds one shared empty mapping per
entry. What a real dump needs on top of its text is a few percent; the budget is
``JSON_CHECK_FLOOR_BYTES`` + ``JSON_CHECK_BYTES_PER_INPUT_BYTE`` x the size, so a worker's total at
the 256 MiB cap is its text and at most 576 MiB more (about 0.85 GiB, from 3.5 GiB). That still
refuses what only a hostile file holds: one entry as large as the budget, top-level lists of
empty lists or strings, and (counted, since each costs only a shared reference here) more than one
mapping per ``MIN_BYTES_PER_MAPPING`` bytes, the flood of ``{}`` that a whole decode would take to
25x its size. A pickle is decoded whole by the safe loader, as before (its memo is where its bombs
are).

    >>> check_envelope(b'{"version": "2.10", "entries": [{"record_id": 0}], "pg_config": {}}', source="r0.json")
    DumpEnvelope(encoding=<DumpEncoding.JSON: 'json'>, version=(2, 10), entries=1)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from denpex.evidence.cpu_budget import cpu_limit
from denpex.evidence.errors import DumpError
from denpex.evidence.fr_dump import DumpEncoding, check_envelope_fields, decode_dump, json_decode_errors
from denpex.evidence.memory_budget import decode_within

__all__ = ["DumpEnvelope", "JSON_CHECK_FLOOR_BYTES", "JSON_CHECK_BYTES_PER_INPUT_BYTE", "MIN_BYTES_PER_MAPPING",
           "check_envelope", "check_json_text", "is_pickle", "json_text"]

_MiB = 1 << 20
JSON_CHECK_FLOOR_BYTES = 64 * _MiB
JSON_CHECK_BYTES_PER_INPUT_BYTE = 2
"""Over the text already held: a real dump's list of entries and its top-level fields take a few
percent of its size, and its largest entry a few KiB; 2x leaves room and refuses padding."""
MIN_BYTES_PER_MAPPING = 16
"""A real dump's objects average hundreds of bytes (an entry is 300 or more; its smallest, a
process group's config, about 50)."""
_PICKLE_PROTO = 0x80
_NO_MAPPING: dict[str, Any] = {}
"""What every mapping below the top level is parsed into: one shared, empty object."""


@dataclass(frozen=True, slots=True)
class DumpEnvelope:
    """What the check learned of a dump that passed."""

    encoding: DumpEncoding
    version: tuple[int, int]
    entries: int


def check_envelope(data: bytes, *, source: str) -> DumpEnvelope:
    """The envelope of the dump in ``data`` (pickle or JSON, sniffed from the first byte); a
    DumpError says why it is not one Denpex reads."""
    if is_pickle(data):
        decoded = decode_dump(data, source=source)
        entries = decoded.raw.get("entries", [])
        return DumpEnvelope(encoding=decoded.encoding, version=decoded.version,
                            entries=len(entries) if isinstance(entries, list) else 0)
    return check_json_text(json_text(data), size=len(data))


def is_pickle(data: bytes) -> bool:
    """Whether ``data`` starts as torch's pickled dumps do (protocol 2)."""
    return bool(data) and data[0] == _PICKLE_PROTO


def json_text(data: bytes) -> str:
    """The text of a JSON dump's bytes, decoded as ``json.loads`` decodes them."""
    try:
        return data.decode(json.detect_encoding(data), "surrogatepass")
    except (UnicodeDecodeError, LookupError) as exc:
        raise DumpError("neither a pickle nor UTF-8 JSON") from exc


def check_json_text(text: str, *, size: int) -> DumpEnvelope:
    """The envelope of a JSON dump already read as text (``size``: its bytes on disk)."""
    if not text.strip():
        raise DumpError("empty file: the dump or its upload was cut short; collect it again")
    budget = JSON_CHECK_FLOOR_BYTES + JSON_CHECK_BYTES_PER_INPUT_BYTE * size
    top: list[list[tuple[str, Any]]] = [[]]
    mappings = [0]

    def mapping(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        # Called innermost first, so the last call is the top-level mapping (when the top level is one).
        top[0] = pairs
        mappings[0] += 1
        return _NO_MAPPING

    decoder = json.JSONDecoder(object_pairs_hook=mapping)
    with json_decode_errors(action="checking", size=size, budget=budget, text_end=len(text.rstrip()),
                            likely="padding outside its entries, or one entry as large as a dump"), cpu_limit(size):
        parsed = decode_within(budget, lambda: decoder.decode(text))
    if parsed is not _NO_MAPPING:
        raise DumpError(f"top level is a {type(parsed).__name__}, not the mapping a Flight Recorder dump holds")
    raw = dict(top[0])
    version = check_envelope_fields(raw)
    # A few small objects are any dump's; thousands of them, this close together, only a flood's.
    if mappings[0] > 4096 and mappings[0] * MIN_BYTES_PER_MAPPING > size:
        raise DumpError(f"{mappings[0]:,} objects in {size:,} bytes of JSON: a flood of empty objects, not a Flight "
                        "Recorder dump (hostile or corrupt), so it was refused; collect it again")
    entries = raw.get("entries", [])
    return DumpEnvelope(encoding=DumpEncoding.JSON, version=version,
                        entries=len(entries) if isinstance(entries, list) else 0)
