"""What ``GET /v1/incidents/{id}`` answers: which ranks are in, which are missing, and the run."""

from __future__ import annotations

from pydantic import BaseModel

from denpex.ingest.flow_trigger import FlowRunView, FlowTrigger
from denpex.ingest.incidents import IncidentBook, IncidentKey, RunState
from denpex.ingest.errors import NotFoundError

__all__ = ["MISSING_RANKS_LISTED", "RankCoverage", "IncidentView", "incident_view"]

MISSING_RANKS_LISTED = 4096
"""The most missing ranks one answer lists; ``missing_count`` always says how many there are."""


class RankCoverage(BaseModel):
    """One rank's evidence: its newest version and that version's encodings."""

    rank: int
    version: int
    encodings: list[str]
    sha256: list[str]


class IncidentView(BaseModel):
    """An incident as its tenant sees it."""

    tenant: str
    cluster: str
    job_id: str
    incident_id: str
    world_size: int | None
    ranks_with_evidence: list[int]
    missing_ranks: list[int]
    """The lowest missing ranks, at most MISSING_RANKS_LISTED of them."""
    missing_count: int
    """How many ranks of the world have no evidence (all of them, listed or not)."""
    missing_ranks_truncated: bool
    ranks: list[RankCoverage]
    telemetry: dict[str, int]
    alert_id: str | None
    alert_deliveries: int
    resolved_at: str | None
    run_state: RunState
    flow_run: FlowRunView | None


def incident_view(book: IncidentBook, trigger: FlowTrigger, key: IncidentKey) -> IncidentView:
    """Coverage and the flow run's state; an incident of another tenant or cluster is not found."""
    record = book.record(key)
    if record is None:
        raise NotFoundError(f"no incident {key.incident_id!r} for tenant {key.tenant!r}, cluster {key.cluster!r}")
    uploads = book.uploads(key)
    newest: dict[int, int] = {}
    for upload in uploads:
        newest[upload.rank] = max(newest.get(upload.rank, 0), upload.version)
    ranks = [RankCoverage(rank=rank, version=version,
                          encodings=sorted(u.encoding.value for u in uploads if u.rank == rank and u.version == version),
                          sha256=sorted(u.sha256 for u in uploads if u.rank == rank and u.version == version))
             for rank, version in sorted(newest.items())]
    world_size = book.world_size(key)
    missing, missing_count = _missing(world_size or 0, set(newest))
    telemetry = book.telemetry(key)
    run = trigger.find_run(record.alert_id) if record.alert_id and record.run_state is RunState.STARTED else None
    return IncidentView(tenant=key.tenant, cluster=key.cluster, job_id=record.job_id, incident_id=key.incident_id,
                        world_size=world_size, ranks_with_evidence=sorted(newest), missing_ranks=missing,
                        missing_count=missing_count, missing_ranks_truncated=len(missing) < missing_count, ranks=ranks,
                        telemetry={"trusted": sum(t.trusted for t in telemetry),
                                   "untrusted": sum(not t.trusted for t in telemetry)},
                        alert_id=record.alert_id, alert_deliveries=record.deliveries, resolved_at=record.resolved_at,
                        run_state=record.run_state, flow_run=run)


def _missing(world_size: int, present: set[int]) -> tuple[list[int], int]:
    """The lowest missing ranks (bounded) and their count, never building ``range(world_size)``:
    a world of 2^20 ranks with one upload would otherwise build a million-entry answer."""
    listed: list[int] = []
    rank = 0
    while rank < world_size and len(listed) < MISSING_RANKS_LISTED:
        if rank not in present:
            listed.append(rank)
        rank += 1
    return listed, world_size - len({r for r in present if 0 <= r < world_size})
