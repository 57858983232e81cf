"""The approval form's answer becomes an approval record, or a refusal naming every problem."""

from __future__ import annotations

from datetime import timedelta

import pytest

from denpex.isolation.approval import check_approval
from denpex.isolation.plan import IsolationPlan, Operation, utc_now
from denpex.isolation.planner import plan_isolation
from denpex.isolation.policy import ApprovalRule, IsolationPolicy, Scheduler
from denpex.workflow.approval_answer import (
    AnswerVerdict,
    ApprovalAnswer,
    Decision,
    executable_approval,
    review_answer,
)
from lab.rig import xid79_on


def _plan(policy: IsolationPolicy = IsolationPolicy()) -> IsolationPlan:
    result = xid79_on(["gpu-node-002", "gpu-node-003"])
    return plan_isolation(result, None, policy, None, Scheduler.SLURM, "inc-9", result.as_of or utc_now())


def _answer(plan: IsolationPlan, **changes: object) -> ApprovalAnswer:
    fields: dict[str, object] = dict(decision=Decision.APPROVE, plan_hash=plan.content_hash(),
                                     nodes=[a.node for a in plan.actions], approver="alice", comment="ok")
    fields.update(changes)
    return ApprovalAnswer.model_validate(fields)


def _review(plan: IsolationPlan, answer: ApprovalAnswer):  # noqa: ANN202
    return review_answer(answer, plan, operation=Operation.ISOLATE, cluster="lab", flow_run_id="run-1")


def test_approval_record_carries_the_architecture_fields() -> None:
    plan = _plan()
    reviewed = _review(plan, _answer(plan))
    assert reviewed.verdict is AnswerVerdict.APPROVED and reviewed.record is not None
    assert reviewed.record.model_dump(mode="json") == {
        "plan_hash": plan.content_hash(), "operation": "isolate", "incident_id": "inc-9", "cluster": "lab",
        "nodes": ["gpu-node-002", "gpu-node-003"], "approver": "alice", "comment": "ok",
        "channel": "prefect-ui", "flow_run_id": "run-1",
    }


def test_rejection_keeps_the_reason() -> None:
    plan = _plan()
    reviewed = _review(plan, _answer(plan, decision=Decision.REJECT, approver="bob", comment="owner debugging"))
    assert (reviewed.verdict, reviewed.reason) == (AnswerVerdict.REJECTED, "rejected by bob: owner debugging")


def test_every_problem_is_named_at_once() -> None:
    plan = _plan()
    reviewed = _review(plan, _answer(plan, plan_hash="f" * 64, nodes=["gpu-node-009"], approver=""))
    assert reviewed.verdict is AnswerVerdict.REFUSED and reviewed.record is None
    for part in ("not the plan shown", "gpu-node-009 is not in the plan", "approver's name is missing"):
        assert part in reviewed.reason


def test_approvers_come_from_the_policy() -> None:
    plan = _plan(IsolationPolicy(approval=ApprovalRule(approvers=("carol",))))
    assert _review(plan, _answer(plan)).verdict is AnswerVerdict.REFUSED
    assert _review(plan, _answer(plan, approver="carol")).verdict is AnswerVerdict.APPROVED


def test_unknown_fields_are_refused() -> None:
    plan = _plan()
    with pytest.raises(ValueError, match="extra"):
        _answer(plan, sneaky=True)


def test_a_subset_of_nodes_runs_only_those() -> None:
    plan = _plan()
    reviewed = _review(plan, _answer(plan, nodes=["gpu-node-003"]))
    assert reviewed.record is not None
    narrowed, approval = executable_approval(reviewed.record, plan, at=utc_now())
    assert [a.node for a in narrowed.actions] == ["gpu-node-003"]
    assert check_approval(narrowed, approval, now=utc_now() + timedelta(seconds=1)) == approval
