"""Approvals: a named person's consent to one operation on one plan, by its content hash, for a
limited time.

Execution refuses a plan without an approval whose hash and operation match, that has not expired,
whose approver the policy allows, and (to isolate) whose evidence is not too old to act on. A
person who approved draining a node has not thereby approved resuming it: a rollback needs an
approval of its own.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

from denpex.isolation.errors import ApprovalError, validation_problems
from denpex.isolation.gates import human_duration
from denpex.isolation.plan import IsolationPlan, Operation

__all__ = ["Approval", "approve_plan", "check_approval", "check_cluster", "save_approval", "load_approval"]

_CLOCK_SKEW = timedelta(minutes=5)


class Approval(BaseModel):
    """Who approved which plan, when, and until when."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    plan_hash: str = Field(pattern=r"^[0-9a-f]{64}$")
    incident_id: str
    approver: str = Field(min_length=1, max_length=200)
    approved_at: AwareDatetime
    expires_at: AwareDatetime
    comment: str = ""
    cluster: str | None = Field(default=None, min_length=1, max_length=200)
    """The cluster it was approved for (Slurm ``ClusterName``, Kubernetes context); None: any.
    Node names repeat across clusters; this keeps a plan reviewed for one off another."""
    operation: Operation = Operation.ISOLATE
    """What it allows: isolating the plan's nodes, or rolling that back. Approval files written
    before this field existed approve ISOLATE only."""


def approve_plan(plan: IsolationPlan, approver: str, *, at: datetime, comment: str = "",
                 cluster: str | None = None, operation: Operation = Operation.ISOLATE) -> Approval:
    """Record ``approver``'s consent to ``operation`` on ``plan``, valid for the policy's approval
    TTL (and, when ``cluster`` is given, only on that cluster)."""
    name = approver.strip()
    allowed = plan.policy.approval.approvers
    if not name:
        raise ApprovalError("an approval needs the approver's name (--approver NAME)")
    if allowed and name not in allowed:
        raise ApprovalError(
            f"{name!r} may not approve plans under this policy; allowed: {', '.join(sorted(allowed))}"
        )
    return Approval(
        plan_hash=plan.content_hash(), incident_id=plan.incident_id, approver=name,
        approved_at=at, expires_at=at + plan.policy.approval.ttl, comment=comment,
        cluster=cluster.strip() if cluster and cluster.strip() else None, operation=operation,
    )


def check_approval(plan: IsolationPlan, approval: Approval | None, *, now: datetime,
                   operation: Operation = Operation.ISOLATE) -> Approval:
    """Return the approval when it lets ``operation`` run on ``plan`` now; else one ApprovalError
    listing every problem.

    The plan's age is judged only to isolate: undoing an old isolation must stay possible.
    """
    digest = plan.content_hash()
    if approval is None:
        raise ApprovalError(
            f"plan {digest[:12]} for incident {plan.incident_id} has no approval; a person approves "
            "it with `denpex approve PLAN --approver NAME`"
        )
    rule = plan.policy.approval
    problems = []
    if approval.operation is not operation:
        problems.append(f"the approval by {approval.approver} is for {approval.operation.value}, not "
                        f"{operation.value}; a person approves the {operation.value} with "
                        f"`denpex approve PLAN --approver NAME --operation {operation.value}`")
    if approval.plan_hash != digest:
        problems.append(f"the approval is for plan {approval.plan_hash[:12]}, not {digest[:12]} "
                        "(the plan changed after approval); approve the current plan")
    if approval.expires_at <= now:
        problems.append(f"the approval by {approval.approver} expired at {approval.expires_at.isoformat()}")
    if approval.approved_at > now + _CLOCK_SKEW:
        problems.append(f"the approval is dated in the future ({approval.approved_at.isoformat()})")
    if rule.approvers and approval.approver not in rule.approvers:
        problems.append(f"{approval.approver!r} is not an allowed approver "
                        f"({', '.join(sorted(rule.approvers))})")
    if operation is Operation.ISOLATE and now - plan.as_of > rule.max_plan_age:
        problems.append(f"the plan's evidence is as of {plan.as_of.isoformat()}, more than "
                        f"{human_duration(rule.max_plan_age)} ago; triage again before acting")
    if problems:
        raise ApprovalError("execution refused: " + "; ".join(problems))
    return approval


def check_cluster(approval: Approval, actual: str | None) -> None:
    """Refuse when the approval names a cluster and the settings reach another (or an unnamed) one."""
    if approval.cluster is None or approval.cluster == actual:
        return
    reached = repr(actual) if actual else "one that does not say its name"
    raise ApprovalError(
        f"execution refused: {approval.approver} approved this plan for cluster {approval.cluster!r}, "
        f"but the settings reach cluster {reached}; nothing was done. Check --config and the "
        "DENPEX_* variables, or have the plan approved for this cluster"
    )


def save_approval(approval: Approval, path: Path) -> None:
    path.write_text(approval.model_dump_json(indent=2) + "\n", encoding="utf-8")


def load_approval(path: Path) -> Approval:
    try:
        raw = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ApprovalError(f"{path}: cannot read approval: {exc.strerror or exc}; approve the plan "
                            "with `denpex approve PLAN --approver NAME`") from exc
    try:
        return Approval.model_validate_json(raw)
    except ValidationError as exc:
        raise ApprovalError(f"{path}: not a valid approval: {validation_problems(exc)}; approve the plan "
                            "again with `denpex approve PLAN --approver NAME`") from exc
