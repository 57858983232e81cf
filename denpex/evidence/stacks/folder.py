"""All the stack evidence a dump folder holds: the collector's and the sidecar's files, and the
torch debug server's stacks file taken nearest the incident.

    >>> evidence = read_stack_evidence(Path("/shared/job-123/fr"), at=incident_time)
    >>> evidence.records          # RankStacks from every source found, several per rank possible
    >>> evidence.refused          # file -> why it was set aside (the triage goes on without it)
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from denpex.evidence.stacks.model import RankStacks, StackError
from denpex.evidence.stacks.records import read_collected_stacks
from denpex.evidence.store import EvidenceStore, open_store
from denpex.evidence.stacks.torch_debug import debug_stacks_files, nearest_debug_stacks, read_debug_stacks

__all__ = ["StackEvidence", "read_stack_evidence"]


class StackEvidence(BaseModel):
    """Every stacks record read from one place, and what was set aside."""

    model_config = ConfigDict(frozen=True)

    records: list[RankStacks] = Field(default_factory=list)
    refused: dict[str, str] = Field(default_factory=dict)
    """File name -> why it was set aside whole."""
    notes: list[str] = Field(default_factory=list)
    """What was trimmed or skipped inside a file that was used (a debug-server file's bad section)."""
    debug_file: str | None = None
    """The debug server's file used, if any."""


def read_stack_evidence(location: EvidenceStore | Path, *, at: datetime | None,
                        max_gap: timedelta = timedelta(minutes=5), world_size: int | None = None) -> StackEvidence:
    """Read the stacks of a dump folder or store (``denpex triage``'s PATH, S3 included):
    ``collector/rank_*.stacks.json`` and the ``stacks_<time>.txt`` nearest ``at`` (the dump or
    incident time; the newest when ``at`` is None).

    Given ``world_size``, the debug server's file is left unparsed when Denpex's own files already
    hold a stack for every rank: they are preferred over it anyway, and at 4,096 ranks parsing it
    is most of the cost (``benchmarks/stacks_scale.py``)."""
    folder = location if not isinstance(location, Path) else open_store(location)
    collected = read_collected_stacks(folder)
    records = list(collected.records)
    refused = dict(collected.refused)
    notes: list[str] = []
    files = debug_stacks_files(folder)
    chosen = (nearest_debug_stacks(files, at, max_gap) if at is not None else (files[-1] if files else None))
    if chosen is not None and world_size is not None and _every_rank_has_one(records, world_size):
        notes.append(f"{chosen.name} (torch's debug server) was not read: Denpex's own stacks files "
                     "give every rank a stack, and they are preferred")
        return StackEvidence(records=records, refused=refused, notes=notes, debug_file=None)
    if chosen is not None:
        try:
            debug = read_debug_stacks(folder, chosen)
        except StackError as exc:
            refused[chosen.name] = str(exc)
        else:
            records.extend(debug.ranks.values())
            notes = [f"{chosen.name}: {note}" for note in debug.notes]
    return StackEvidence(records=records, refused=refused, notes=notes,
                         debug_file=chosen.name if chosen else None)


def _every_rank_has_one(records: list[RankStacks], world_size: int) -> bool:
    ranks = {r.rank for r in records if r.unavailable is None and any(t.frames for t in r.threads)}
    return world_size > 0 and all(rank in ranks for rank in range(world_size))
