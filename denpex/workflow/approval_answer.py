"""A person's answer to the paused incident run, turned into the approval record it stands for.

The paused run shows the plan and a form (``flows/``: a Prefect ``RunInput`` built on
``ApprovalAnswer``). Whatever comes back is checked here, in the core, before anything runs:

    ApprovalAnswer(decision=approve, plan_hash=<shown plan>, nodes=["gpu-node-003"], approver="alice")
      -> ReviewedAnswer(verdict=APPROVED, record=ApprovalRecord(channel="prefect-ui", ...))
    ... plan_hash of another plan        -> REFUSED, "the answer approves plan 1a2b..., not 3c4d..."
    ... nodes not in the plan            -> REFUSED, "gpu-node-009 is not in the plan ..."
    ApprovalAnswer(decision=reject, ...) -> REJECTED, with the approver's comment as the reason

The record has the fields of ARCHITECTURE.md "Approvals" (channel ``prefect-ui``, the flow run's
id). Who may approve is read from the operator's runbook, never from the form.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from denpex.isolation.approval import Approval, approve_plan
from denpex.isolation.errors import ApprovalError
from denpex.isolation.plan import IsolationPlan, Operation

__all__ = ["Decision", "ApprovalAnswer", "ApprovalRecord", "AnswerVerdict", "ReviewedAnswer",
           "review_answer", "executable_approval"]


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


class ApprovalRecord(BaseModel):
    """One approval, bound to what it approves (ARCHITECTURE.md "Approvals", channel prefect-ui)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    plan_hash: str
    operation: Operation
    incident_id: str
    cluster: str
    nodes: tuple[str, ...]
    approver: str
    comment: str = ""
    channel: Literal["prefect-ui"] = "prefect-ui"
    flow_run_id: str


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
    record: ApprovalRecord | None = None
    approver: str = ""


def review_answer(answer: ApprovalAnswer, plan: IsolationPlan, *, operation: Operation, cluster: str,
                  flow_run_id: str) -> ReviewedAnswer:
    """Check ``answer`` against ``plan`` and the plan's policy; every problem in one reason."""
    approver = answer.approver.strip()
    if answer.decision is Decision.REJECT:
        why = answer.comment.strip() or "no reason given"
        return ReviewedAnswer(verdict=AnswerVerdict.REJECTED, approver=approver,
                              reason=f"rejected by {approver or 'an unnamed person'}: {why}")
    problems = _problems(answer, plan, approver)
    if problems:
        return ReviewedAnswer(verdict=AnswerVerdict.REFUSED, approver=approver,
                              reason="approval refused, nothing was done: " + "; ".join(problems))
    record = ApprovalRecord(
        plan_hash=answer.plan_hash, operation=operation, incident_id=plan.incident_id, cluster=cluster,
        nodes=tuple(dict.fromkeys(answer.nodes)), approver=approver, comment=answer.comment,
        flow_run_id=flow_run_id,
    )
    return ReviewedAnswer(verdict=AnswerVerdict.APPROVED, approver=approver, record=record,
                          reason=f"approved by {approver} for {', '.join(record.nodes)}")


def _problems(answer: ApprovalAnswer, plan: IsolationPlan, approver: str) -> list[str]:
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
    allowed = plan.policy.approval.approvers
    if approver and allowed and approver not in allowed:
        problems.append(f"{approver!r} is not an allowed approver ({', '.join(sorted(allowed))})")
    return problems


def executable_approval(record: ApprovalRecord, plan: IsolationPlan, *,
                        at: datetime) -> tuple[IsolationPlan, Approval]:
    """The plan narrowed to the approved nodes, and the executor's approval of exactly that.

    The executor still re-checks the approval (hash, expiry, approver, plan age) itself.
    """
    if record.plan_hash != plan.content_hash():
        raise ApprovalError(f"the approval is for plan {record.plan_hash[:12]}, not "
                            f"{plan.content_hash()[:12]}; nothing was done")
    narrowed = _narrowed(plan, record.nodes)
    approval = approve_plan(narrowed, record.approver, at=at, comment=record.comment,
                            operation=record.operation)
    return narrowed, approval


def _narrowed(plan: IsolationPlan, nodes: Sequence[str]) -> IsolationPlan:
    if set(nodes) == {a.node for a in plan.actions}:
        return plan
    return plan.model_copy(update={"actions": tuple(a for a in plan.actions if a.node in nodes)})
