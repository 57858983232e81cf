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
from denpex.isolation.planner import plan_isolation
from denpex.isolation.policy import Scheduler
from denpex.isolation.runbook import load_runbook
from denpex.workflow.telemetry_files import telemetry_in_store
from tasks.options import NOT_CACHED

__all__ = ["compare_ranks", "correlate_telemetry", "plan_isolation_task"]


@task(name="compare-ranks", **NOT_CACHED)
def compare_ranks(inventory: EvidenceInventory, batches: list[list[RankOutcome]],
                  as_of: datetime | None) -> TriageResult:
    """Merge the batches' summaries and compare the ranks."""
    return triage_outcomes(inventory, [o for batch in batches for o in batch], as_of=as_of)


@task(name="correlate-telemetry", retries=2, retry_delay_seconds=[2, 5], **NOT_CACHED)
def correlate_telemetry(result: TriageResult, inventory: EvidenceInventory) -> TriageResult:
    """Line hardware signals from the incident's telemetry files up with the candidates."""
    telemetry = telemetry_in_store(open_store(inventory.store_uri))
    if telemetry.events:
        result = correlate(result, inventory.manifest, telemetry)
    return result.model_copy(update={"telemetry_files": list(telemetry.sources)})


@task(name="plan-isolation", **NOT_CACHED)
def plan_isolation_task(result: TriageResult, inventory: EvidenceInventory, scheduler: Scheduler, runbook: Path, *,
                        incident_id: str, tenant: str | None, cluster: str, as_of: datetime) -> IsolationPlan:
    """The isolation plan under the runbook's policy, bound to the tenant (the cluster's registered
    owner; None: none) and cluster (the executor re-checks it all on live facts)."""
    job_id = inventory.manifest.job_id if inventory.manifest else None
    return plan_isolation(result, inventory.manifest, load_runbook(runbook).policy(), None, scheduler, incident_id,
                          result.as_of or as_of, cluster=cluster, tenant=tenant, job_id=job_id)
