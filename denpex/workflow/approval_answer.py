"""A person's answer to the paused incident run, turned into the approval record it stands for.

The paused run shows the plan and a form (``flows/``: a Prefect ``RunInput`` built on
``ApprovalAnswer``). Whatever comes back is checked here, in the core, before anything runs:

    ApprovalAnswer(decision=approve, plan_hash=<shown plan>, nodes=["gpu-node-003"], approver="alice")
      -> ReviewedAnswer(verdict=APPROVED, approval=Approval(channel="prefect-ui", nodes=(...), ...))
    ... plan_hash of another plan        -> REFUSED, "the answer approves plan 1a2b..., not 3c4d..."
    ... nodes not in the plan            -> REFUSED, "gpu-node-009 is not in the plan ..."
    ApprovalAnswer(decision=reject, ...) -> REJECTED, with the approver's comment as the reason
    ... code missing, wrong or reused    -> REFUSED, "alice's code was already used; ..."
    ApprovalAnswer(decision=reject, approver="alice", no code)
                                         -> REJECTED, "rejected by an unverified answer naming 'alice' ..."

The approval is the one model of docs/contracts.md "Approvals" (``denpex.isolation.approval``,
channel ``prefect-ui``, the flow run's id), built with ``ui_approval``. Who may approve is read
from the operator's runbook (``approvers_for(tenant, cluster)``), never from the form, and
``denpex.isolation.run.execute`` checks it all again before acting.

Whoever reaches the Prefect API can resume the run and pick any approver's name, so where the
runbook asks for it (``approval.second_factor: totp``, the default) the answer carries the
approver's current TOTP code (``denpex.isolation.second_factor``). A code is spent by any answer
that carries it, refused or not: the run's stored input shows it to whoever reads the API, and it
must not approve another run. A rejection always stands (it touches nothing), but it is recorded
in an approver's name only when it proves that approver as an approval would.

A code is matched at the moment the API received the answer, not when the flow got round to
reading it: a loaded worker polls late, and a code typed in time must not expire on the way. The
flow measures ``answer_lag`` (how long before the review the answer arrived) on the API server's
own clock, so the two machines' clocks never meet; a lag outside ``[0, MAX_ANSWER_LAG]`` is not
believed and the code is matched at the review. An answer's receipt is whenever it was last
written, so this widens nothing: the code had to be current when it reached the API.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from denpex.isolation.approval import Approval, ui_approval
from denpex.isolation.plan import IsolationPlan, Operation
from denpex.isolation.policy import ApprovalChannel, IsolationPolicy, SecondFactor
from denpex.isolation.second_factor import TotpStore

__all__ = ["Decision", "ApprovalAnswer", "AnswerVerdict", "ReviewedAnswer", "review_answer", "MAX_ANSWER_LAG",
           "code_typed_at"]

MAX_ANSWER_LAG = timedelta(minutes=5)
"""The longest lag between an answer's receipt and its review that is believed."""


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
    approver: str = Field(default="", max_length=200, description="your name, as the runbook lists approvers")
    comment: str = Field(default="", max_length=2000, description="why; written to the audit log")
    code: str = Field(default="", max_length=32,
                      description="the approver's current 6-digit code from their authenticator app (TOTP)")


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
    recorded: bool = False
    """The decision is in the audit log already (the approval page wrote it before resuming the run)."""


def review_answer(answer: ApprovalAnswer, plan: IsolationPlan, *, policy: IsolationPolicy, operation: Operation,
                  flow_run_id: str, at: datetime, codes: TotpStore,
                  answer_lag: timedelta | None = None) -> ReviewedAnswer:
    """Check ``answer`` against ``plan`` and the operator's ``policy``; every problem in one reason.
    ``codes`` holds the approvers' TOTP secrets and spent codes (the state directory's);
    ``answer_lag`` is how long before ``at`` the API received the answer (see :func:`code_typed_at`)."""
    approver = answer.approver.strip()
    # The code is spent on every answer that carries one, whatever else the answer says: a code
    # left in a refused answer's stored run input must not approve another run.
    proof, code_problem = _second_factor(answer, policy, approver, codes, at, code_typed_at(at, answer_lag))
    if answer.decision is Decision.REJECT:
        return _rejection(answer, plan, policy, approver, code_problem)
    problems = _problems(answer, plan, policy, approver) + ([code_problem] if code_problem else [])
    if problems:
        return ReviewedAnswer(verdict=AnswerVerdict.REFUSED, approver=approver,
                              reason="approval refused, nothing was done: " + "; ".join(problems))
    nodes = tuple(dict.fromkeys(answer.nodes))
    approval = ui_approval(plan, approver, flow_run_id=flow_run_id, at=at, ttl=policy.approval.ttl,
                           cluster=plan.cluster, operation=operation, nodes=nodes, comment=answer.comment,
                           second_factor=proof)
    checked = " (TOTP code checked)" if proof else ""
    return ReviewedAnswer(verdict=AnswerVerdict.APPROVED, approver=approver, approval=approval,
                          reason=f"approved by {approver} for {', '.join(nodes)}{checked}")


def code_typed_at(at: datetime, answer_lag: timedelta | None) -> datetime:
    """The moment a code is matched at: ``answer_lag`` before the review ``at`` when the lag is
    known and within ``[0, MAX_ANSWER_LAG]``, else ``at`` itself."""
    if answer_lag is not None and timedelta(0) <= answer_lag <= MAX_ANSWER_LAG:
        return at - answer_lag
    return at


def _rejection(answer: ApprovalAnswer, plan: IsolationPlan, policy: IsolationPolicy, approver: str,
               code_problem: str) -> ReviewedAnswer:
    """A rejection touches nothing, so it always stands; but it is put in a person's name only
    when it proves that person as an approval would (the runbook's list, the code)."""
    why = answer.comment.strip() or "no reason given"
    doubts = _approver_problems(plan, policy, approver) + ([code_problem] if code_problem else [])
    if doubts:
        named = repr(approver) if approver else "nobody"
        return ReviewedAnswer(verdict=AnswerVerdict.REJECTED, approver="",
                              reason=f"rejected by an unverified answer naming {named} ({'; '.join(doubts)}): {why}")
    return ReviewedAnswer(verdict=AnswerVerdict.REJECTED, approver=approver, reason=f"rejected by {approver}: {why}")


def _second_factor(answer: ApprovalAnswer, policy: IsolationPolicy, approver: str, codes: TotpStore,
                   at: datetime, typed_at: datetime) -> tuple[Literal["totp"] | None, str]:
    """The proof the answer carries (``"totp"`` or None) and, when it falls short, why.

    A code typed where the runbook does not ask for one is checked all the same: a wrong code
    is never silently ignored.
    """
    given = answer.code.strip()
    required = policy.approval.second_factor is SecondFactor.TOTP
    if not given:
        if required:
            return None, (f"the runbook requires {approver}'s current TOTP code (approval.second_factor: totp); "
                          "type the 6 digits the authenticator app shows in the form's code field")
        return None, ""
    check = codes.check(approver, given, at=at.timestamp(), typed_at=typed_at.timestamp())
    return ("totp", "") if check.accepted else (None, check.reason)


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
    if ApprovalChannel.PREFECT_UI not in policy.approval.channels:
        problems.append("the runbook does not accept approvals through the Prefect UI (approval.channels)")
    return problems + _approver_problems(plan, policy, approver)


def _approver_problems(plan: IsolationPlan, policy: IsolationPolicy, approver: str) -> list[str]:
    """Why ``approver`` may not answer for the plan's tenant and cluster (none: they may)."""
    if not approver:
        return ["the approver's name is missing"]
    allowed = policy.approval.approvers_for(plan.tenant, plan.cluster)
    if approver in allowed:
        return []
    names = ", ".join(sorted(allowed)) or "nobody is listed"
    return [f"{approver!r} may not approve for tenant {plan.tenant or '?'} on cluster {plan.cluster or '?'} "
            f"through the Prefect UI ({names}; runbook approval.approvers/scoped)"]
