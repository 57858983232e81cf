"""What each rank records about its dump, and how the records become the manifest's ``ranks``.

The collector (``denpex.collector``, inside the training job) writes one record per rank beside
its dump, in ``collector/rank_<r>.record.json``; the analysis reads them as evidence when no
manifest was given (``denpex.analysis.collector_records``). The format is the evidence's, so it
lives here, below both.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from datetime import datetime
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from denpex.evidence.loading import FileKind, read_model
from denpex.evidence.manifest import ProcessGroupSpec, RankIdentity
from denpex.evidence.stacks.records import STACKS_DIR

__all__ = ["COLLECTOR_DIR", "MAX_RECORD_BYTES", "DumpTrigger", "DumpRecord", "read_dump_records", "rank_identities"]

_log = logging.getLogger(__name__)

COLLECTOR_DIR = STACKS_DIR
"""The collector's folder beside the dumps: its records and its stacks files (``collector/``)."""
MAX_RECORD_BYTES = 4 * 1024 * 1024
"""A dump record's cap, on a node's disk and in the evidence store alike."""
_RECORD_FILE = FileKind("dump record")


class DumpTrigger(StrEnum):
    """Why a rank dumped."""

    STALL = "stall"
    """This rank had one collective in flight for the trigger fraction of its timeout."""
    REQUEST = "request"
    """Another rank, or an operator, asked through the shared signal."""
    ERROR = "error"
    """Code run under the dumper raised (e.g. a collective failed)."""
    MANUAL = "manual"
    """The job called :meth:`HangDumper.dump_now` itself."""
    RECOVERED = "recovered"
    """Every op this rank had in flight at its first dump completed (or, had it none when it
    answered a request, it completed a new one): the job moved on. The dump replaces the first
    one, so a triage waiting for approval sees the recovery (:mod:`denpex.collector.moved_past`)."""


class DumpRecord(BaseModel):
    """The sidecar each rank writes next to its dump; merged into the job manifest."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rank: int = Field(ge=0)
    host: str | None = None
    local_rank: int | None = Field(default=None, ge=0)
    pid: int = Field(ge=0)
    dumped_at: datetime
    trigger: DumpTrigger
    reason: str
    files: list[str]
    dump_seconds: float = Field(ge=0.0, description="how long taking and writing the dumps took")
    # What the manifest would say, as the rank saw it (denpex.collector.job_identity); absent in
    # records written before these fields existed.
    world_size: int | None = Field(default=None, gt=0)
    process_groups: dict[str, ProcessGroupSpec] = Field(default_factory=dict)
    gpu_uuid: str | None = None
    gpu_pci_bus_id: str | None = None
    # The job's torch (issue 29): each release lays its dumps out its own way (README, "Torch
    # versions"); None where the job had not imported torch.
    torch_version: str | None = Field(default=None, max_length=64)

    def identity(self) -> RankIdentity:
        """This rank's manifest entry."""
        return RankIdentity(host=self.host, local_rank=self.local_rank, pid=self.pid,
                            dumped_at=self.dumped_at, gpu_uuid=self.gpu_uuid,
                            gpu_pci_bus_id=self.gpu_pci_bus_id)


def read_dump_records(out_dir: Path) -> dict[int, DumpRecord]:
    """Every rank's :class:`DumpRecord` under ``out_dir``, by rank. Unreadable records are skipped."""
    records: dict[int, DumpRecord] = {}
    for path in sorted((out_dir / COLLECTOR_DIR).glob("rank_*.record.json")):
        try:
            record = read_model(path, DumpRecord, max_bytes=MAX_RECORD_BYTES, kind=_RECORD_FILE, error=ValueError)
        except ValueError as exc:
            _log.warning("skipping dump record %s: %s", path, exc)
            continue
        records[record.rank] = record
    return records


def rank_identities(records: Iterable[DumpRecord],
                    known: Mapping[int, RankIdentity] | None = None) -> dict[int, RankIdentity]:
    """Manifest ``ranks``: what the launcher knew (``known``), updated by what each rank recorded."""
    merged = dict(known or {})
    for record in records:
        before = merged.get(record.rank)
        fields = record.identity().model_dump(exclude_none=True)
        merged[record.rank] = before.model_copy(update=fields) if before else RankIdentity(**fields)
    return dict(sorted(merged.items()))
