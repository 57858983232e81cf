"""The incident flow: alert in, evidence coverage, parse fan-out, triage, plan, approval pause,
recovery check, remediation, audit.

Parameters are exactly the alert event's payload (docs/contracts.md "Alert event"). The flow
executes the runbook a ``DenpexRunbook`` block names (default ``hang-triage``) and acts on the
cluster whose target block is named after ``cluster``; with no target it triages and reports only.
"""

# No `from __future__ import annotations` here: Prefect builds each flow's parameter model from
# its annotations in the run's process, which may hold the function by value (cloudpickle)
# without this module's globals, so string annotations such as 'datetime' would not resolve.

import json
import os
from datetime import datetime
from typing import Any

from prefect import flow, unmapped
from prefect.concurrency.sync import concurrency
from prefect.runtime import flow_run
from prefect.states import Completed, State
from prefect.task_runners import ThreadPoolTaskRunner

from denpex.analysis.batch import split_batches
from denpex.analysis.workers import usable_cpus
from denpex.analysis.models import TriageResult
from denpex.analysis.triage import EvidenceInventory
from denpex.approval_page.brief import build_brief
from denpex.charts import charts_section
from denpex.evidence.files import write_atomic
from denpex.isolation.config import where_commands_go
from denpex.isolation.plan import IsolationPlan, Operation, save_plan
from denpex.isolation.slurm_layout import mark_derived_candidates
from denpex.report import PlanView, TriageReport
from denpex.state_paths import plan_file, report_file
from denpex.workflow.approval_answer import AnswerVerdict, ReviewedAnswer
from denpex.workflow.flow_parameters import check_evidence_binding, check_flow_parameters, evidence_roots
from denpex.workflow.incident_record import bind_incident
from denpex.workflow.markdown import report_markdown
from denpex.workflow.notify import approval_notice
from denpex.workflow.outcome import IncidentOutcome, IncidentRef, IncidentStage
from denpex.workflow.recovery import check_recovery, newer_dumps
from denpex.workflow.run_story import execution_line, plain, plan_line, state_message, verdict_line
from flows import DASK_ADDRESS_ENV
from flows._shared.events import emit, webhook_url
from flows._shared.page import claim_incident, page_url, release_incident
from flows._shared.pause import ask_approval, form_description
from flows._shared.records import record_approved, record_not_done
from flows._shared.run import artifact_prefix, load_runbook_for_flow, run_id, state_dir
from flows._shared.targets import Target, ensure_limit, find_target, remediation_limit
from flows.run_log import incident_log, incident_run
from flows.run_settings import check_this_runs_settings
from tasks.analysis import compare_ranks, correlate_telemetry, plan_isolation_task
from tasks.evidence import reread_inventory, wait_for_evidence
from tasks.layout import derive_layout
from tasks.charts import render_charts
from tasks.notify import notify_approvers
from tasks.parse import release_parse_workers, summarize_dumps, warm_parse_workers
from tasks.remediate import execute_plan
from tasks.report import publish_decision, publish_report
from tasks.options import NOT_PERSISTED

__all__ = ["triage"]

_CPUS = usable_cpus()  # a container's or taskset's share, as the parse workers are sized
# Coarse batches on Dask: each task costs a round trip to the cluster (notes/prefect.md).
DASK_BATCHES = 64


def _summaries(inventory: EvidenceInventory) -> list[Any]:
    """Fan the dumps out in batches (never one task per rank), each decoded in a worker process:
    on the Dask cluster at ``$DENPEX_DASK_ADDRESS`` when one is set, else on this machine."""
    refs = list(inventory.dumps.values())
    if not refs:
        return []
    address = os.environ.get(DASK_ADDRESS_ENV)
    if address:
        # Imported here: prefect-dask and distributed take seconds to import, paid only with a cluster.
        from flows.dask_parse import parse_on_dask

        return [parse_on_dask(split_batches(refs, DASK_BATCHES), address=address)]
    batches = split_batches(refs, min(len(refs), 2 * _CPUS))
    try:
        return [f.result() for f in summarize_dumps.map(batches, unmapped(256 * 1024 * 1024))]
    finally:
        release_parse_workers()


def _triage(inventory: EvidenceInventory, batches: list[Any], as_of: datetime | None) -> TriageResult:
    result = compare_ranks(inventory, batches, as_of)
    return correlate_telemetry(result, inventory)


# Threads only wait on the worker processes that decode (tasks.parse); a thread pool suffices.
_RUNNER: Any = ThreadPoolTaskRunner(max_workers=max(2, 2 * _CPUS))


@flow(name="denpex-triage", task_runner=_RUNNER, flow_run_name=incident_run, **NOT_PERSISTED)
def triage(tenant: str, cluster: str, job_id: str, incident_id: str, alert_time: datetime, evidence: str,
           world_size: int | None = None, reported_by_rank: int | None = None,
           alert_id: str = "") -> State[dict[str, Any]]:
    """Triage one incident; pause for approval; act only on what a person approved.

    The run is named ``<cluster>/<incident>``, logs its own steps at INFO and ends Completed with
    the verdict and the outcome as its state message; the value is the final report."""
    log = incident_log()
    # Anyone who reaches the Prefect API can start a run: its parameters are checked as a request's.
    check_flow_parameters(tenant=tenant, cluster=cluster, job_id=job_id, incident_id=incident_id,
                          alert_id=alert_id or None, evidence=evidence)
    # ... its settings (evidence roots, store, state) must be its worker's, not job variables ...
    check_this_runs_settings()
    # ... the evidence must be this incident's own folder, never another tenant's or a forged one;
    # what is read from here on is that folder as the check wrote it, never the caller's spelling.
    evidence = check_evidence_binding(evidence, tenant=tenant, cluster=cluster, job_id=job_id,
                                      incident_id=incident_id, roots=evidence_roots(os.environ))
    # ... and the alert's facts are the ingest service's record of the incident, not the caller's.
    bound = bind_incident(state_dir(), tenant=tenant, cluster=cluster, incident_id=incident_id, job_id=job_id,
                          alert_time=alert_time, world_size=world_size)
    alert_time, world_size = bound.alert_time, bound.world_size
    log.info("incident: %s", plain(bound.note))
    runbook, runbook_file = load_runbook_for_flow()
    timing = runbook.workflow
    ref = IncidentRef(tenant=tenant, cluster=cluster, job_id=job_id, incident_id=incident_id,
                      alert_id=alert_id or incident_id, flow_run_id=run_id())
    key = artifact_prefix(incident_id)
    try:
        if not os.environ.get(DASK_ADDRESS_ENV):
            warm_parse_workers()
        inventory = wait_for_evidence(evidence, world_size, timing.evidence_grace, timing.coverage_poll,
                                      f"{key}-coverage")
        log.info("coverage: dumps of %d of %d ranks in %s", len(inventory.dumps), inventory.world_size,
                 plain(evidence))
        batches = _summaries(inventory)
    finally:
        # Also when the evidence cannot be read: a run process joins its live child processes
        # before it exits, so idle warm workers would keep a failed run alive for good.
        release_parse_workers()
    found = find_target(cluster, runbook_file, tenant=tenant)
    target = found.target
    no_target = f"no Slurm or Kubernetes target block is registered for cluster {cluster!r}"
    if target is not None:
        # Ranks nobody placed (died before registering, no registration): the scheduler's record
        # of the job (Slurm's job record, the Kubernetes job's pods) guesses.
        inventory = derive_layout(inventory, target.scheduler, target.settings, job_id, alert_time)
    result = mark_derived_candidates(_triage(inventory, batches, alert_time), inventory.manifest)
    log.info("verdict: %s", verdict_line(result))
    charts = render_charts(result, batches, inventory.world_size)
    del batches  # only the compact counters live on, inside the charts' data
    report = TriageReport(**dict(result))
    if found.refused:
        log.warning("no remediation on cluster %r: %s", cluster, found.refused)
        emit("denpex.remediation.refused", incident_id, cluster, {"reason": found.refused, "tenant": tenant})
    elif found.note:
        log.info("%s", found.note)
    plan = None
    if target is not None:
        # The plan's tenant is the registry's owner of the cluster, never this run's parameter.
        plan = plan_isolation_task(result, inventory, target.scheduler, runbook_file, incident_id=incident_id,
                                   tenant=target.tenant, cluster=target.cluster, as_of=alert_time)
        report.plan = PlanView.model_validate(plan.contract_view())
    else:  # the report's default names the CLI's --scheduler; a flow run has a target block instead
        report.plan = PlanView(blocked=[f"no isolation was planned: {found.refused or no_target}"])
    log.info("plan: %s", plan_line(report.plan, plan))
    markdown = report_markdown(report, incident_id=incident_id, cluster=cluster, plan=plan,
                               chart=charts_section(charts, result))
    publish_report(markdown, key)
    if found.refused:
        return _finish(ref, report, IncidentStage.REFUSED, found.refused, plan, key)
    if plan is None or not plan.actions:
        why = (f"no isolation proposed for incident {incident_id}" if target is not None
               else f"{no_target}; triage only")
        return _finish(ref, report, IncidentStage.NO_ACTION, why, plan, key)
    taken = claim_incident(plan, timing.approval_timeout)  # held until the run ends (released in _finish)
    if taken:
        return _finish(ref, report, IncidentStage.REFUSED, taken, None, key)
    _save_plan(plan)
    url = webhook_url()
    if url:
        notify_approvers(url, approval_notice(report, incident_id=incident_id, cluster=cluster,
                                              run_url=page_url(run_id()) or flow_run.ui_url,
                                              plan_hash=plan.content_hash()))
    log.info("waiting for approval of plan %s: %s", plan.content_hash()[:12], flow_run.ui_url)
    description = form_description(report, result, plan, charts, incident_id=incident_id, cluster=cluster,
                                   policy=runbook.policy(), key_prefix=key)
    answer = ask_approval(plan, description, operation=Operation.ISOLATE, policy=runbook.policy(),
                          timeout=timing.approval_timeout, poll=timing.approval_poll, runbook_file=runbook_file,
                          brief=build_brief(plan, Operation.ISOLATE, report=report, charts=charts,
                                            target=where_commands_go(target.settings) if target else ""))
    if answer is not None:
        log.info("approval: %s", plain(answer.reason))  # the reason names who, once
    if answer is None:
        why = f"nobody answered within {timing.approval_timeout}; nothing was done"
        record_not_done(plan, operation=Operation.ISOLATE, outcome="timed_out", reason=why, approver=None,
                        cluster=cluster)
        return _finish(ref, report, IncidentStage.TIMED_OUT, why, plan, key)
    if answer.verdict is not AnswerVerdict.APPROVED or answer.approval is None:
        stage = IncidentStage.REJECTED if answer.verdict is AnswerVerdict.REJECTED else IncidentStage.REFUSED
        record_not_done(plan, operation=Operation.ISOLATE, outcome=stage.value, reason=answer.reason,
                        approver=answer.approver or None, cluster=cluster, audited=answer.recorded)
        return _finish(ref, report, stage, answer.reason, plan, key)
    record_approved(plan, answer, operation=Operation.ISOLATE, cluster=cluster)
    fresh = reread_inventory(evidence, world_size)
    recovery = check_recovery(result, _triage(fresh, _summaries(fresh), None),
                              newer_ranks=newer_dumps(inventory, fresh))
    if recovery.recovered:
        record_not_done(plan, operation=Operation.ISOLATE, outcome="withdrawn", reason=recovery.reason,
                        approver=answer.approver or None, cluster=cluster)
        return _finish(ref, report, IncidentStage.WITHDRAWN, recovery.reason, plan, key,
                       approval=answer.approval)
    if target is None:  # a plan is made only with a target; this keeps the type checker honest
        raise RuntimeError("a plan without a target")
    log.info("recovery check before acting: %s", recovery.reason)
    return _remediate(ref, report, plan, target, answer, key, timing.remediation_retries,
                      recovery_note=f"recovery check: {recovery.reason}")


def _remediate(ref: IncidentRef, report: TriageReport, plan: IsolationPlan, target: Target,
               answer: ReviewedAnswer, key: str, retries: int, recovery_note: str = "") -> State[dict[str, Any]]:
    approval = answer.approval
    if approval is None:
        raise RuntimeError("remediation without an approval")
    limit = remediation_limit(ref.cluster)
    ensure_limit(limit)
    with concurrency(limit, occupy=1, strict=True):
        for action in plan.actions:
            if action.node in approval.nodes:
                emit("denpex.remediation.intent", ref.incident_id, ref.cluster,
                     {"node": action.node, "action": action.action.value, "plan_hash": plan.content_hash(),
                      "approver": approval.approver})
        state = execute_plan.with_options(retries=retries)(plan, approval, target.settings, return_state=True)
    if state.is_failed():
        why = f"execution refused or failed: {state.message or 'see the task run'}"
        emit("denpex.remediation.failed", ref.incident_id, ref.cluster, {"reason": why})
        return _finish(ref, report, IncidentStage.FAILED, why, plan, key, approval=approval)
    execution = state.result()
    incident_log().info("ran: %s", execution_line(execution))
    for node in execution.nodes:
        emit("denpex.remediation.result", ref.incident_id, ref.cluster,
             {"node": node.node, "decision": node.decision.value,
              "outcome": node.outcome.value if node.outcome else None, "state": node.state_after})
    stage = IncidentStage.FAILED if execution.failed or execution.unfinished else IncidentStage.EXECUTED
    why = answer.reason + (f"; unfinished: {', '.join(execution.unfinished)}" if execution.unfinished else "")
    why += f"; {recovery_note}" if recovery_note else ""
    return _finish(ref, report, stage, why, plan, key, approval=approval, execution=execution)


def _save_plan(plan: IsolationPlan) -> None:
    """Keep the plan where the return-to-service flow finds it."""
    path = plan_file(state_dir(), plan.tenant, plan.cluster or "", plan.incident_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_plan(plan, path)


def _finish(ref: IncidentRef, report: TriageReport, stage: IncidentStage, reason: str,
            plan: IsolationPlan | None, key: str, **extra: Any) -> State[dict[str, Any]]:
    outcome = IncidentOutcome(incident=ref, report=report, outcome=stage, reason=reason,
                              plan_hash=plan.content_hash() if plan else None, **extra)
    if plan is not None:
        release_incident(plan)  # only if this run claimed it
    publish_decision(ref.incident_id, stage.value, reason, key)
    data = outcome.contract_json()
    path = report_file(state_dir(), ref.tenant, ref.cluster, ref.incident_id, ref.flow_run_id or "local")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, (json.dumps(data, indent=2) + "\n").encode())
    data["report_path"] = str(path)
    incident_log().info("outcome: %s: %s (report %s)", stage.value, plain(reason, 400), path)
    # The verdict in the run's state message: the runs list then says what each incident was.
    return Completed(message=state_message(report, stage.value, reason), data=data)
