"""The collector's local spool: an upload is on disk before it is tried, and leaves only once acknowledged.

    <spool>/<entry>/identity.json          the identity part
    <spool>/<entry>/dump/<file name>       the dump's bytes, under the name that says its encoding
    <spool>/<entry>/telemetry-<i>.log      optional telemetry parts
    <spool>/<entry>/stacks/<part>.json     optional stacks parts (``stacks``, ``stacks_pyspy``), copied
                                           at the dump, so a retry sends the bytes the dump came with
    <spool>/rejected/<entry>/error.txt     an upload the service refused for good (4xx), kept for a person

An entry is written under a hidden temporary name and renamed into place, so a rank killed
mid-write leaves either a whole entry or a leftover the spool ignores. Entries are delivered oldest first.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["SpoolEntry", "Spool"]

_REJECTED = "rejected"


@dataclass(frozen=True, slots=True)
class SpoolEntry:
    """One pending upload."""

    path: Path
    identity: dict[str, Any]
    dump_name: str

    def dump(self) -> bytes:
        return (self.path / "dump" / self.dump_name).read_bytes()

    def telemetry(self) -> list[bytes]:
        return [p.read_bytes() for p in sorted(self.path.glob("telemetry-*.log"))]

    def stacks(self) -> dict[str, bytes]:
        """The stacks parts by part name (``stacks``, ``stacks_pyspy``); empty for an entry without them."""
        folder = self.path / "stacks"
        return {p.stem: p.read_bytes() for p in sorted(folder.glob("*.json"))} if folder.is_dir() else {}


class Spool:
    """A folder of pending uploads; safe for one writer and one deliverer per folder."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def put(self, identity: dict[str, Any], dump_file: Path, telemetry: list[bytes],
            stacks: Mapping[str, bytes] | None = None) -> SpoolEntry:
        """Copy one dump (and its telemetry and stacks parts, by part name) into the spool, whole,
        and return its entry."""
        name = f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"
        tmp = self.root / f".{name}.tmp"
        (tmp / "dump").mkdir(parents=True)
        (tmp / "identity.json").write_text(json.dumps(identity, default=str))
        shutil.copyfile(dump_file, tmp / "dump" / dump_file.name)
        for index, data in enumerate(telemetry):
            (tmp / f"telemetry-{index}.log").write_bytes(data)
        if stacks:
            (tmp / "stacks").mkdir()
            for part, data in stacks.items():
                (tmp / "stacks" / f"{part}.json").write_bytes(data)
        _fsync_tree(tmp)
        final = self.root / name
        os.replace(tmp, final)
        return SpoolEntry(final, identity, dump_file.name)

    def pending(self) -> list[SpoolEntry]:
        """Whole entries, oldest first."""
        if not self.root.is_dir():
            return []
        entries = []
        for path in sorted(self.root.iterdir()):
            if path.name.startswith(".") or path.name == _REJECTED or not path.is_dir():
                continue
            try:
                dumps = list((path / "dump").iterdir()) if (path / "dump").is_dir() else []
                if len(dumps) != 1:
                    continue
                identity = json.loads((path / "identity.json").read_text())
            except FileNotFoundError:
                # Delivered meanwhile: another uploader's thread acknowledged it and removed it
                # while this listing ran (seen when one process reads a spool others deliver).
                continue
            entries.append(SpoolEntry(path, identity, dumps[0].name))
        return entries

    def done(self, entry: SpoolEntry) -> None:
        """The service acknowledged the upload: forget it."""
        shutil.rmtree(entry.path, ignore_errors=True)

    def reject(self, entry: SpoolEntry, reason: str) -> None:
        """The service refused it for good: keep it aside with the reason, never retried."""
        target = self.root / _REJECTED / entry.path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(entry.path, target)
        (target / "error.txt").write_text(reason + "\n")

    def rejected(self) -> list[Path]:
        """Entries the service refused for good."""
        folder = self.root / _REJECTED
        return sorted(folder.iterdir()) if folder.is_dir() else []


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
