"""Compare, correlate and plan: each its own task over one core function."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from prefect import task

from denpex.analysis.batch import RankOutcome
from denpex.analysis.models import TriageResult
from denpex.analysis.triage import EvidenceInventory, triage_outcomes
from denpex.evidence.store import open_store
from denpex.hardware import correlate
from denpex.isolation.plan import IsolationPlan
from denpex.isolation.planner import plan_for_triage
from denpex.isolation.policy import Scheduler
from denpex.workflow.telemetry_files import telemetry_in_store

__all__ = ["compare_ranks", "correlate_telemetry", "plan_isolation_task"]


@task(name="compare-ranks")
def compare_ranks(inventory: EvidenceInventory, batches: list[list[RankOutcome]],
                  as_of: datetime | None) -> TriageResult:
    """Merge the batches' summaries and compare the ranks."""
    return triage_outcomes(inventory, [o for batch in batches for o in batch], as_of=as_of)


@task(name="correlate-telemetry", retries=2, retry_delay_seconds=[2, 5])
def correlate_telemetry(result: TriageResult, inventory: EvidenceInventory) -> TriageResult:
    """Line hardware signals from the incident's telemetry files up with the candidates."""
    telemetry = telemetry_in_store(open_store(inventory.store_uri))
    if not telemetry.events:
        return result
    return correlate(result, inventory.manifest, telemetry)


@task(name="plan-isolation")
def plan_isolation_task(result: TriageResult, scheduler: Scheduler, incident_id: str, runbook: Path,
                        job_id: str | None) -> IsolationPlan:
    """The isolation plan under the runbook's policy (the executor re-checks it on live facts)."""
    return plan_for_triage(result, scheduler, incident_id=incident_id, runbook=runbook, job_id=job_id)
