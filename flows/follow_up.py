"""What the follow-up flows share: an incident's saved plan, a second operation on it (rollback,
requeue of the hung job), approved through the same pause and form as the isolation, then run.

Each operation needs its own approval of the plan: approving the drain approved neither undoing it
nor restarting the job elsewhere (``denpex.isolation.run.execute`` checks the approval's operation).
"""

# No `from __future__ import annotations`: see flows/triage.py.

from pathlib import Path
from typing import Any, Callable

from prefect.concurrency.sync import concurrency

from denpex.approval_page.brief import build_brief
from denpex.isolation.config import where_commands_go
from denpex.isolation.plan import IsolationPlan, Operation
from denpex.isolation.runbook import Runbook
from denpex.tenancy import read_ownership
from denpex.workflow.saved_plans import load_saved_plan
from denpex.workflow.approval_answer import AnswerVerdict
from denpex.workflow.flow_parameters import check_flow_parameters
from flows._shared.events import emit
from flows._shared.page import claim_incident, release_incident
from flows._shared.pause import ask_approval
from flows._shared.records import record_approved, record_not_done
from flows._shared.run import load_runbook_for_flow, state_dir
from flows._shared.targets import Target, ensure_limit, find_target, remediation_limit
from flows.run_settings import check_this_runs_settings
from tasks.remediate import execute_plan

__all__ = ["approve_then_run"]


def approve_then_run(cluster: str, incident_id: str, operation: Operation,
                     describe: Callable[[IsolationPlan], str]) -> dict[str, Any]:
    """Pause for approval of ``operation`` on the incident's saved plan (``describe`` writes what
    the dialog shows), then run it on what was approved; the outcome as a dict."""
    check_flow_parameters(cluster=cluster, incident_id=incident_id)
    check_this_runs_settings()  # the state, runbooks and cluster access are the worker's own
    runbook, runbook_file = load_runbook_for_flow()
    # Whose incident this is comes from the operator's registry (the cluster's owner), never a parameter.
    owner = read_ownership(state_dir(), cluster)
    plan = load_saved_plan(state_dir(), owner.tenant, cluster, incident_id)
    # The saved plan's tenant is the owner the triage run found; the registry must still agree.
    target = find_target(cluster, runbook_file, tenant=plan.tenant).target_or_raise(cluster)
    # One question per incident at a time: a triage run must not save a plan over this one meanwhile.
    taken = claim_incident(plan, runbook.workflow.approval_timeout)
    if taken:
        return {"incident_id": incident_id, "outcome": "refused", "reason": taken}
    try:
        return _ask_then_run(plan, target, runbook, runbook_file, operation, describe, cluster, incident_id)
    finally:
        release_incident(plan)


def _ask_then_run(plan: IsolationPlan, target: Target, runbook: Runbook, runbook_file: Path, operation: Operation,
                  describe: Callable[[IsolationPlan], str], cluster: str, incident_id: str) -> dict[str, Any]:
    text = describe(plan)
    answer = ask_approval(plan, text, operation=operation, policy=runbook.policy(),
                          timeout=runbook.workflow.approval_timeout, poll=runbook.workflow.approval_poll,
                          runbook_file=runbook_file, brief=build_brief(plan, operation, summary=_plain(text),
                                                                 target=where_commands_go(target.settings)))
    if answer is None or answer.verdict is not AnswerVerdict.APPROVED or answer.approval is None:
        outcome = "timed_out" if answer is None else answer.verdict.value
        reason = "nobody answered" if answer is None else answer.reason
        record_not_done(plan, operation=operation, outcome=outcome, reason=reason,
                        approver=(answer.approver or None) if answer else None, cluster=cluster,
                        audited=answer is not None and answer.recorded)
        return {"incident_id": incident_id, "outcome": outcome, "reason": reason}
    record_approved(plan, answer, operation=operation, cluster=cluster)
    limit = remediation_limit(cluster)
    ensure_limit(limit)
    with concurrency(limit, occupy=1, strict=True):
        report = execute_plan.with_options(retries=runbook.workflow.remediation_retries)(
            plan, answer.approval, target.settings, operation)
    for node in report.nodes:
        emit("denpex.remediation.result", incident_id, cluster,
             {"node": node.node, "operation": operation.value, "decision": node.decision.value,
              "outcome": node.outcome.value if node.outcome else None})
    return {"incident_id": incident_id, "outcome": "executed", "reason": answer.reason,
            "execution": report.model_dump(mode="json")}


def _plain(markdown: str) -> list[str]:
    """The dialog's text as plain lines for the approval page (which escapes what it shows)."""
    return [line.strip("# ").replace("**", "").replace("`", "").replace("\\", "")
            for line in markdown.splitlines() if line.strip()]
