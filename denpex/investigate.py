"""One investigation: triage the dumps, correlate hardware signals, propose an isolation.

This is what ``denpex triage`` runs and what the Prefect flow composes step by step. It decides
and never acts: executing a plan is ``denpex.isolation.executor``'s job, after approval.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from denpex.analysis.workers import Progress
from denpex.analysis.job_progress import JobProgress, job_progress
from denpex.analysis.triage import (
    TriageOptions,
    resolve_manifest,
    summarize_inventory,
    take_inventory,
    triage_outcomes,
)
from denpex.evidence.manifest import JobManifest
from denpex.evidence.store import open_store
from denpex.hardware import TelemetryParseResult, correlate, load_telemetry
from denpex.hardware.correlate import CorrelationOptions
from denpex.hardware.stored_telemetry import load_stored_telemetry, untrusted_notes
from denpex.isolation.plan import IsolationPlan
from denpex.isolation.planner import plan_for_triage
from denpex.isolation.policy import Scheduler
from denpex.report import PlanView, TriageReport

__all__ = ["Investigation", "investigate"]


class Investigation(BaseModel):
    """The report people and machines read, and the full plan ``denpex isolate`` executes."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    report: TriageReport
    plan: IsolationPlan | None = None
    # Every rank's counters, for the charts; kept only when asked (keep_progress).
    progress: JobProgress | None = None


def investigate(path: str | Path, *, world_size: int | None = None,
                manifest: JobManifest | Path | None = None, as_of: datetime | None = None,
                telemetry: Sequence[Path] = (), scheduler: Scheduler | None = None,
                incident_id: str | None = None, runbook: Path | None = None,
                options: TriageOptions | None = None, progress: Progress | None = None,
                cluster: str | None = None, host_domain: str | None = None,
                keep_progress: bool = False) -> Investigation:
    """Triage ``path``; with telemetry, line hardware up with the candidates; with a scheduler, plan.

    ``progress`` is told (dumps read, dumps in all) while dumps are read; ``keep_progress`` keeps
    where each rank stands (``Investigation.progress``) for the charts.

    Telemetry stored with the incident by the ingest service (``telemetry.json``) is used too:
    a node agent's telemetry about its own host like a ``--telemetry`` file; anything else only as
    a note, since it may never support isolation (``denpex.hardware.stored_telemetry``).
    """
    store = open_store(path)
    job = resolve_manifest(store, manifest)
    inventory = take_inventory(store, world_size=world_size, manifest=job)
    outcomes = summarize_inventory(store, inventory, options, progress=progress)
    result = triage_outcomes(inventory, outcomes, as_of=as_of, options=options)
    standing = job_progress(outcomes, inventory.world_size) if keep_progress else None
    del outcomes  # the summaries are not needed past this point; keep memory bounded
    # Hosts and GPUs for correlation and planning: the collector's records serve as a manifest.
    job = job or inventory.manifest
    stored = load_stored_telemetry(store)
    supporting = load_telemetry(list(telemetry)) if telemetry else TelemetryParseResult()
    if stored is not None:
        supporting = supporting.merged(stored.trusted)
    if telemetry or (stored is not None and stored.trusted.sources):
        result = correlate(result, job, supporting, options=CorrelationOptions(host_domain=host_domain))
    if stored is not None and stored.shown_only:
        result = result.model_copy(update={"notes": [*result.notes, *untrusted_notes(stored.shown_only)]})
    report = TriageReport(**dict(result))
    plan = None
    if scheduler is not None:
        plan = plan_for_triage(result, scheduler, incident_id=incident_id, runbook=runbook,
                               job_id=job.job_id if job else None, cluster=cluster, manifest=job)
        report.plan = PlanView.model_validate(plan.contract_view())
    return Investigation(report=report, plan=plan, progress=standing)
