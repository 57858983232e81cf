"""Denpex's own stacks files (:class:`RankStacks` as JSON): the collector's and the py-spy sidecar's.

Both are written beside the dump (``<out>/collector/rank_<r>.stacks.json``, ``...py-spy.json``,
see :mod:`denpex.collector.layout`) and may come back through an upload, so they are read as
untrusted: bounded in bytes, trimmed to the model's limits, typed.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from denpex.evidence.errors import EvidenceError
from denpex.evidence.stacks.bounds import load_json, validated
from denpex.evidence.stacks.model import MAX_BYTES, RankStacks, StackError, StackSource
from denpex.evidence.store import EvidenceStore, open_store

__all__ = ["CollectedStacks", "STACKS_DIR", "parse_stacks_record", "read_collected_stacks", "read_stacks_record",
           "stacks_file_name"]

STACKS_DIR = "collector"
"""Beside the dumps, where dump readers never look (``denpex.collector.layout``)."""
_NAME = re.compile(r"rank_(\d{1,8})(?:\.(py-spy))?\.stacks\.json")


def stacks_file_name(rank: int, source: StackSource = StackSource.COLLECTOR) -> str:
    """``rank_2.stacks.json`` (the collector's) or ``rank_2.py-spy.stacks.json`` (the sidecar's)."""
    if source is StackSource.COLLECTOR:
        return f"rank_{rank}.stacks.json"
    if source is StackSource.PY_SPY:
        return f"rank_{rank}.py-spy.stacks.json"
    raise ValueError(f"no stacks file is written for source {source.value!r}")


class CollectedStacks(BaseModel):
    """The stacks files of a dump folder: the records read, and why the others were refused."""

    model_config = ConfigDict(frozen=True)

    records: list[RankStacks]
    refused: dict[str, str]
    """File name -> the reason, one sentence."""


def read_collected_stacks(location: EvidenceStore | Path) -> CollectedStacks:
    """Every ``collector/rank_<r>[.py-spy].stacks.json`` under ``location`` (a dump folder or any
    evidence store, S3 included); a file whose record names another rank or source than its name
    is refused (one rank must not speak for another), as is one over :data:`MAX_BYTES`."""
    root = location if not isinstance(location, Path) else open_store(location)
    records: list[RankStacks] = []
    refused: dict[str, str] = {}
    try:
        folder = root.folder(STACKS_DIR)
        objects = folder.list()
    except EvidenceError:
        return CollectedStacks(records=[], refused={})  # no collector folder: no stacks from it
    for obj in objects:
        match = _NAME.fullmatch(obj.name)
        if match is None:
            continue
        if obj.size > MAX_BYTES:
            refused[obj.name] = f"{obj.name} is {obj.size:,} bytes, over the limit of {MAX_BYTES:,}: refused"
            continue
        expected = StackSource.PY_SPY if match.group(2) else StackSource.COLLECTOR
        try:
            record = parse_stacks_record(folder.read(obj.name, max_bytes=MAX_BYTES), what=obj.name)
        except EvidenceError as exc:  # StackError, or the store's own (unreadable, grew past the cap)
            refused[obj.name] = str(exc)
            continue
        if record.rank != int(match.group(1)) or record.source is not expected:
            refused[obj.name] = (f"the record says rank {record.rank}, source {record.source.value}: "
                                 "not what its name says")
            continue
        records.append(record)
    return CollectedStacks(records=records, refused=refused)


def parse_stacks_record(data: bytes, *, what: str = "stacks file") -> RankStacks:
    """``data``, a stacks file's bytes, as a :class:`RankStacks`; :class:`StackError` says why not.

    A file within every bound (as the collector writes them) is validated straight from its bytes;
    any other goes the long way (decode, trim to the bounds with notes, validate) so that what can
    be trimmed is, and what is refused is refused with its reason.
    """
    if len(data) <= MAX_BYTES:
        try:
            return RankStacks.model_validate_json(data)
        except ValidationError:
            pass  # over a bound, or wrong: the long way says which
    return validated(load_json(data, what=what), what=what)


def read_stacks_record(path: Path) -> RankStacks:
    """:func:`parse_stacks_record` of the file at ``path``; reads no more than the limit allows."""
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_BYTES + 1)
    except OSError as exc:
        raise StackError(f"{path.name}: cannot be read ({exc.strerror or exc})") from exc
    return parse_stacks_record(data, what=path.name)
