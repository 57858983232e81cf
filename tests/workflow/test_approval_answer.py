"""The approval form's answer becomes a prefect-ui approval, or a refusal naming every problem.

The approvers' TOTP secrets are real ones enrolled in the test's state directory; the codes
are what their authenticator apps would show (RFC 6238, pyotp)."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest

from denpex.isolation.approval import TrustedApprovers, check_approval
from denpex.isolation.errors import ApprovalError
from denpex.isolation.plan import IsolationPlan, Operation, utc_now
from denpex.isolation.planner import plan_isolation
from denpex.isolation.policy import (ApprovalChannel, ApprovalRule, ApproverScope, IsolationPolicy, Scheduler,
                                    SecondFactor)
from denpex.isolation.second_factor import LOCKOUT_S, MAX_WRONG_CODES, CodeVerdict, TotpStore
from denpex.workflow.approval_answer import (MAX_ANSWER_LAG, AnswerVerdict, ApprovalAnswer, Decision, ReviewedAnswer,
                                             code_typed_at, review_answer)
from lab.rig import xid79_on

POLICY = IsolationPolicy(approval=ApprovalRule(approvers=frozenset({"alice"})))


def _plan(policy: IsolationPolicy = POLICY) -> IsolationPlan:
    result = xid79_on(["gpu-node-002", "gpu-node-003"])
    return plan_isolation(result, None, policy, None, Scheduler.SLURM, "inc-9", result.as_of or utc_now(),
                          cluster="lab", tenant="acme")


def _plan_for(incident_id: str) -> IsolationPlan:
    result = xid79_on(["gpu-node-002", "gpu-node-003"])
    return plan_isolation(result, None, POLICY, None, Scheduler.SLURM, incident_id, result.as_of or utc_now(),
                          cluster="lab", tenant="acme")


def _answer(plan: IsolationPlan, **changes: object) -> ApprovalAnswer:
    fields: dict[str, object] = dict(decision=Decision.APPROVE, plan_hash=plan.content_hash(),
                                     nodes=[a.node for a in plan.actions], approver="alice", comment="ok")
    fields.update(changes)
    return ApprovalAnswer.model_validate(fields)


@pytest.fixture
def codes(tmp_path: Path) -> TotpStore:
    store = TotpStore(tmp_path)
    for name in ("alice", "carol"):
        store.enroll(name)
    return store


def _review(plan: IsolationPlan, answer: ApprovalAnswer, codes: TotpStore,
            policy: IsolationPolicy = POLICY) -> ReviewedAnswer:
    return review_answer(answer, plan, policy=policy, operation=Operation.ISOLATE, flow_run_id="run-1",
                         at=utc_now(), codes=codes)


def test_approval_carries_the_architecture_fields_and_passes_the_executors_check(codes: TotpStore) -> None:
    plan = _plan()
    reviewed = _review(plan, _answer(plan, code=codes.current_code("alice")), codes)
    assert reviewed.verdict is AnswerVerdict.APPROVED and reviewed.approval is not None
    approval = reviewed.approval
    assert (approval.plan_hash, approval.operation, approval.incident_id, approval.cluster) == (
        plan.content_hash(), Operation.ISOLATE, "inc-9", "lab")
    assert (approval.nodes, approval.approver, approval.comment) == (("gpu-node-002", "gpu-node-003"), "alice", "ok")
    assert (approval.channel, approval.flow_run_id, approval.signature) == (ApprovalChannel.PREFECT_UI, "run-1", None)
    assert approval.second_factor == "totp" and "TOTP code checked" in reviewed.reason
    # The executor takes a Prefect form answer only where the runbook keeps the form (second_factor: none).
    form_only = POLICY.approval.model_copy(update={"second_factor": SecondFactor.NONE})
    assert check_approval(plan, approval, now=utc_now() + timedelta(seconds=1), operation=Operation.ISOLATE,
                          rule=form_only, trusted=TrustedApprovers(), cluster="lab", tenant="acme") == approval


def test_rejection_keeps_the_reason(codes: TotpStore) -> None:
    plan = _plan()
    reviewed = _review(plan, _answer(plan, decision=Decision.REJECT, comment="owner debugging",
                                     code=codes.current_code("alice")), codes)
    assert (reviewed.verdict, reviewed.reason, reviewed.approver) == (
        AnswerVerdict.REJECTED, "rejected by alice: owner debugging", "alice")


@pytest.mark.parametrize("who, code, doubt", [
    pytest.param("alice", "", "requires alice's current TOTP code", id="no-code"),
    pytest.param("bob", "123456", "'bob' may not approve", id="unlisted"),
])
def test_an_unproven_rejection_stands_but_names_nobody(codes: TotpStore, who: str, code: str, doubt: str) -> None:
    """Rejecting touches nothing, so it stands; but whoever reaches the API must not put it in an
    approver's name (the audit record's approver stays empty)."""
    plan = _plan()
    reviewed = _review(plan, _answer(plan, decision=Decision.REJECT, approver=who, comment="looks fine",
                                     code=code), codes)
    assert reviewed.verdict is AnswerVerdict.REJECTED and reviewed.approver == ""
    assert reviewed.reason.startswith(f"rejected by an unverified answer naming {who!r} (")
    assert doubt in reviewed.reason and reviewed.reason.endswith(": looks fine")


def test_every_problem_is_named_at_once(codes: TotpStore) -> None:
    plan = _plan()
    reviewed = _review(plan, _answer(plan, plan_hash="f" * 64, nodes=["gpu-node-009"], approver=""), codes)
    assert reviewed.verdict is AnswerVerdict.REFUSED and reviewed.approval is None
    for part in ("not the plan shown", "gpu-node-009 is not in the plan", "approver's name is missing"):
        assert part in reviewed.reason


def test_approvers_come_from_the_runbook_for_the_tenant_and_cluster(codes: TotpStore) -> None:
    plan = _plan()
    assert "'carol' may not approve" in _review(plan, _answer(plan, approver="carol"), codes).reason
    scoped = IsolationPolicy(approval=ApprovalRule(scoped=(ApproverScope(tenant="acme", cluster="lab",
                                                                         names=frozenset({"carol"})),)))
    plan = _plan(scoped)
    carol = _answer(plan, approver="carol", code=codes.current_code("carol"))
    assert _review(plan, carol, codes, scoped).verdict is AnswerVerdict.APPROVED
    alice = _answer(plan, approver="alice", code=codes.current_code("alice"))
    assert _review(plan, alice, codes, scoped).verdict is AnswerVerdict.REFUSED


def test_a_runbook_without_the_ui_channel_refuses(codes: TotpStore) -> None:
    policy = IsolationPolicy(approval=ApprovalRule(approvers=frozenset({"alice"}),
                                                   channels=frozenset({ApprovalChannel.CLI_SIGNED})))
    plan = _plan(policy)
    reviewed = _review(plan, _answer(plan, code=codes.current_code("alice")), codes, policy)
    assert "does not accept approvals through the Prefect UI" in reviewed.reason


def test_unknown_fields_are_refused() -> None:
    plan = _plan()
    with pytest.raises(ValueError, match="extra"):
        _answer(plan, sneaky=True)


def test_a_subset_of_nodes_is_bound_into_the_approval(codes: TotpStore) -> None:
    plan = _plan()
    reviewed = _review(plan, _answer(plan, nodes=["gpu-node-003"], code=codes.current_code("alice")), codes)
    assert reviewed.approval is not None and reviewed.approval.nodes == ("gpu-node-003",)


# -- the second factor ---------------------------------------------------------------------


@pytest.mark.parametrize("code, why", [
    pytest.param("", "requires alice's current TOTP code", id="missing"),
    pytest.param("12345", "must be the 6 digits", id="malformed"),
    pytest.param("carol", "must be the 6 digits", id="a-name"),
])
def test_an_approval_without_a_valid_code_is_refused(codes: TotpStore, code: str, why: str) -> None:
    plan = _plan()
    reviewed = _review(plan, _answer(plan, code=code), codes)
    assert reviewed.verdict is AnswerVerdict.REFUSED and reviewed.approval is None
    assert why in reviewed.reason


def test_a_wrong_code_and_another_approvers_code_are_refused(codes: TotpStore) -> None:
    plan = _plan()
    right = codes.current_code("alice")
    wrong = f"{(int(right) + 1) % 1_000_000:06d}"
    for code in (wrong, codes.current_code("carol")):
        if code == right:  # one in a million: carol's secret gives alice's code this step
            continue
        reviewed = _review(plan, _answer(plan, code=code), codes)
        assert reviewed.verdict is AnswerVerdict.REFUSED
        assert "not alice's current code" in reviewed.reason


def test_a_code_is_accepted_once(codes: TotpStore) -> None:
    plan = _plan()
    code = codes.current_code("alice")
    assert _review(plan, _answer(plan, code=code), codes).verdict is AnswerVerdict.APPROVED
    again = _review(plan, _answer(plan, code=code), codes)
    assert again.verdict is AnswerVerdict.REFUSED and "already used" in again.reason


def test_a_code_is_spent_even_by_an_answer_refused_for_another_reason(codes: TotpStore) -> None:
    """The refused answer stays in the run's stored input, readable through the Prefect API:
    its code must not approve another plan (a hostile review's finding)."""
    plan = _plan()
    code = codes.current_code("alice")
    refused = _review(plan, _answer(plan, nodes=["gpu-node-099"], code=code), codes)
    assert refused.verdict is AnswerVerdict.REFUSED and "gpu-node-099 is not in the plan" in refused.reason
    other = _plan_for("inc-10")
    stolen = _review(other, _answer(other, code=code), codes)
    assert stolen.verdict is AnswerVerdict.REFUSED and "already used" in stolen.reason


def test_wrong_codes_lock_the_approver_out(codes: TotpStore) -> None:
    plan = _plan()
    right = codes.current_code("alice")
    wrong = [f"{n:06d}" for n in range(10) if f"{n:06d}" != right][:5]
    for code in wrong:
        assert "not alice's current code" in _review(plan, _answer(plan, code=code), codes).reason
    locked = _review(plan, _answer(plan, code=right), codes)
    assert locked.verdict is AnswerVerdict.REFUSED and "5 wrong codes for alice" in locked.reason


def test_an_approver_without_an_enrolled_secret_is_refused(codes: TotpStore) -> None:
    policy = IsolationPolicy(approval=ApprovalRule(approvers=frozenset({"alice", "bob"})))
    plan = _plan(policy)
    reviewed = _review(plan, _answer(plan, approver="bob", code="123456"), codes, policy)
    assert reviewed.verdict is AnswerVerdict.REFUSED and "denpex approver enroll bob" in reviewed.reason


def test_the_executor_refuses_a_ui_approval_without_the_code_the_runbook_requires(codes: TotpStore) -> None:
    lenient = IsolationPolicy(approval=ApprovalRule(approvers=frozenset({"alice"}), second_factor=SecondFactor.NONE))
    plan = _plan(lenient)
    reviewed = _review(plan, _answer(plan), codes, lenient)
    assert reviewed.verdict is AnswerVerdict.APPROVED and reviewed.approval is not None
    assert reviewed.approval.second_factor is None
    later = utc_now() + timedelta(seconds=1)
    assert check_approval(plan, reviewed.approval, now=later, operation=Operation.ISOLATE, rule=lenient.approval,
                          trusted=TrustedApprovers(), cluster="lab", tenant="acme") == reviewed.approval
    # The operator's runbook at execution is what counts: it proves approvers on the approval page.
    with pytest.raises(ApprovalError, match="proves approvers on the approval page"):
        check_approval(plan, reviewed.approval, now=later, operation=Operation.ISOLATE, rule=POLICY.approval,
                       trusted=TrustedApprovers(), cluster="lab", tenant="acme")


def test_a_code_typed_where_none_is_required_is_still_checked(codes: TotpStore) -> None:
    lenient = IsolationPolicy(approval=ApprovalRule(approvers=frozenset({"alice"}), second_factor=SecondFactor.NONE))
    plan = _plan(lenient)
    assert _review(plan, _answer(plan, code="000000"), codes, lenient).verdict is AnswerVerdict.REFUSED or \
        codes.current_code("alice") == "000000"
    reviewed = _review(plan, _answer(plan, code=codes.current_code("alice")), codes, lenient)
    assert reviewed.approval is not None and reviewed.approval.second_factor == "totp"


def test_a_code_is_matched_when_the_api_received_the_answer_not_when_the_flow_read_it(codes: TotpStore) -> None:
    """A loaded worker may read the answer minutes after the approver typed it (CI saw a code
    expire on the way); the lag the API measured is believed up to MAX_ANSWER_LAG."""
    plan = _plan()
    now = utc_now()
    typed = now - timedelta(minutes=3)
    code = codes.current_code("alice", at=typed.timestamp())
    reviewed = review_answer(_answer(plan, code=code), plan, policy=POLICY, operation=Operation.ISOLATE,
                             flow_run_id="run-1", at=now, codes=codes, answer_lag=timedelta(minutes=3))
    assert reviewed.verdict is AnswerVerdict.APPROVED and "TOTP code checked" in reviewed.reason
    # The approval itself is dated by the review, as before; only the code's moment moved.
    assert reviewed.approval is not None and reviewed.approval.approved_at == now
    assert code_typed_at(now, MAX_ANSWER_LAG) == now - MAX_ANSWER_LAG  # the bound itself is believed


@pytest.mark.parametrize("lag", [None, MAX_ANSWER_LAG + timedelta(seconds=1), -timedelta(minutes=10)],
                         ids=["unknown", "too-long", "negative"])
def test_a_lag_that_cannot_be_believed_matches_the_code_at_the_review(tmp_path: Path, lag: timedelta | None) -> None:
    codes = TotpStore(tmp_path)
    codes.enroll("alice")
    plan = _plan()
    now = utc_now()
    assert code_typed_at(now, lag) == now
    typed = now - MAX_ANSWER_LAG - timedelta(minutes=1)
    stale = _answer(plan, code=codes.current_code("alice", at=typed.timestamp()))
    reviewed = review_answer(stale, plan, policy=POLICY, operation=Operation.ISOLATE, flow_run_id="run-1", at=now,
                             codes=codes, answer_lag=lag)
    assert reviewed.verdict is AnswerVerdict.REFUSED and "current code" in reviewed.reason


def test_wrong_codes_are_counted_at_the_review_whatever_the_lag(tmp_path: Path) -> None:
    """The lockout window runs on the review's clock: a lag never moves a guess out of it."""
    codes = TotpStore(tmp_path)
    codes.enroll("alice")
    now = time.time()
    for _ in range(MAX_WRONG_CODES):
        assert codes.check("alice", "000000", at=now, typed_at=now - 290).verdict is CodeVerdict.WRONG
    # Counted at the review: still inside the window a minute before it ends (counted at typed_at,
    # they would have left it 290 s earlier).
    later = now + LOCKOUT_S - 60
    locked = codes.check("alice", codes.current_code("alice", at=later), at=later, typed_at=later - 290)
    assert locked.verdict is CodeVerdict.LOCKED
