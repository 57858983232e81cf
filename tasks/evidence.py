"""Evidence tasks: wait for coverage (with a progress artifact), then list the dumps to parse."""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID

from prefect import task
from prefect.artifacts import create_progress_artifact, update_progress_artifact

from denpex.analysis.triage import EvidenceInventory, take_inventory
from denpex.evidence.store import open_store
from denpex.workflow.coverage import Coverage, wait_for_coverage
from tasks.options import NOT_CACHED

__all__ = ["wait_for_evidence", "reread_inventory"]


@task(name="wait-for-evidence", retries=2, retry_delay_seconds=[2, 5], **NOT_CACHED)
def wait_for_evidence(evidence: str, world_size: int | None, grace: timedelta, poll: timedelta,
                      artifact_key: str) -> EvidenceInventory:
    """Poll the store until ranks 0..world_size-1 are in or ``grace`` ends; show coverage as it grows."""
    store = open_store(evidence)
    progress: list[UUID] = []

    def show(coverage: Coverage) -> None:
        percent = round(100 * coverage.fraction, 1)
        if not progress:
            made = create_progress_artifact(progress=percent, key=artifact_key,
                                            description=_describe(coverage))
            progress.append(made if isinstance(made, UUID) else UUID(str(made)))
        else:
            update_progress_artifact(progress[0], progress=percent,
                                     description=_describe(coverage))

    return wait_for_coverage(lambda: take_inventory(store, world_size=world_size),
                             grace=grace, poll=poll, on_change=show)


@task(name="reread-inventory", retries=2, retry_delay_seconds=[2, 5], **NOT_CACHED)
def reread_inventory(evidence: str, world_size: int | None) -> EvidenceInventory:
    """List the store again (recovery check before acting)."""
    return take_inventory(open_store(evidence), world_size=world_size)


def _describe(coverage: Coverage) -> str:
    missing = coverage.missing
    shown = ", ".join(map(str, missing[:32])) + (" ..." if len(missing) > 32 else "")
    return (f"Evidence: {len(coverage.present)} of {coverage.world_size} ranks in"
            + (f"; waiting for ranks {shown}" if missing else ""))
