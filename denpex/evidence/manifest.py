"""The job manifest: who each rank is and which process groups exist.

Every field except ``world_size`` is optional (docs/contracts.md). Unknown fields are refused so
that a typo such as ``"hots"`` fails loudly instead of silently dropping a rank's host.

Example::

    {"job_id": "job-123", "world_size": 4,
     "ranks": {"0": {"host": "gpu-node-001", "local_rank": 0, "pid": 4242}},
     "process_groups": {"0": {"desc": "default_pg", "ranks": [0, 1, 2, 3]}}}
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from enum import StrEnum
from typing import Annotated

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, StringConstraints,
                      field_validator, model_validator)

from denpex.evidence.errors import ManifestError
from denpex.evidence.loading import FileKind, decode, read_capped, validated

__all__ = ["HostSource", "HostMove", "RankIdentity", "ProcessGroupSpec", "JobManifest", "load_manifest", "parse_manifest_bytes",
           "MAX_WORLD_SIZE", "PlainText", "HostName"]

MAX_MANIFEST_BYTES = 64 * 1024 * 1024
_MANIFEST = FileKind("manifest", invalid="invalid manifest")
# Far above any real job. A larger "world size" is a typo, or a timestamp read as a rank, and a
# triage over it would spend its memory listing ranks that never existed.
MAX_WORLD_SIZE = 1 << 20


def _printable(value: str) -> str:
    # A newline or a control character in a name would let it start a new line of the report
    # beside the approval form (the report also escapes, but a name is never text to lay out).
    if not value.isprintable():
        raise ValueError("holds a line break or control character; names are printable text")
    return value


PlainText = Annotated[str, StringConstraints(min_length=1, max_length=256), AfterValidator(_printable)]
"""A name or description from evidence: printable, one line, at most 256 characters."""
HostName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,252}$")]
"""A node name as schedulers spell it (Slurm NodeName, a Kubernetes node): no spaces or markup."""


class HostSource(StrEnum):
    """Where a rank's placement came from (docs/contracts.md, Manifest)."""

    MANIFEST = "manifest"
    """Written by whoever made the manifest (the CLI's ``manifest.json``)."""
    REGISTERED = "registered"
    """Sent by the rank's collector at job start (``POST /v1/jobs/{job_id}/ranks``)."""
    UPLOAD = "upload"
    """Named by the rank's own dump upload."""
    DERIVED = "derived"
    """Read from the scheduler's job record: a guess (a rendezvous may order node ranks
    otherwise); alone it never supports a drain."""


class HostMove(BaseModel):
    """A rank that re-registered from another host (a restart): recorded, never overwritten silently."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    from_host: HostName
    to_host: HostName
    at: datetime


class RankIdentity(BaseModel):
    """Where one rank ran. Used to map a culprit rank to a node and a GPU."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: HostName | None = None
    local_rank: int | None = Field(default=None, ge=0)
    pid: int | None = Field(default=None, ge=0)
    gpu_pci_bus_id: PlainText | None = None
    gpu_uuid: PlainText | None = None
    gpu_index: int | None = Field(default=None, ge=0)
    # The name of this rank's dump in the evidence folder or prefix. When given, it decides
    # the rank; otherwise the rank is the trailing number of the file name.
    dump_file: PlainText | None = None
    # When the rank's collector wrote its dump. Staleness is judged on this when present.
    dumped_at: datetime | None = None
    # Where ``host`` came from; None for a manifest written before the field existed (= manifest).
    host_source: HostSource | None = None
    # Re-registrations of this rank from another host, oldest first (the job restarted elsewhere).
    moved: tuple[HostMove, ...] | None = None

    @property
    def host_is_derived(self) -> bool:
        """True when the host is the scheduler's guess, not the rank's own word."""
        return self.host_source is HostSource.DERIVED


class ProcessGroupSpec(BaseModel):
    """One process group, keyed in the manifest by the name FR records in ``process_group[0]``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    desc: Annotated[str, StringConstraints(max_length=256), AfterValidator(_printable)] | None = None
    ranks: tuple[int, ...]

    @field_validator("ranks")
    @classmethod
    def _distinct(cls, ranks: tuple[int, ...]) -> tuple[int, ...]:
        # The message names a few offenders, never the list: a hostile list is a million long.
        if len(set(ranks)) != len(ranks):
            seen: set[int] = set()
            repeated = sorted({r for r in ranks if r in seen or seen.add(r)})  # type: ignore[func-returns-value]
            raise ValueError(f"ranks repeat rank(s) {repeated[:8]} ({len(ranks):,} ranks listed)")
        if any(r < 0 for r in ranks):
            raise ValueError(f"ranks must be >= 0: {sorted(r for r in ranks if r < 0)[:8]}")
        return ranks


class JobManifest(BaseModel):
    """Identity of a job: its world size, its ranks' hosts and GPUs, its process groups."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_id: str | None = None
    tenant: str | None = None
    cluster: str | None = None
    world_size: int = Field(gt=0, le=MAX_WORLD_SIZE)
    ranks: dict[int, RankIdentity] = Field(default_factory=dict)
    process_groups: dict[PlainText, ProcessGroupSpec] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _ranks_in_world(self) -> "JobManifest":
        problems = [f"rank {r} in 'ranks'" for r in self.ranks if not 0 <= r < self.world_size]
        for name, pg in self.process_groups.items():
            problems += [
                f"rank {r} in process group {name!r}"
                for r in pg.ranks
                if not 0 <= r < self.world_size
            ]
        if problems:
            raise ValueError(
                f"outside world_size {self.world_size}: " + ", ".join(problems)
            )
        return self

    def host_of(self, rank: int) -> str | None:
        identity = self.ranks.get(rank)
        return identity.host if identity else None


def load_manifest(path: Path) -> JobManifest:
    """Read and validate ``manifest.json``; every problem is reported in one ManifestError."""
    return parse_manifest_bytes(read_capped(path, MAX_MANIFEST_BYTES, _MANIFEST, ManifestError), source=str(path))


def parse_manifest_bytes(data: bytes, *, source: str) -> JobManifest:
    """Validate manifest JSON from any store; ``source`` names it in errors."""
    return validated(JobManifest, decode(data, source, _MANIFEST, ManifestError, "json"), source, _MANIFEST,
                     ManifestError)
