"""Denpex's own stacks files (:class:`RankStacks` as JSON): the collector's and the py-spy sidecar's.

Both are written beside the dump (``<out>/collector/rank_<r>.stacks.json``, ``...py-spy.json``,
see :mod:`denpex.collector.layout`) and may come back through an upload, so they are read as
untrusted: bounded in bytes, trimmed to the model's limits, typed.
"""

from __future__ import annotations

from pathlib import Path

from denpex.evidence.stacks.bounds import load_json, validated
from denpex.evidence.stacks.model import MAX_BYTES, RankStacks, StackError

__all__ = ["parse_stacks_record", "read_stacks_record"]


def parse_stacks_record(data: bytes, *, what: str = "stacks file") -> RankStacks:
    """``data``, a stacks file's bytes, as a :class:`RankStacks`; :class:`StackError` says why not."""
    return validated(load_json(data, what=what), what=what)


def read_stacks_record(path: Path) -> RankStacks:
    """:func:`parse_stacks_record` of the file at ``path``; reads no more than the limit allows."""
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_BYTES + 1)
    except OSError as exc:
        raise StackError(f"{path.name}: cannot be read ({exc.strerror or exc})") from exc
    return parse_stacks_record(data, what=path.name)
