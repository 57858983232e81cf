"""The manifest that Denpex's own collector left beside the dumps.

``HangDumper`` writes, per rank, ``collector/rank_<r>.record.json`` (a ``DumpRecord``): host,
local rank, pid, GPU, when it dumped and why, the world size and the process groups the rank
is a member of. A folder it wrote needs no manifest: the records are one, with each dump's time
(what tells a slow rank from a hung one) and every group's members (each group as its members
saw it; the union over the ranks covers every group that has a member who dumped).
"""

from __future__ import annotations

from pydantic import ValidationError

from denpex.evidence.dump_record import COLLECTOR_DIR, MAX_RECORD_BYTES, DumpRecord, rank_identities
from denpex.evidence.errors import EvidenceError
from denpex.evidence.manifest import MAX_WORLD_SIZE, JobManifest, ProcessGroupSpec
from denpex.evidence.store import EvidenceStore

__all__ = ["RecordsManifest", "manifest_from_records"]

_RECORD_SUFFIX = ".record.json"


class RecordsManifest:
    """The manifest built from the records, and what the reader noticed on the way."""

    __slots__ = ("manifest", "notes")

    def __init__(self, manifest: JobManifest | None, notes: list[str]) -> None:
        self.manifest = manifest
        self.notes = notes


def manifest_from_records(store: EvidenceStore, world_size: int | None) -> RecordsManifest:
    """Read ``collector/*.record.json`` under ``store``; no records gives no manifest."""
    try:
        folder = store.folder(COLLECTOR_DIR)
        names = [o.name for o in folder.list() if o.name.endswith(_RECORD_SUFFIX)]
    except EvidenceError:
        return RecordsManifest(None, [])
    records: dict[int, DumpRecord] = {}
    notes = []
    for name in names:
        try:
            record = DumpRecord.model_validate_json(folder.read(name, max_bytes=MAX_RECORD_BYTES))
        except (EvidenceError, ValidationError) as exc:
            notes.append(f"{COLLECTOR_DIR}/{name}: not a usable collector record ({_first_line(exc)})")
            continue
        records[record.rank] = record
    if not records:
        return RecordsManifest(None, notes)
    size = world_size or max((r.world_size or 0 for r in records.values()), default=0) \
        or max(records) + 1
    if not 0 < size <= MAX_WORLD_SIZE or max(records) >= size:
        notes.append(f"{COLLECTOR_DIR}/: the records name ranks up to {max(records)}, beyond the "
                     f"world size {size}; they were not used")
        return RecordsManifest(None, notes)
    groups = _union_of_groups(records, notes)
    manifest = JobManifest(world_size=size, ranks=rank_identities(records.values()),
                           process_groups=groups)
    notes.insert(0, f"read {len(records)} collector record(s) from {COLLECTOR_DIR}/ for hosts, dump "
                    f"times and process groups ({len(groups)} group(s)); no manifest was given")
    return RecordsManifest(manifest, notes)


def _union_of_groups(records: dict[int, DumpRecord], notes: list[str]) -> dict[str, ProcessGroupSpec]:
    groups: dict[str, ProcessGroupSpec] = {}
    for rank, record in sorted(records.items()):
        for name, spec in record.process_groups.items():
            seen = groups.setdefault(name, spec)
            if seen.ranks != spec.ranks:
                notes.append(f"process group {name!r}: rank {rank}'s record lists members "
                             f"{list(spec.ranks)[:16]}, another rank's {list(seen.ranks)[:16]}; "
                             "the first is used")
    return dict(sorted(groups.items()))


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0][:200]
