"""The resumed run acts on the decision the approval page recorded for it, never on its input:
records signed by another key, for another run or plan, or missing, run nothing; a recorded
rejection is final whatever the input says (issue 30 section 1)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from denpex.approval_page.store import ApprovalBook
from denpex.isolation.approval import Approval, check_approval, sign_approval, TrustedApprovers
from denpex.isolation.ed25519_keys import generate_key
from denpex.isolation.errors import ApprovalError
from denpex.isolation.plan import IsolationPlan, Operation, utc_now
from denpex.isolation.planner import plan_isolation
from denpex.isolation.policy import ApprovalChannel, ApprovalRule, IsolationPolicy, Scheduler, SecondFactor
from denpex.workflow.approval_answer import AnswerVerdict
from denpex.workflow.page_decision import review_page_decision
from lab.rig import xid79_on

POLICY = IsolationPolicy(approval=ApprovalRule(approvers=frozenset({"alice"}), channels=frozenset(
    {ApprovalChannel.CLI_SIGNED, ApprovalChannel.APPROVAL_PAGE})))
PAGE_KEY = generate_key()
RUN = "d98f3b01-0a4b-44cd-85af-19b50a742ddd"


def _plan(incident: str = "inc-9") -> IsolationPlan:
    result = xid79_on(["gpu-node-002"])
    return plan_isolation(result, None, POLICY, None, Scheduler.SLURM, incident, result.as_of or utc_now(),
                          cluster="lab", tenant="acme")


def _record(plan: IsolationPlan, *, decision: str = "approve", run: str = RUN, key=PAGE_KEY, **changes: object) -> Approval:
    now = utc_now()
    fields = dict(plan_hash=plan.content_hash(), operation=Operation.ISOLATE, incident_id=plan.incident_id,
                  cluster="lab", nodes=("gpu-node-002",), approver="alice", comment="Xid 79",
                  channel=ApprovalChannel.APPROVAL_PAGE, flow_run_id=run, approved_at=now,
                  expires_at=now + timedelta(hours=1), second_factor="totp", decision=decision)
    fields.update(changes)
    return sign_approval(Approval(**fields), key)  # type: ignore[arg-type]


def _review(book: ApprovalBook, plan: IsolationPlan, submitted: str | None = None) -> object:
    return review_page_decision(book, RUN, plan, operation=Operation.ISOLATE, policy=POLICY,
                                page_keys=[PAGE_KEY.public_key()], submitted=submitted)


def test_an_approval_recorded_by_the_page_is_acted_on_and_checked_again_at_execution(tmp_path: Path) -> None:
    book, plan = ApprovalBook(tmp_path), _plan()
    record = _record(plan)
    assert book.record_decision(record, at=0)
    reviewed = _review(book, plan, submitted=record.model_dump_json())
    assert reviewed.verdict is AnswerVerdict.APPROVED and reviewed.approval == record and reviewed.recorded
    trusted = TrustedApprovers(page_keys=[PAGE_KEY.public_key()])
    later = utc_now() + timedelta(seconds=1)
    assert check_approval(plan, record, now=later, operation=Operation.ISOLATE, rule=POLICY.approval,
                          trusted=trusted, cluster="lab", tenant="acme") == record
    # Execution checks the page's key itself, and the runbook's second factor.
    with pytest.raises(ApprovalError, match="approval page's signature does not verify"):
        check_approval(plan, record, now=later, operation=Operation.ISOLATE, rule=POLICY.approval,
                       trusted=TrustedApprovers(page_keys=[generate_key().public_key()]), cluster="lab", tenant="acme")
    with pytest.raises(ApprovalError, match="no approval page public key is configured"):
        check_approval(plan, record, now=later, operation=Operation.ISOLATE, rule=POLICY.approval,
                       trusted=TrustedApprovers(), cluster="lab", tenant="acme")
    proxied = _record(plan, second_factor="proxy")
    with pytest.raises(ApprovalError, match="requires approval.second_factor: totp"):
        check_approval(plan, proxied, now=later, operation=Operation.ISOLATE, rule=POLICY.approval,
                       trusted=trusted, cluster="lab", tenant="acme")
    proxy_rule = POLICY.approval.model_copy(update={"second_factor": SecondFactor.PROXY})
    assert check_approval(plan, proxied, now=later, operation=Operation.ISOLATE, rule=proxy_rule, trusted=trusted,
                          cluster="lab", tenant="acme") == proxied


def test_a_recorded_rejection_is_final_whatever_the_runs_input_says(tmp_path: Path) -> None:
    """The first attack of section 1: a rejection flipped to an approval through the API."""
    book, plan = ApprovalBook(tmp_path), _plan()
    rejected = _record(plan, decision="reject", comment="the owner is debugging")
    assert book.record_decision(rejected, at=0)
    flipped = _record(plan, comment="approved, says the attacker")  # even one the page's own key signed
    reviewed = _review(book, plan, submitted=flipped.model_dump_json())
    assert reviewed.verdict is AnswerVerdict.REJECTED and reviewed.approval is None
    assert reviewed.reason.startswith("rejected by alice (on the approval page, totp): the owner is debugging")
    assert reviewed.reason.endswith("the run's input was not the page's record, and the recorded decision stands")
    with pytest.raises(ApprovalError, match="rejected this plan on the approval page; a signed rejection is final"):
        check_approval(plan, rejected, now=utc_now(), operation=Operation.ISOLATE, rule=POLICY.approval,
                       trusted=TrustedApprovers(page_keys=[PAGE_KEY.public_key()]), cluster="lab", tenant="acme")
    assert not book.record_decision(flipped, at=1)  # one decision per run


@pytest.mark.parametrize("stored, why", [
    (None, "was resumed without a decision that the approval page recorded for it"),
    ("other-key", "signature does not verify with the approval page's public key"),
    ("other-run", "the recorded decision is for run 00000000"),
    ("other-plan", "the recorded decision is for plan "),
], ids=["nothing-recorded", "forged-key", "another-run", "another-plan"])
def test_anything_but_this_runs_signed_decision_runs_nothing(tmp_path: Path, stored: str | None, why: str) -> None:
    book, plan = ApprovalBook(tmp_path), _plan()
    other = {"other-key": dict(key=generate_key()), "other-run": dict(run="00000000-0000-0000-0000-000000000000"),
             "other-plan": dict(plan_hash="0" * 64)}
    if stored is not None:
        record = _record(plan, **other[stored])  # type: ignore[arg-type]
        # Stored under this run's id, as an attacker with the state directory's write access would.
        book.record_decision(record.model_copy(update={"flow_run_id": RUN}) if stored != "other-run" else record,
                             at=0)
        if stored == "other-run":
            import sqlite3

            with sqlite3.connect(book.path) as db:
                db.execute("UPDATE decisions SET run_id = ?", (RUN,))
    reviewed = _review(book, plan, submitted=_record(plan).model_dump_json())
    assert reviewed.verdict is AnswerVerdict.REFUSED and reviewed.approval is None
    assert why in reviewed.reason and reviewed.reason.startswith("approval refused, nothing was done")
