"""The ``identity`` part of an upload: who the rank is, in which job and incident.

Example::

    {"job_id": "job-123", "incident_id": "fr-20261201T130914Z", "rank": 2, "world_size": 4,
     "host": "gpu-node-003", "local_rank": 2, "pid": 4242, "dumped_at": "2026-12-01T13:09:14Z",
     "process_groups": {"0": {"desc": "default_pg", "ranks": [0, 1, 2, 3]}}}
"""

from __future__ import annotations

from datetime import datetime
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from denpex.evidence.loading import validation_problems
from denpex.evidence.manifest import MAX_WORLD_SIZE, HostName, PlainText, ProcessGroupSpec, RankIdentity
from denpex.ingest.errors import InvalidRequestError

__all__ = ["UploadIdentity", "TelemetryIdentity", "parse_identity", "parse_telemetry_identity", "ID_PATTERN", "INCIDENT_ID_PATTERN"]

# Ids become parts of storage keys: no slashes, no dot-dot, nothing a shell or S3 treats specially.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
# An incident id also names the isolation plan and labels Kubernetes nodes: 1-63 characters,
# starting and ending with a letter or digit.
INCIDENT_ID_PATTERN = r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$"


class UploadIdentity(BaseModel):
    """One rank's identity as its collector sends it. Unknown fields are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_id: str = Field(pattern=ID_PATTERN)
    incident_id: str = Field(pattern=INCIDENT_ID_PATTERN)
    rank: int = Field(ge=0)
    world_size: int = Field(gt=0, le=MAX_WORLD_SIZE)
    host: HostName | None = None
    local_rank: int | None = Field(default=None, ge=0)
    pid: int | None = Field(default=None, ge=0)
    gpu_uuid: PlainText | None = None
    gpu_pci_bus_id: PlainText | None = None
    dumped_at: datetime | None = None
    process_groups: dict[PlainText, ProcessGroupSpec] = Field(default_factory=dict)
    # The job's torch version (additive, issue 29): dumps differ by release.
    torch_version: PlainText | None = Field(default=None, max_length=64)

    @model_validator(mode="after")
    def _ranks_in_world(self) -> "UploadIdentity":
        outside = [self.rank] if self.rank >= self.world_size else []
        outside += [r for pg in self.process_groups.values() for r in pg.ranks if r >= self.world_size]
        if outside:
            raise ValueError(f"rank(s) {sorted(set(outside))} outside world_size {self.world_size}")
        return self

    def rank_identity(self) -> RankIdentity:
        """This rank's entry in the incident's manifest."""
        return RankIdentity(host=self.host, local_rank=self.local_rank, pid=self.pid, gpu_uuid=self.gpu_uuid,
                            gpu_pci_bus_id=self.gpu_pci_bus_id, dumped_at=self.dumped_at)


class TelemetryIdentity(BaseModel):
    """The ``identity`` of a node agent's telemetry-only upload: which job (and incident) its host's
    telemetry is for. Without ``incident_id`` it joins the job's open incident. ``host``, when
    given, must be the key's own."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_id: str = Field(pattern=ID_PATTERN)
    incident_id: str | None = Field(default=None, pattern=INCIDENT_ID_PATTERN)
    host: HostName | None = None


def parse_identity(data: bytes | str) -> UploadIdentity:
    """Validate the identity JSON; every problem is named in one 422."""
    return _parse(UploadIdentity, data)


def parse_telemetry_identity(data: bytes | str) -> TelemetryIdentity:
    """Validate a telemetry-only upload's identity JSON; every problem is named in one 422."""
    return _parse(TelemetryIdentity, data)


_Model = TypeVar("_Model", bound=BaseModel)


def _parse(model: type[_Model], data: bytes | str) -> _Model:
    try:
        return model.model_validate_json(data)
    except ValidationError as exc:
        problems = validation_problems(exc, first=10)
        raise InvalidRequestError(f"invalid identity: {problems}") from exc
