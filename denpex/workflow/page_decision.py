"""The flow's side of the approval page: a resumed run acts on the decision the page recorded for
it, never on the run's input alone.

Whoever reaches the Prefect API can force a run back to Paused, delete its stored answer, write
another and resume it; the page's database and its signature cannot be reached that way. So:

    review_page_decision(book, run_id, plan, operation=ISOLATE, policy=..., page_keys=...,
                         submitted=<the run's input, if any>)
      no decision recorded for this run                 -> REFUSED (nothing runs)
      recorded, signature does not verify               -> REFUSED
      recorded for another run, plan or operation       -> REFUSED
      recorded reject (whatever the input says)         -> REJECTED, final
      recorded approve, the approver listed here        -> APPROVED with the signed record

``denpex.isolation.run.execute`` checks the record again (the page's key, the runbook's approvers
and second factor, the plan's hash, cluster, nodes and time) before it acts.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from denpex.isolation.approval import Approval
from denpex.isolation.page_record import signature_verifies
from denpex.isolation.plan import IsolationPlan, Operation
from denpex.isolation.policy import ApprovalChannel, IsolationPolicy
from denpex.workflow.approval_answer import AnswerVerdict, ReviewedAnswer

__all__ = ["RecordedDecisions", "review_page_decision"]

_NOTHING = "approval refused, nothing was done: "


class RecordedDecisions(Protocol):
    """The page's record of each run's one decision: ``denpex.approval_page.store.ApprovalBook``.

    Named by what the review reads of it rather than imported: the approval page builds on the
    workflow (it records decisions in the audit log through it), so the workflow cannot import it.
    """

    def decision(self, run_id: str) -> Approval | None:
        """The run's recorded decision; None when it has none; ValueError when it does not parse."""
        ...


def review_page_decision(book: RecordedDecisions, run_id: str, plan: IsolationPlan, *, operation: Operation,
                         policy: IsolationPolicy, page_keys: Iterable[Ed25519PublicKey],
                         submitted: str | None) -> ReviewedAnswer:
    """The decision recorded for run ``run_id``, as the flow acts on it (see the module docstring).
    ``submitted`` is the record the run was resumed with: only compared, never believed."""
    try:
        record = book.decision(run_id)
    except ValueError as exc:
        return _refused(str(exc))
    if record is None:
        return _refused(f"run {run_id} was resumed without a decision that the approval page recorded for it "
                        "(a resume through the Prefect API alone proves nobody)")
    problems = _binding(record, run_id, plan, operation)
    if not signature_verifies(record, page_keys):
        problems.append("the recorded decision's signature does not verify with the approval page's public key "
                        "(DENPEX_APPROVAL_PAGE_KEY)")
    if problems:
        return _refused("; ".join(problems))
    flipped = submitted is not None and _differs(submitted, record)
    note = "; the run's input was not the page's record, and the recorded decision stands" if flipped else ""
    how = f"on the approval page, {record.second_factor or 'no second factor'}"
    if record.decision == "reject":
        # Recorded in the audit log by the page already; final, whatever the run's input says.
        return ReviewedAnswer(verdict=AnswerVerdict.REJECTED, approver=record.approver, recorded=True,
                              reason=f"rejected by {record.approver} ({how}): {record.comment or 'no reason given'}{note}")
    allowed = policy.approval.approvers_for(plan.tenant, plan.cluster)
    if record.approver not in allowed:
        return _refused(f"{record.approver!r} may not approve for tenant {plan.tenant or '(none)'} on cluster "
                        f"{plan.cluster or '?'} ({', '.join(sorted(allowed)) or 'nobody is listed'})")
    return ReviewedAnswer(verdict=AnswerVerdict.APPROVED, approver=record.approver, approval=record, recorded=True,
                          reason=f"approved by {record.approver} for {', '.join(record.nodes)} ({how}){note}")


def _binding(record: Approval, run_id: str, plan: IsolationPlan, operation: Operation) -> list[str]:
    problems = []
    if record.channel is not ApprovalChannel.APPROVAL_PAGE:
        problems.append(f"the recorded decision came through {record.channel.value}, not the approval page")
    if record.flow_run_id != run_id:
        problems.append(f"the recorded decision is for run {record.flow_run_id}, not {run_id}")
    if record.plan_hash != plan.content_hash():
        problems.append(f"the recorded decision is for plan {record.plan_hash[:12]}, not {plan.content_hash()[:12]}")
    if record.operation is not operation:
        problems.append(f"the recorded decision is for {record.operation.value}, not {operation.value}")
    return problems


def _differs(submitted: str, record: Approval) -> bool:
    try:
        return Approval.model_validate_json(submitted) != record
    except ValueError:
        return True


def _refused(why: str) -> ReviewedAnswer:
    return ReviewedAnswer(verdict=AnswerVerdict.REFUSED, reason=_NOTHING + why)
