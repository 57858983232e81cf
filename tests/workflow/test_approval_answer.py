"""The approval form's answer becomes a prefect-ui approval, or a refusal naming every problem."""

from __future__ import annotations

from datetime import timedelta

import pytest

from denpex.isolation.approval import TrustedApprovers, check_approval
from denpex.isolation.plan import IsolationPlan, Operation, utc_now
from denpex.isolation.planner import plan_isolation
from denpex.isolation.policy import ApprovalChannel, ApprovalRule, ApproverScope, IsolationPolicy, Scheduler
from denpex.workflow.approval_answer import AnswerVerdict, ApprovalAnswer, Decision, ReviewedAnswer, review_answer
from lab.rig import xid79_on

POLICY = IsolationPolicy(approval=ApprovalRule(approvers=frozenset({"alice"})))


def _plan(policy: IsolationPolicy = POLICY) -> IsolationPlan:
    result = xid79_on(["gpu-node-002", "gpu-node-003"])
    return plan_isolation(result, None, policy, None, Scheduler.SLURM, "inc-9", result.as_of or utc_now(),
                          cluster="lab", tenant="acme")


def _answer(plan: IsolationPlan, **changes: object) -> ApprovalAnswer:
    fields: dict[str, object] = dict(decision=Decision.APPROVE, plan_hash=plan.content_hash(),
                                     nodes=[a.node for a in plan.actions], approver="alice", comment="ok")
    fields.update(changes)
    return ApprovalAnswer.model_validate(fields)


def _review(plan: IsolationPlan, answer: ApprovalAnswer, policy: IsolationPolicy = POLICY) -> ReviewedAnswer:
    return review_answer(answer, plan, policy=policy, operation=Operation.ISOLATE, flow_run_id="run-1",
                         at=utc_now())


def test_approval_carries_the_architecture_fields_and_passes_the_executors_check() -> None:
    plan = _plan()
    reviewed = _review(plan, _answer(plan))
    assert reviewed.verdict is AnswerVerdict.APPROVED and reviewed.approval is not None
    approval = reviewed.approval
    assert (approval.plan_hash, approval.operation, approval.incident_id, approval.cluster) == (
        plan.content_hash(), Operation.ISOLATE, "inc-9", "lab")
    assert (approval.nodes, approval.approver, approval.comment) == (("gpu-node-002", "gpu-node-003"), "alice", "ok")
    assert (approval.channel, approval.flow_run_id, approval.signature) == (ApprovalChannel.PREFECT_UI, "run-1", None)
    assert check_approval(plan, approval, now=utc_now() + timedelta(seconds=1), operation=Operation.ISOLATE,
                          rule=POLICY.approval, trusted=TrustedApprovers(), cluster="lab", tenant="acme") == approval


def test_rejection_keeps_the_reason() -> None:
    plan = _plan()
    reviewed = _review(plan, _answer(plan, decision=Decision.REJECT, approver="bob", comment="owner debugging"))
    assert (reviewed.verdict, reviewed.reason) == (AnswerVerdict.REJECTED, "rejected by bob: owner debugging")


def test_every_problem_is_named_at_once() -> None:
    plan = _plan()
    reviewed = _review(plan, _answer(plan, plan_hash="f" * 64, nodes=["gpu-node-009"], approver=""))
    assert reviewed.verdict is AnswerVerdict.REFUSED and reviewed.approval is None
    for part in ("not the plan shown", "gpu-node-009 is not in the plan", "approver's name is missing"):
        assert part in reviewed.reason


def test_approvers_come_from_the_runbook_for_the_tenant_and_cluster() -> None:
    plan = _plan()
    assert "'carol' may not approve" in _review(plan, _answer(plan, approver="carol")).reason
    scoped = IsolationPolicy(approval=ApprovalRule(scoped=(ApproverScope(tenant="acme", cluster="lab",
                                                                         names=frozenset({"carol"})),)))
    plan = _plan(scoped)
    assert _review(plan, _answer(plan, approver="carol"), scoped).verdict is AnswerVerdict.APPROVED
    assert _review(plan, _answer(plan, approver="alice"), scoped).verdict is AnswerVerdict.REFUSED


def test_a_runbook_without_the_ui_channel_refuses() -> None:
    policy = IsolationPolicy(approval=ApprovalRule(approvers=frozenset({"alice"}),
                                                   channels=frozenset({ApprovalChannel.CLI_SIGNED})))
    plan = _plan(policy)
    assert "does not accept approvals through the Prefect UI" in _review(plan, _answer(plan), policy).reason


def test_unknown_fields_are_refused() -> None:
    plan = _plan()
    with pytest.raises(ValueError, match="extra"):
        _answer(plan, sneaky=True)


def test_a_subset_of_nodes_is_bound_into_the_approval() -> None:
    plan = _plan()
    reviewed = _review(plan, _answer(plan, nodes=["gpu-node-003"]))
    assert reviewed.approval is not None and reviewed.approval.nodes == ("gpu-node-003",)
