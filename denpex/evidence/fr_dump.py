"""Decode one Flight Recorder dump (pickle or JSON) into its raw top-level mapping.

Only the envelope is checked here: the encoding, the top-level type and the schema version.
Entries are reduced to a compact summary by ``denpex.analysis.summary`` in one streaming pass,
so that a 2,000-entry ring never turns into 2,000 model objects.

Example::

    >>> decode_dump(b'{"version": "2.10", "pg_config": {}, "pg_status": {}}', source="r0.json")
    DecodedDump(source='r0.json', encoding=<DumpEncoding.JSON: 'json'>, version=(2, 10), ...)
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from denpex.evidence.cpu_budget import cpu_limit
from denpex.evidence.errors import DumpError
from denpex.evidence.memory_budget import JSON_DECODE_BYTES_PER_INPUT_BYTE, decode_budget, decode_within
from denpex.evidence.safe_pickle import safe_loads

__all__ = [
    "DumpEncoding",
    "DecodedDump",
    "OLDEST_MINOR",
    "SUPPORTED_MAJOR",
    "decode_dump",
    "parse_version",
    "check_envelope_fields",
    "json_decode_errors",
]

SUPPORTED_MAJOR = 2
# The oldest schema read: torch 2.6 writes "2.4" (no comm_lib_version, entries without their
# thread); torch 2.9 to 2.14 write "2.10" (README, "Torch versions"). Older schemas come from
# torch releases nobody here has run, so their fields are refused rather than guessed at.
OLDEST_MINOR = 4
_PICKLE_PROTO = 0x80
# ASCII digits only: str.isdigit() also accepts "²", which int() refuses.
_VERSION_PART = re.compile(r"[0-9]{1,6}")


class DumpEncoding(StrEnum):
    """How the dump was serialised by torch."""

    PICKLE = "pickle"
    """``_dump_fr_trace`` / the NCCL dump-on-timeout file: protocol-2 pickle."""
    JSON = "json"
    """``_dump_fr_trace_json``: no stack frames, lists instead of tuples, 0 instead of None."""


@dataclass(frozen=True, slots=True)
class DecodedDump:
    """A dump whose envelope is valid. ``raw`` is the untouched top-level mapping."""

    source: str
    encoding: DumpEncoding
    version: tuple[int, int]
    raw: dict[str, Any] = field(repr=False)


def parse_version(value: object) -> tuple[int, int]:
    """``"2.10"`` -> ``(2, 10)``; anything else is a DumpError naming the value."""
    if isinstance(value, str):
        major, _, minor = value.strip().partition(".")
        if _VERSION_PART.fullmatch(major) and (minor == "" or _VERSION_PART.fullmatch(minor)):
            return int(major), int(minor or 0)
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
    raise DumpError(f"schema 'version' is {shown}; expected a string like '2.10'. Is this a "
                    "Flight Recorder dump?")


def decode_dump(data: bytes, *, source: str) -> DecodedDump:
    """Decode ``data`` (pickle or JSON, sniffed from the first byte) and check its envelope."""
    if not data:
        raise DumpError("empty file: the dump or its upload was cut short; collect it again")
    encoding = DumpEncoding.PICKLE if data[0] == _PICKLE_PROTO else DumpEncoding.JSON
    raw = safe_loads(data) if encoding is DumpEncoding.PICKLE else _json_loads(data)
    if not isinstance(raw, dict):
        raise DumpError(
            f"top level is a {type(raw).__name__}, not the mapping a Flight Recorder dump holds"
        )
    return DecodedDump(source=source, encoding=encoding, version=check_envelope_fields(raw), raw=raw)


def check_envelope_fields(raw: dict[str, Any]) -> tuple[int, int]:
    """The schema version of a dump's top-level mapping, once its version and the types of its
    ``entries``, ``pg_config`` and ``pg_status`` are checked (a DumpError names what is wrong)."""
    if "version" not in raw:
        raise DumpError("no 'version' field: not a Flight Recorder dump")
    version = parse_version(raw["version"])
    if version[0] != SUPPORTED_MAJOR:
        raise DumpError(
            f"Flight Recorder schema {raw['version']} is not supported; Denpex reads "
            f"{SUPPORTED_MAJOR}.{OLDEST_MINOR} (torch 2.6) to {SUPPORTED_MAJOR}.x (torch 2.9 to 2.14 write "
            "2.10). Upgrade Denpex to read this dump."
        )
    if version[1] < OLDEST_MINOR:
        raise DumpError(
            f"Flight Recorder schema {raw['version']} was written by a torch older than 2.6, which "
            f"Denpex does not read (its oldest is schema {SUPPORTED_MAJOR}.{OLDEST_MINOR}, torch 2.6); "
            "dump again with torch 2.6 or later."
        )
    for key, kind in (("entries", list), ("pg_config", dict), ("pg_status", dict)):
        if key in raw and not isinstance(raw[key], kind):
            raise DumpError(f"'{key}' is a {type(raw[key]).__name__}, expected a {kind.__name__}")
    return version


@contextmanager
def json_decode_errors(*, action: str, size: int, budget: int, text_end: int, likely: str) -> Iterator[None]:
    """Turn what decoding ``size`` bytes of JSON can raise into the DumpError that says what it means
    for a dump (``action``: "decoding" or "checking"; ``likely``: what a budget overrun usually is;
    ``text_end``: the text's length without trailing blanks, where a cut-short file fails)."""
    try:
        yield
    except MemoryError as exc:
        raise DumpError(f"{action} these {size:,} bytes of JSON needs more than the {budget >> 20} MiB a real dump "
                        f"of this size could need ({likely}): hostile or corrupt, so it was refused; collect it "
                        "again") from exc
    except UnicodeDecodeError as exc:
        raise DumpError("neither a pickle nor UTF-8 JSON") from exc
    except json.JSONDecodeError as exc:
        if exc.pos >= text_end:
            raise DumpError(f"not valid JSON: it ends early, at byte {exc.pos}, so the file was "
                            "cut short; collect it again") from exc
        raise DumpError(f"not a pickle, and not valid JSON ({exc.msg} at byte {exc.pos})") from exc
    except ValueError as exc:
        # A number with more digits than Python converts (sys.int_info.default_max_str_digits).
        raise DumpError(f"JSON holds an impossible value ({str(exc)[:80]})") from exc
    except RecursionError as exc:
        raise DumpError("JSON nested too deeply") from exc


def _json_loads(data: bytes) -> object:
    # The same budgets as a pickle's: 47 MiB of ``{}`` would otherwise take a worker to 1.2 GiB.
    # The CPU limit is the general bound (the C decoder never returns to Python midway, so a
    # decode past it is ended by the worker's owner).
    budget = decode_budget(len(data), JSON_DECODE_BYTES_PER_INPUT_BYTE)
    with json_decode_errors(action="decoding", size=len(data), budget=budget, text_end=len(data.rstrip()),
                            likely="a flood of empty objects or lists"), cpu_limit(len(data)):
        return decode_within(budget, lambda: json.loads(data))
