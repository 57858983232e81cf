"""The decision records a run writes (audit log, the cluster's stored copy, the event feed) when
a plan is approved, or when nothing is done and why."""

from __future__ import annotations

from prefect.logging import get_run_logger

from denpex.evidence.store import open_store
from denpex.isolation.errors import AuditChainError, StoreError
from denpex.isolation.operator import resolve_audit_store, state_audit_log
from denpex.isolation.plan import IsolationPlan, Operation, utc_now
from denpex.workflow.approval_answer import ReviewedAnswer
from denpex.workflow.decision_audit import record_decision
from flows._shared.events import emit
from flows._shared.run import state_dir

__all__ = ["record_approved", "record_not_done"]


def record_approved(plan: IsolationPlan, answer: ReviewedAnswer, *, operation: Operation, cluster: str) -> None:
    """The approval's ``decision`` record, with its comment, before the first intent (the approval
    page wrote its own before it resumed the run)."""
    if answer.recorded or answer.approval is None:
        return
    comment = answer.approval.comment or "no comment"
    _record(plan, operation=operation, outcome="approved", reason=f"{answer.reason}: {comment}",
            approver=answer.approver or None, cluster=cluster)


def record_not_done(plan: IsolationPlan, *, operation: Operation, outcome: str, reason: str,
                    approver: str | None, cluster: str, audited: bool = False) -> None:
    """Audit log (and the cluster's stored copy, in the operator's audit store) and event feed:
    why nothing was done (``audited``: the approval page already wrote the decision)."""
    payload = {"plan_hash": plan.content_hash(), "operation": operation.value, "reason": reason}
    if not audited:
        payload |= _record(plan, operation=operation, outcome=outcome, reason=reason, approver=approver,
                           cluster=cluster)
    emit(f"denpex.remediation.{outcome}", plan.incident_id, cluster, payload)


def _record(plan: IsolationPlan, *, operation: Operation, outcome: str, reason: str, approver: str | None,
            cluster: str) -> dict[str, str]:
    """One decision record in the audit log and the cluster's stored copy. A copy that fails is a
    warning (returned for the event): the record is in the log, and the cluster's next action
    checks the log against the copy as it stands."""
    folder = state_dir()
    payload: dict[str, str] = {}
    try:
        record_decision(state_audit_log(folder), plan, operation=operation, outcome=outcome, reason=reason,
                        approver=approver, at=utc_now(), store=open_store(resolve_audit_store(None, folder)),
                        cluster=plan.cluster or cluster)
    except (StoreError, AuditChainError) as exc:
        get_run_logger().warning("the %s decision is in the audit log but not in its stored copy: %s",
                                 outcome, exc)
        payload["audit_copy_warning"] = str(exc)
    return payload
