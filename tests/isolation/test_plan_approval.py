"""Approvals bind a named person to one plan hash, for a limited time."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from denpex.isolation.approval import approve_plan, check_approval, load_approval, save_approval
from denpex.isolation.errors import ApprovalError
from denpex.isolation.plan import Operation
from denpex.isolation.planner import plan_isolation
from denpex.isolation.policy import ApprovalRule, IsolationPolicy, Scheduler
from isolation.triage_cases import NOW, cluster, killed_process, signal


def make_plan(policy: IsolationPolicy = IsolationPolicy(), code: int = 79):
    return plan_isolation(killed_process(hardware=[signal(code)]), None, policy, cluster(),
                          Scheduler.SLURM, "inc-42", NOW)


def test_matching_fresh_approval_passes_and_round_trips(tmp_path: Path) -> None:
    plan = make_plan()
    approval = approve_plan(plan, " alice ", at=NOW, comment="Xid 79 confirmed")
    assert approval.approver == "alice" and approval.expires_at == NOW + timedelta(hours=1)
    save_approval(approval, tmp_path / "a.json")
    assert check_approval(plan, load_approval(tmp_path / "a.json"), now=NOW + timedelta(minutes=10)) == approval


@pytest.mark.parametrize(
    ("approval_of", "now", "needle"),
    [
        pytest.param(None, NOW, "has no approval", id="missing"),
        pytest.param("other-plan", NOW, "the plan changed after approval", id="other-plan"),
        pytest.param("same", NOW + timedelta(hours=2), "expired", id="expired"),
        pytest.param("same", NOW - timedelta(hours=1), "dated in the future", id="future"),
        pytest.param("same-late", NOW + timedelta(hours=7), "triage again before acting", id="plan-too-old"),
    ],
)
def test_execution_refused(approval_of: str | None, now, needle: str) -> None:
    plan = make_plan()
    approval = None
    if approval_of == "other-plan":
        approval = approve_plan(make_plan(code=48), "alice", at=NOW)
    elif approval_of == "same":
        approval = approve_plan(plan, "alice", at=NOW)
    elif approval_of == "same-late":
        approval = approve_plan(plan, "alice", at=now - timedelta(minutes=1))
    with pytest.raises(ApprovalError, match=needle):
        check_approval(plan, approval, now=now)


def test_only_listed_approvers_may_approve() -> None:
    plan = make_plan(IsolationPolicy(approval=ApprovalRule(approvers=frozenset({"alice"}))))
    with pytest.raises(ApprovalError, match="allowed: alice"):
        approve_plan(plan, "mallory", at=NOW)
    with pytest.raises(ApprovalError, match="approver's name"):
        approve_plan(plan, "", at=NOW)
    assert approve_plan(plan, "alice", at=NOW).approver == "alice"


def test_rollback_of_an_old_plan_is_not_refused_for_its_age() -> None:
    plan = make_plan()
    late = NOW + timedelta(days=3)
    with pytest.raises(ApprovalError, match="triage again"):
        check_approval(plan, approve_plan(plan, "alice", at=late), now=late)
    approval = approve_plan(plan, "alice", at=late, operation=Operation.ROLLBACK)
    assert check_approval(plan, approval, now=late, operation=Operation.ROLLBACK) == approval


@pytest.mark.parametrize(
    ("approved", "run", "needle"),
    [
        pytest.param(Operation.ISOLATE, Operation.ROLLBACK,
                     "the approval by alice is for isolate, not rollback; a person approves the rollback with "
                     "`denpex approve PLAN --approver NAME --operation rollback`", id="isolate-approval-for-rollback"),
        pytest.param(Operation.ROLLBACK, Operation.ISOLATE,
                     "the approval by alice is for rollback, not isolate; a person approves the isolate with "
                     "`denpex approve PLAN --approver NAME --operation isolate`", id="rollback-approval-for-isolate"),
    ],
)
def test_an_approval_covers_one_operation(approved: Operation, run: Operation, needle: str) -> None:
    plan = make_plan()
    approval = approve_plan(plan, "alice", at=NOW, operation=approved)
    assert approval.operation is approved
    assert check_approval(plan, approval, now=NOW, operation=approved) == approval
    with pytest.raises(ApprovalError) as caught:
        check_approval(plan, approval, now=NOW, operation=run)
    assert needle in str(caught.value)


def test_an_approval_file_without_an_operation_approves_isolate_only(tmp_path: Path) -> None:
    # Written before approvals named their operation.
    plan = make_plan()
    body = approve_plan(plan, "alice", at=NOW).model_dump(mode="json")
    del body["operation"]
    (tmp_path / "a.json").write_text(json.dumps(body))
    old = load_approval(tmp_path / "a.json")
    assert old.operation is Operation.ISOLATE
    assert check_approval(plan, old, now=NOW) == old
    with pytest.raises(ApprovalError, match="is for isolate, not rollback"):
        check_approval(plan, old, now=NOW, operation=Operation.ROLLBACK)


def test_an_approval_without_a_time_zone_is_refused_with_the_field_named(tmp_path: Path) -> None:
    # Written by hand or by another tool: naive times cannot be compared with the clock.
    plan = make_plan()
    body = approve_plan(plan, "alice", at=NOW).model_dump(mode="json")
    body["expires_at"] = "2026-11-29T20:00:00"
    (tmp_path / "a.json").write_text(json.dumps(body))
    with pytest.raises(ApprovalError, match="expires_at: .*timezone"):
        load_approval(tmp_path / "a.json")
