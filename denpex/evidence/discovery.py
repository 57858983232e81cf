"""Find the dumps in a store and decide which rank each belongs to.

The rank comes from the manifest (``ranks[r].dump_file``), else from the trailing number of the
file name, ignoring an extension such as ``.json`` or ``.pkl`` (docs/contracts.md)::

    comm_lib_trace_rank_12   -> 12        rank_1.pkl -> 1        dump-007.json -> 7
    manifest.json, notes.txt -> skipped and reported, never fatal
    kernel.log, gpu.jsonl    -> telemetry (``is_telemetry_name``), read as such, never a dump

Two files for one rank are both refused (a rank must not look healthy on borrowed evidence),
except the same dump in both encodings (``rank_3.pkl`` and ``rank_3.json``): the pickle is kept.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

from denpex.evidence.dump_ref import DumpRef
from denpex.evidence.manifest import MAX_WORLD_SIZE, JobManifest
from denpex.evidence.skipped import SkippedFile
from denpex.evidence.stacks.torch_debug import is_debug_stacks_name
from denpex.evidence.store import StoredObject

__all__ = ["Inventory", "rank_from_file_name", "is_candidate_name", "is_telemetry_name",
           "discover_dumps", "NOT_EVIDENCE", "TELEMETRY_SUFFIXES"]

# Names Denpex itself writes next to dumps; they are not dumps and not worth a warning.
NOT_EVIDENCE = frozenset({"manifest.json", "expected.json", "telemetry.json"})
# Telemetry that travels with the dumps: kernel logs and collector output. One rule for the CLI,
# the flow and the demo (denpex.workflow.telemetry_files reads them).
TELEMETRY_SUFFIXES = (".log", ".jsonl")
_EXTENSIONS = (".json", ".pkl", ".pickle", ".pt", ".bin", ".dump")
_TRAILING_NUMBER = re.compile(r"([0-9]+)$")
# More digits than any rank has; such a number is not converted (int() refuses > 4,300 digits).
_MAX_DIGITS = 18


@dataclass(slots=True)
class Inventory:
    """The dumps found, keyed by rank, and every file that was set aside with its reason."""

    dumps: dict[int, DumpRef] = field(default_factory=dict)
    skipped: list[SkippedFile] = field(default_factory=list)
    # The JSON twin of a rank's pickle (same file stem): meant to be the same dump, which the
    # analysis checks rather than assumes.
    twins: dict[int, DumpRef] = field(default_factory=dict)


def is_candidate_name(name: str) -> bool:
    """False for Denpex's own files and for hidden or temporary ones (a write in progress)."""
    return name not in NOT_EVIDENCE and not name.startswith(".") and not name.endswith(".tmp")


def is_telemetry_name(name: str) -> bool:
    """A kernel log (``*.log``) or collector output (``*.jsonl``): telemetry, not a dump."""
    return name.lower().endswith(TELEMETRY_SUFFIXES)


def rank_from_file_name(name: str) -> int | None:
    """The trailing number of ``name`` without a known extension, or None."""
    match = _TRAILING_NUMBER.search(_stem(name))
    if match is None:
        return None
    digits = match.group(1)
    # A number longer than any rank stands as MAX_WORLD_SIZE, which no rank reaches.
    return int(digits) if len(digits) <= _MAX_DIGITS else MAX_WORLD_SIZE


def _short_number(rank: int) -> str:
    return str(rank) if rank < MAX_WORLD_SIZE else f"{rank} or more"


def discover_dumps(store_uri: str, objects: list[StoredObject], manifest: JobManifest | None,
                   world_size: int) -> Inventory:
    """Assign each object to a rank, or skip it with a reason."""
    by_file = {ident.dump_file: rank for rank, ident in (manifest.ranks.items() if manifest else [])
               if ident.dump_file}
    inventory = Inventory()
    claims: dict[int, list[StoredObject]] = defaultdict(list)
    for obj in objects:
        if not is_candidate_name(obj.name):
            continue
        rank = by_file.get(obj.name)
        if rank is None and is_telemetry_name(obj.name):
            continue  # read as telemetry, and listed as such, not skipped as "not a dump"
        if rank is None and is_debug_stacks_name(obj.name):
            continue  # torch's debug server's stacks: read as stack evidence (denpex.evidence.stacks)
        if rank is None:
            rank = rank_from_file_name(obj.name)
        if rank is None:
            inventory.skipped.append(SkippedFile(
                path=obj.name, reason="not a dump: no rank in the manifest and no trailing number"))
        elif rank >= MAX_WORLD_SIZE:
            inventory.skipped.append(SkippedFile(
                path=obj.name, reason=f"not a dump: its trailing number {_short_number(rank)} is too "
                                      "large to be a rank (a timestamp or a pid?)"))
        elif rank >= world_size:
            inventory.skipped.append(SkippedFile(
                path=obj.name, rank=rank, reason=f"rank {rank} is outside world size {world_size}"))
        else:
            claims[rank].append(obj)
    for rank, files in sorted(claims.items()):
        chosen = _one_dump_per_rank(rank, files, inventory.skipped)
        if chosen is not None:
            inventory.dumps[rank] = DumpRef(store_uri, chosen.name, rank, chosen.size, chosen.modified,
                                            chosen.version)
            twin = next((f for f in files if f is not chosen), None)
            if twin is not None:
                inventory.twins[rank] = DumpRef(store_uri, twin.name, rank, twin.size, twin.modified, twin.version)
    return inventory


def _one_dump_per_rank(rank: int, files: list[StoredObject],
                       skipped: list[SkippedFile]) -> StoredObject | None:
    if len(files) == 1:
        return files[0]
    stems = {_stem(f.name) for f in files}
    if len(stems) == 1 and len(files) == 2:
        json_file = next((f for f in files if f.name.lower().endswith(".json")), None)
        if json_file is not None:
            kept = files[0] if files[1] is json_file else files[1]
            skipped.append(SkippedFile(path=json_file.name, rank=rank, copy_of=kept.name,
                                       reason=f"same dump as {kept.name} in JSON; the pickle is used"))
            return kept
    names = ", ".join(f.name for f in files)
    for f in files:
        skipped.append(SkippedFile(path=f.name, rank=rank,
                                   reason=f"rank {rank} is claimed by several files ({names}); none is used"))
    return None


def _stem(name: str) -> str:
    lowered = name.lower()
    for ext in _EXTENSIONS:
        if lowered.endswith(ext):
            return name[: -len(ext)]
    return name
