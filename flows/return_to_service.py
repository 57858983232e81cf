"""Return to service: undo an incident's isolation (Slurm RESUME / uncordon), approved the same way.

The plan is the one the triage flow saved for the incident; a rollback needs its own approval
(operation ``rollback``), and the executor only undoes isolations this incident owns.
"""

# No `from __future__ import annotations`: see flows/triage.py.

from typing import Any

from prefect import flow
from prefect.concurrency.sync import concurrency

from denpex.isolation.plan import Operation, load_plan
from denpex.state_paths import state_path
from denpex.workflow.approval_answer import AnswerVerdict
from denpex.workflow.flow_parameters import check_flow_parameters
from flows.approval import (
    ask_approval,
    emit,
    ensure_limit,
    find_target,
    load_runbook_for_flow,
    record_not_done,
    remediation_limit,
    state_dir,
)
from tasks.remediate import execute_plan

__all__ = ["return_to_service"]


@flow(name="denpex-return-to-service")
def return_to_service(cluster: str, incident_id: str) -> dict[str, Any]:
    """Pause for approval of the rollback, then resume the incident's nodes."""
    check_flow_parameters(cluster=cluster, incident_id=incident_id)
    runbook, runbook_file = load_runbook_for_flow()
    plan = load_plan(state_path(state_dir(), "plans", f"{incident_id}.json"))
    # The saved plan's tenant is the owner the triage run found; the registry must still agree.
    target = find_target(cluster, runbook_file, tenant=plan.tenant).target_or_raise(cluster)
    nodes = ", ".join(a.node for a in plan.actions)
    description = (f"# Return to service: incident {incident_id} on {cluster}\n\n"
                   f"Undo `{plan.actions[0].rollback.value if plan.actions else 'nothing'}` on **{nodes}** "
                   f"(only where this incident's isolation is still in place).\n\nPlan hash `{plan.content_hash()}`\n")
    answer = ask_approval(plan, description, operation=Operation.ROLLBACK, policy=runbook.policy(),
                          timeout=runbook.workflow.approval_timeout, poll=runbook.workflow.approval_poll)
    if answer is None or answer.verdict is not AnswerVerdict.APPROVED or answer.approval is None:
        outcome = "timed_out" if answer is None else answer.verdict.value
        reason = "nobody answered" if answer is None else answer.reason
        record_not_done(plan, operation=Operation.ROLLBACK, outcome=outcome, reason=reason,
                        approver=(answer.approver or None) if answer else None, cluster=cluster)
        return {"incident_id": incident_id, "outcome": outcome, "reason": reason}
    limit = remediation_limit(cluster)
    ensure_limit(limit)
    with concurrency(limit, occupy=1, strict=True):
        report = execute_plan.with_options(retries=runbook.workflow.remediation_retries)(
            plan, answer.approval, target.settings, Operation.ROLLBACK)
    for node in report.nodes:
        emit("denpex.remediation.result", incident_id, cluster,
             {"node": node.node, "operation": "rollback", "decision": node.decision.value,
              "outcome": node.outcome.value if node.outcome else None})
    return {"incident_id": incident_id, "outcome": "executed", "reason": answer.reason,
            "execution": report.model_dump(mode="json")}
