"""One investigation: triage the dumps, correlate hardware signals, propose an isolation.

This is what ``denpex triage`` runs and what the Prefect flow composes step by step. It decides
and never acts: executing a plan is ``denpex.isolation.run``'s job, after approval.
"""

from __future__ import annotations

import os
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
from denpex.workflow.telemetry_files import telemetry_files_in_store

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

    Telemetry in the evidence is read by the flow's rule (``denpex.workflow.telemetry_files``):
    the ``*.log`` and ``*.jsonl`` files beside the dumps (and under ``telemetry/``) like
    ``--telemetry`` files, since a folder or store the operator names is the operator's own
    evidence. Telemetry stored with the incident by the ingest service (``telemetry.json``): a node
    agent's telemetry about its own host likewise; anything else only as a note, since it may never
    support isolation (``denpex.hardware.stored_telemetry``). ``report.telemetry_files`` lists
    every file read as telemetry.
    """
    store = open_store(path)
    job = resolve_manifest(store, manifest)
    inventory = take_inventory(store, world_size=world_size, manifest=job)
    outcomes = summarize_inventory(store, inventory, options, progress=progress)
    result = triage_outcomes(inventory, outcomes, as_of=as_of, options=options, store=store)
    standing = job_progress(outcomes, inventory.world_size) if keep_progress else None
    del outcomes  # the summaries are not needed past this point; keep memory bounded
    # Hosts and GPUs for correlation and planning: the collector's records serve as a manifest.
    job = job or inventory.manifest
    stored = load_stored_telemetry(store)
    in_evidence = telemetry_files_in_store(store)
    # A file given with --telemetry that lies in the folder too is read once.
    read = {os.path.realpath(source) for source in in_evidence.sources if not source.startswith("s3://")}
    given = [p for p in telemetry if os.path.realpath(p) not in read]
    supporting = load_telemetry(given) if given else TelemetryParseResult()
    supporting = supporting.merged(in_evidence)
    if stored is not None:
        supporting = supporting.merged(stored.trusted)
    if supporting.sources:
        result = correlate(result, job, supporting, options=CorrelationOptions(host_domain=host_domain))
    result = result.model_copy(update={"telemetry_files": list(supporting.sources)})
    if stored is not None and stored.shown.noted:
        result = result.model_copy(update={"notes": [*result.notes, *untrusted_notes(stored.shown)]})
    report = TriageReport(**dict(result))
    plan = None
    if scheduler is not None:
        plan = plan_for_triage(result, scheduler, incident_id=incident_id, runbook=runbook,
                               job_id=job.job_id if job else None, cluster=cluster, manifest=job)
        report.plan = PlanView.model_validate(plan.contract_view())
    return Investigation(report=report, plan=plan, progress=standing)
