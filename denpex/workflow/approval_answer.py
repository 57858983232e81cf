"""A person's answer to the paused incident run, turned into the approval record it stands for.

The paused run shows the plan and a form (``flows/``: a Prefect ``RunInput`` built on
``ApprovalAnswer``). Whatever comes back is checked here, in the core, before anything runs:

    ApprovalAnswer(decision=approve, plan_hash=<shown plan>, nodes=["gpu-node-003"], approver="alice")
      -> ReviewedAnswer(verdict=APPROVED, approval=Approval(channel="prefect-ui", nodes=(...), ...))
    ... plan_hash of another plan        -> REFUSED, "the answer approves plan 1a2b..., not 3c4d..."
    ... nodes not in the plan            -> REFUSED, "gpu-node-009 is not in the plan ..."
    ApprovalAnswer(decision=reject, ...) -> REJECTED, with the approver's comment as the reason

The approval is the one model of ARCHITECTURE.md "Approvals" (``denpex.isolation.approval``,
channel ``prefect-ui``, the flow run's id), built with ``ui_approval``. Who may approve is read
from the operator's runbook (``approvers_for(tenant, cluster)``), never from the form, and
``execute_approved`` checks it all again before acting.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from denpex.isolation.approval import Approval, ui_approval
from denpex.isolation.plan import IsolationPlan, Operation
from denpex.isolation.policy import ApprovalChannel, IsolationPolicy

__all__ = ["Decision", "ApprovalAnswer", "AnswerVerdict", "ReviewedAnswer", "review_answer"]


class Decision(StrEnum):
    """What the person chose in the form."""

    APPROVE = "approve"
    """Carry out the plan on the nodes listed."""
    REJECT = "reject"
    """Do nothing; the comment says why."""


class ApprovalAnswer(BaseModel):
    """The form's fields. Unknown fields are refused (a typo must not pass silently)."""

    model_config = ConfigDict(extra="forbid")

    decision: Decision = Field(description="approve or reject the plan shown beside this form")
    plan_hash: str = Field(description="the hash of the plan shown (pre-filled; leave it)")
    nodes: list[str] = Field(description="the nodes approved: all of the plan's, or fewer")
    approver: str = Field(default="", description="your name, as the runbook lists approvers")
    comment: str = Field(default="", description="why; written to the audit log")


class AnswerVerdict(StrEnum):
    """How an answer was taken."""

    APPROVED = "approved"
    """A valid approval: the record says what may run."""
    REJECTED = "rejected"
    """The person rejected the plan."""
    REFUSED = "refused"
    """The answer was not a valid approval of this plan; nothing runs."""


class ReviewedAnswer(BaseModel):
    """The answer as the flow acts on it."""

    model_config = ConfigDict(frozen=True)

    verdict: AnswerVerdict
    reason: str
    approval: Approval | None = None
    approver: str = ""


def review_answer(answer: ApprovalAnswer, plan: IsolationPlan, *, policy: IsolationPolicy, operation: Operation,
                  flow_run_id: str, at: datetime) -> ReviewedAnswer:
    """Check ``answer`` against ``plan`` and the operator's ``policy``; every problem in one reason."""
    approver = answer.approver.strip()
    if answer.decision is Decision.REJECT:
        why = answer.comment.strip() or "no reason given"
        return ReviewedAnswer(verdict=AnswerVerdict.REJECTED, approver=approver,
                              reason=f"rejected by {approver or 'an unnamed person'}: {why}")
    problems = _problems(answer, plan, policy, approver)
    if problems:
        return ReviewedAnswer(verdict=AnswerVerdict.REFUSED, approver=approver,
                              reason="approval refused, nothing was done: " + "; ".join(problems))
    nodes = tuple(dict.fromkeys(answer.nodes))
    approval = ui_approval(plan, approver, flow_run_id=flow_run_id, at=at, ttl=policy.approval.ttl,
                           cluster=plan.cluster, operation=operation, nodes=nodes, comment=answer.comment)
    return ReviewedAnswer(verdict=AnswerVerdict.APPROVED, approver=approver, approval=approval,
                          reason=f"approved by {approver} for {', '.join(nodes)}")


def _problems(answer: ApprovalAnswer, plan: IsolationPlan, policy: IsolationPolicy, approver: str) -> list[str]:
    problems = []
    digest = plan.content_hash()
    if answer.plan_hash != digest:
        problems.append(f"the answer approves plan {answer.plan_hash[:12] or '(none)'}, not the plan "
                        f"shown ({digest[:12]})")
    planned = [a.node for a in plan.actions]
    foreign = [n for n in answer.nodes if n not in planned]
    if foreign:
        problems.append(f"{', '.join(foreign)} {'is' if len(foreign) == 1 else 'are'} not in the plan "
                        f"({', '.join(planned) or 'no node'})")
    if not answer.nodes:
        problems.append("no node was approved")
    if not approver:
        problems.append("the approver's name is missing")
    rule = policy.approval
    if ApprovalChannel.PREFECT_UI not in rule.channels:
        problems.append("the runbook does not accept approvals through the Prefect UI (approval.channels)")
    allowed = rule.approvers_for(plan.tenant, plan.cluster)
    if approver and approver not in allowed:
        names = ", ".join(sorted(allowed)) or "nobody is listed"
        problems.append(f"{approver!r} may not approve for tenant {plan.tenant or '?'} on cluster "
                        f"{plan.cluster or '?'} through the Prefect UI ({names}; runbook approval.approvers/scoped)")
    return problems
