"""Restart the hung job away from the isolated nodes (Slurm: requeue with ExcNodeList; Kubernetes:
delete its pods there).

Intent, the steps the job's state still needs, read until it shows the change, result. A second
run finds it done and skips; a run that died between the steps is settled from the job's state
first, never by repeating a step blindly.
"""

from __future__ import annotations

import time

from denpex.isolation.adapter import ActionOutput
from denpex.isolation.audit import AuditKind, Outcome
from denpex.isolation.errors import OutcomeUnknownError
from denpex.isolation.plan import HungJob, NodeAction, Operation
from denpex.isolation.run.context import RunContext, Tools
from denpex.isolation.run.report import ExecutionReport, NodeDecision, NodeOutcome, RunMode

__all__ = ["requeue"]


def requeue(tools: Tools, run: RunContext, actions: list[NodeAction], report: ExecutionReport) -> ExecutionReport:
    """Restart the plan's hung job away from ``actions``' nodes (the approved ones), into ``report``."""
    job = run.plan.hung_job
    if job is None:
        report.blocked.append("the plan offers no hung-job action (no job id, or no node isolated)")
        return report
    approved = {a.node for a in actions}
    job = job.model_copy(update={"exclude_nodes": tuple(n for n in job.exclude_nodes if n in approved)})
    if not job.exclude_nodes:
        report.blocked.append("none of the hung job's nodes is approved")
        return report
    if run.mode is RunMode.EXECUTE:
        report.recovered = _recover(tools, run, job)
    command = tools.adapter.hung_job_command(job)
    what = f"job {job.job_id}"
    unmet = tools.adapter.hung_job_unmet(job)
    decision = NodeDecision.ACT if unmet else NodeDecision.ALREADY_DONE
    if run.mode is RunMode.DRY_RUN or not unmet:
        note = "; ".join(unmet) or f"{what} no longer runs on {', '.join(job.exclude_nodes)} and excludes them"
        outcome = None if run.mode is RunMode.DRY_RUN else Outcome.ALREADY_DONE
        if outcome is not None:
            tools.audit.append(run.job_entry(AuditKind.SKIP, command=command, outcome=outcome, message=note),
                               at=tools.clock())
        report.nodes.append(NodeOutcome(node=what, decision=decision, command=command, outcome=outcome,
                                        message=note))
        return report
    intent = tools.audit.append(run.job_entry(AuditKind.INTENT, command=command, message="; ".join(unmet)),
                                at=tools.clock())
    output: ActionOutput | None = None
    notes: list[str] = []
    try:
        output = tools.adapter.restart_hung_job(job)
    except OutcomeUnknownError as exc:
        notes.append(f"the answer was lost ({exc}); judged from the job's state")
    deadline = time.monotonic() + tools.verify_timeout_s
    unmet = tools.adapter.hung_job_unmet(job)
    while unmet and time.monotonic() < deadline:
        tools.sleep(tools.poll_s)
        unmet = tools.adapter.hung_job_unmet(job)
    outcome = Outcome.FAILED if unmet else Outcome.APPLIED
    if unmet:
        notes.append("post-checks not met: " + "; ".join(unmet))
    message = " ".join(notes)
    tools.audit.append(run.job_entry(AuditKind.RESULT, command=command, rc=output.rc if output else None,
                                     output=output.output if output else None, outcome=outcome,
                                     intent_seq=intent.seq, message=message), at=tools.clock())
    report.nodes.append(NodeOutcome(node=what, decision=NodeDecision.ACT, command=command, outcome=outcome,
                                    rc=output.rc if output else None,
                                    output=output.output if output else "", message=message))
    return report


def _recover(tools: Tools, run: RunContext, job: HungJob) -> list[str]:
    """Give each requeue intent left without a result (a run died between its steps) the result
    the job's state shows; the steps still needed are then taken as usual, never blindly."""
    messages = []
    for intent in tools.audit.pending_intents(run.digest, Operation.REQUEUE):
        unmet = tools.adapter.hung_job_unmet(job)
        outcome = Outcome.RECOVERED_NOT_APPLIED if unmet else Outcome.RECOVERED_APPLIED
        shows = f"still needs: {'; '.join(unmet)}" if unmet else "shows the restart completed"
        message = (f"an earlier run stopped between intent seq {intent.seq} and its result; job "
                   f"{job.job_id} {shows}; nothing was repeated blindly")
        tools.audit.append(run.job_entry(AuditKind.RESULT, command=intent.command, outcome=outcome,
                                         intent_seq=intent.seq, message=message), at=tools.clock())
        messages.append(message)
    return messages
