"""Where the collector writes, and how: whole files only (temporary name, then rename).

    <out>/rank_<global rank>.pkl          FR pickle, with stack traces
    <out>/rank_<global rank>.json         FR JSON
    <out>/collector/rank_<r>.record.json  who dumped, where, when and why (DumpRecord)
    <out>/collector/rank_<r>.stacks.json  every Python thread's stack at the dump (RankStacks)
    <out>/collector/rank_<r>.py-spy.stacks.json  the same read by py-spy from outside, written by
                                          the stacks sidecar when the rank missed its dump
    <out>/collector/dump-request.json     the shared request (FileDumpSignal)

Evidence readers list only the files directly in ``<out>``, so ``collector/`` never looks like a
dump; a temporary file left by a crash is hidden and ends in ``.tmp``, which readers skip too.
"""

from __future__ import annotations

import os
from pathlib import Path

from denpex.collector.flight_recorder import DumpFormat
from denpex.evidence.dump_record import COLLECTOR_DIR
from denpex.evidence.files import temporary_name, write_atomic
from denpex.evidence.stacks import StackSource, stacks_file_name

__all__ = ["COLLECTOR_DIR", "dump_path", "record_path", "request_path", "stacks_path", "write_atomic",
           "write_exclusive"]

REQUEST_NAME = "dump-request.json"


def dump_path(out_dir: Path, rank: int, fmt: DumpFormat) -> Path:
    """``<out>/rank_<rank>.pkl`` or ``.json``."""
    return out_dir / f"rank_{rank}{fmt.suffix}"


def record_path(out_dir: Path, rank: int) -> Path:
    """``<out>/collector/rank_<rank>.record.json``."""
    return out_dir / COLLECTOR_DIR / f"rank_{rank}.record.json"


def stacks_path(out_dir: Path, rank: int, source: StackSource = StackSource.COLLECTOR) -> Path:
    """``<out>/collector/rank_<rank>.stacks.json``, or ``.py-spy.stacks.json`` for the sidecar's."""
    return out_dir / COLLECTOR_DIR / stacks_file_name(rank, source)


def request_path(out_dir: Path) -> Path:
    """Where :class:`FileDumpSignal` keeps the request by default."""
    return out_dir / COLLECTOR_DIR / REQUEST_NAME


def write_exclusive(path: Path, data: bytes) -> bool:
    """Write ``path`` only if it does not exist yet; return whether this call wrote it.

    A complete temporary file is linked into place: link() fails when the name exists, so of
    several writers racing (ranks on one shared file system, NFS included) exactly one wins.
    """
    tmp = temporary_name(path)
    write_atomic(tmp, data)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)
    return True
