"""Taking one decision on the approval page: who answers, with which proof, for which run and
plan, and the signed record it becomes. Pure of HTTP: the app parses the form and calls this.

    take_decision(desk, run_id, PageAnswer(decision="approve", nodes=["gpu-node-003"],
                  approver="alice", code="492039", comment="Xid 79"), identity=None, address="10.0.0.7")
      -> PageVerdict(outcome=RECORDED, record=Approval(channel="approval-page", decision="approve", ...))
    ... a second answer for the run              -> ALREADY_DECIDED (409): a run takes one decision
    ... a wrong code                              -> WRONG_CODE (403), counted for the lockout
    ... alice not among the runbook's approvers   -> REFUSED (403), her code left unspent

Every check that needs no code comes first, so a refused answer spends no code. A rejection
needs the same proof as an approval: once signed, it is final for its run. The decision is in
the page's database and the audit log before the app resumes the run with the record.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Literal

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import BaseModel, ConfigDict, Field

from denpex.approval_page.store import ApprovalBook, PendingApproval, StoredAnswer
from denpex.evidence.errors import EvidenceError
from denpex.evidence.store import open_store
from denpex.isolation.audit_store import update_stored_copy
from denpex.isolation.approval import Approval, sign_approval
from denpex.isolation.errors import AuditChainError, AuditError, IsolationError, StoreError
from denpex.isolation.operator import resolve_audit_store, state_audit_log
from denpex.isolation.plan import IsolationPlan, load_plan
from denpex.isolation.policy import ApprovalChannel, IsolationPolicy, SecondFactor
from denpex.isolation.runbook import load_runbook
from denpex.isolation.second_factor import LOCKOUT_S, CodeVerdict, TotpStore
from denpex.state_paths import state_path
from denpex.workflow.decision_audit import record_decision

__all__ = ["PageAnswer", "PageOutcome", "PageVerdict", "ApprovalDesk", "take_decision", "MAX_WRONG_FROM_ADDRESS"]

MAX_WRONG_FROM_ADDRESS = 10
"""Wrong codes from one client address within the lockout window before it is refused outright
(each approver is also locked out after their own few wrong codes: ``second_factor``)."""


class PageAnswer(BaseModel):
    """The decision form's fields. Unknown fields are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    decision: Literal["approve", "reject"]
    nodes: list[str] = Field(default=[], max_length=64)
    approver: str = Field(default="", max_length=200)
    code: str = Field(default="", max_length=32)
    comment: str = Field(default="", max_length=2000)


class PageOutcome(StrEnum):
    """What became of one answer."""

    RECORDED = "recorded"
    """The run's decision: signed, in the database and the audit log."""
    REFUSED = "refused"
    """Not a decision this person may take here; nothing was recorded as decided."""
    WRONG_CODE = "wrong_code"
    """The code was not the approver's current one (counted towards the lockouts)."""
    LOCKED = "locked"
    """Too many wrong codes lately, for this approver or from this address."""
    ALREADY_DECIDED = "already_decided"
    """The run has its decision; a second one is never taken."""
    EXPIRED = "expired"
    """The run's pause has timed out."""
    UNKNOWN_RUN = "unknown_run"
    """No run waits for a decision under this id."""
    UNAVAILABLE = "unavailable"
    """The audit log could not be written: the decision was not taken (try again)."""


_STATUS = {PageOutcome.RECORDED: 200, PageOutcome.REFUSED: 403, PageOutcome.WRONG_CODE: 403,
           PageOutcome.LOCKED: 429, PageOutcome.ALREADY_DECIDED: 409, PageOutcome.EXPIRED: 410,
           PageOutcome.UNKNOWN_RUN: 404, PageOutcome.UNAVAILABLE: 503}


@dataclass(frozen=True)
class PageVerdict:
    outcome: PageOutcome
    reason: str
    record: Approval | None = None

    @property
    def status(self) -> int:
        """The HTTP status the page answers with."""
        return _STATUS[self.outcome]


@dataclass(frozen=True)
class ApprovalDesk:
    """What taking a decision needs: the state directory (plans, approvers' codes, the audit
    log), the page's database and its signing key."""

    state_dir: Path
    book: ApprovalBook
    key: Ed25519PrivateKey
    audit_store: str | None = None
    """The audit log's checked copy (default: ``$DENPEX_AUDIT_STORE``, else the state directory's)."""

    @property
    def codes(self) -> TotpStore:
        return TotpStore(self.state_dir)

    def plan_of(self, pending: PendingApproval) -> IsolationPlan:
        return load_plan(state_path(self.state_dir, *pending.plan_path.split("/")))


def take_decision(desk: ApprovalDesk, run_id: str, answer: PageAnswer, *, identity: str | None, address: str,
                  now: datetime) -> PageVerdict:
    """Judge ``answer`` for run ``run_id`` and, when it stands, record its signed decision.
    ``identity`` is the authenticating proxy's word on who is asking (None: no trusted proxy
    said). Every answer for a waiting run is recorded in the page's database, with its outcome
    (``ApprovalBook.record_answer`` says which are kept past ``MAX_ANSWERS_PER_RUN``)."""
    verdict, approver = _judge(desk, run_id, answer, identity=identity, address=address, now=now)
    if verdict.outcome is PageOutcome.UNKNOWN_RUN:
        return verdict  # no run to keep it for: a stranger's posts to made-up ids leave nothing behind
    desk.book.record_answer(StoredAnswer(run_id=run_id, at=now.timestamp(), address=address,
                                         approver=approver, decision=answer.decision,
                                         outcome=verdict.outcome.value, reason=verdict.reason))
    return verdict


def _judge(desk: ApprovalDesk, run_id: str, answer: PageAnswer, *, identity: str | None, address: str,
           now: datetime) -> tuple[PageVerdict, str]:
    approver = (identity or answer.approver).strip()
    pending = desk.book.pending(run_id)
    if pending is None:
        return PageVerdict(PageOutcome.UNKNOWN_RUN, f"no run waits for a decision under {run_id!r}"), approver
    earlier = desk.book.decision(run_id)
    if earlier is not None:
        return PageVerdict(PageOutcome.ALREADY_DECIDED, _decided(earlier)), approver
    if now.timestamp() >= pending.expires_at:
        return PageVerdict(PageOutcome.EXPIRED, "the run's wait for approval has timed out; nothing was "
                                                "recorded"), approver
    if desk.book.refused_from(address, now.timestamp() - LOCKOUT_S) >= MAX_WRONG_FROM_ADDRESS:
        return PageVerdict(PageOutcome.LOCKED, f"too many wrong codes from {address} in the last "
                                               f"{LOCKOUT_S // 60} minutes; try again later"), approver
    try:
        plan = desk.plan_of(pending)
        policy = load_runbook(Path(pending.runbook)).policy()
    except (IsolationError, ValueError) as exc:
        return PageVerdict(PageOutcome.REFUSED, f"the run's plan or runbook cannot be read: {exc}"), approver
    problems = _problems(plan, pending, policy, answer, approver, identity)
    if problems:
        return PageVerdict(PageOutcome.REFUSED, "; ".join(problems) + "; nothing was recorded"), approver
    proof, refusal = _second_factor(desk, policy, answer, approver, identity, now, address)
    if refusal is not None:
        return refusal, approver
    nodes = tuple(sorted(set(answer.nodes))) if answer.decision == "approve" else tuple(a.node for a in plan.actions)
    record = sign_approval(Approval(
        plan_hash=pending.plan_hash, operation=pending.operation, incident_id=plan.incident_id,
        cluster=plan.cluster or pending.cluster, nodes=nodes, approver=approver, comment=answer.comment.strip(),
        channel=ApprovalChannel.APPROVAL_PAGE, flow_run_id=run_id, approved_at=now,
        expires_at=now + (policy.approval.ttl if answer.decision == "approve" else timedelta(0)),
        second_factor=proof, decision=answer.decision), desk.key)
    if not desk.book.record_decision(record, at=now.timestamp()):
        return PageVerdict(PageOutcome.ALREADY_DECIDED, _decided(desk.book.decision(run_id))), approver
    trouble = _audit(desk, plan, record, now)
    if trouble is not None:
        desk.book.forget_decision(run_id)
        return PageVerdict(PageOutcome.UNAVAILABLE, f"the decision could not be written to the audit log ({trouble}); "
                                                    "it was not taken: try again"), approver
    did = "approved" if record.decision == "approve" else "rejected"
    return PageVerdict(PageOutcome.RECORDED, f"{did} by {approver} ({proof}) for run {run_id}", record), approver


def _decided(record: Approval | None) -> str:
    if record is None:
        return "the run already has its decision; a run takes one decision"
    did = "approved" if record.decision == "approve" else "rejected"
    return (f"the run was already {did} by {record.approver} at {record.approved_at.isoformat()}; a run takes "
            "one decision")


def _problems(plan: IsolationPlan, pending: PendingApproval, policy: IsolationPolicy, answer: PageAnswer,
              approver: str, identity: str | None) -> list[str]:
    """Every problem with the answer that needs no code, so that a refused answer spends none."""
    problems = []
    if plan.content_hash() != pending.plan_hash:
        problems.append("the saved plan changed after the run paused (its hash is not the one shown)")
    rule = policy.approval
    if ApprovalChannel.APPROVAL_PAGE not in rule.channels:
        problems.append("the runbook does not accept approvals from this page (approval.channels)")
    if rule.second_factor is SecondFactor.NONE:
        problems.append("the runbook keeps the Prefect form (approval.second_factor: none)")
    if identity and answer.approver.strip() and answer.approver.strip() != identity:
        problems.append(f"the authenticating proxy says you are {identity!r}, not {answer.approver.strip()!r}")
    allowed = rule.approvers_for(plan.tenant, plan.cluster)
    if not approver:
        problems.append("choose who you are among the approvers")
    elif approver not in allowed:
        names = ", ".join(sorted(allowed)) or "nobody is listed"
        problems.append(f"{approver!r} may not decide for tenant {plan.tenant or '(none)'} on cluster "
                        f"{plan.cluster or '?'} ({names}; runbook approval.approvers/scoped)")
    planned = [a.node for a in plan.actions]
    if answer.decision == "approve":
        foreign = sorted(set(answer.nodes) - set(planned))
        if foreign:
            problems.append(f"{', '.join(foreign)} not in the plan ({', '.join(planned)})")
        if not answer.nodes:
            problems.append("choose at least one node to approve")
    return problems


def _second_factor(desk: ApprovalDesk, policy: IsolationPolicy, answer: PageAnswer, approver: str,
                   identity: str | None, now: datetime, address: str) -> tuple[Literal["totp", "proxy"], PageVerdict | None]:
    """The proof (``totp`` or ``proxy``), or the verdict that refuses the answer. A code typed
    where the runbook takes the proxy's word is checked all the same: never silently ignored."""
    code = answer.code.strip()
    if not code:
        if policy.approval.second_factor is SecondFactor.PROXY and identity:
            return "proxy", None
        if policy.approval.second_factor is SecondFactor.PROXY:
            return "proxy", PageVerdict(PageOutcome.REFUSED, "the runbook takes the identity of the authenticating "
                                                             "proxy, and this request did not come through it")
        return "totp", PageVerdict(PageOutcome.REFUSED, f"the runbook requires {approver}'s current TOTP code "
                                                        "(approval.second_factor: totp); type the 6 digits the "
                                                        "authenticator app shows")
    # The code's source: a stranger's wrong codes lock the approver out of new addresses, not of
    # the ones their codes were accepted from, nor of the proxy's session that already proved them.
    vouched = identity is not None and identity.strip() == approver
    source = f"proxy identity {identity}" if vouched else f"address {address}"  # two namespaces, never one
    check = desk.codes.check(approver, code, at=now.timestamp(), source=source, vouched=vouched)
    if check.accepted:
        return "totp", None
    outcome = {CodeVerdict.WRONG: PageOutcome.WRONG_CODE, CodeVerdict.LOCKED: PageOutcome.LOCKED}.get(
        check.verdict, PageOutcome.REFUSED)
    return "totp", PageVerdict(outcome, check.reason + "; nothing was recorded")


def _audit(desk: ApprovalDesk, plan: IsolationPlan, record: Approval, now: datetime) -> str | None:
    """Write the decision to the audit log and extend the cluster's stored copy; the log's own
    failure is returned (the decision is then not taken), a failed copy only noted in the log's
    next check, as every writer's."""
    did = "approved" if record.decision == "approve" else "rejected"
    why = (f"{did} by {record.approver} on the approval page for run {record.flow_run_id} "
           f"({record.second_factor}): {record.comment or 'no comment'}")
    audit = state_audit_log(desk.state_dir)
    try:
        record_decision(audit, plan, operation=record.operation, outcome=did, reason=why, approver=record.approver,
                        at=now)
    except (AuditError, OSError) as exc:
        return str(exc)
    try:
        update_stored_copy(audit, open_store(resolve_audit_store(desk.audit_store, desk.state_dir)),
                           record.cluster)
    except (StoreError, AuditChainError, EvidenceError):
        pass  # the record is in the log; the cluster's next action checks the log against its copy
    return None
