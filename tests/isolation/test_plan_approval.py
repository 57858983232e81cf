"""Approvals: one record for every channel, authenticated, bound to plan hash, operation, incident,
cluster and nodes, and judged against the operator's rule (never the plan's)."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from denpex.cli import app
from denpex.isolation.approval import (
    Approval,
    check_approval,
    load_approval,
    load_trusted_approvers,
    save_approval,
    sign_approval,
    ui_approval,
)
from denpex.isolation.errors import ApprovalError
from denpex.isolation.plan import IsolationPlan, Operation, save_plan
from denpex.isolation.planner import plan_isolation
from denpex.isolation.policy import (ApprovalChannel, ApprovalRule, ApproverScope, IsolationPolicy, Scheduler,
                                    SecondFactor)
from isolation.triage_cases import NOW, cluster, killed_process, signal
from isolation.trust import KEYS, signed, trusted

RULE = IsolationPolicy().approval


def make_plan(policy: IsolationPolicy = IsolationPolicy(), code: int = 79, *, on: str | None = "lab",
              tenant: str | None = None) -> IsolationPlan:
    return plan_isolation(killed_process(hardware=[signal(code)]), None, policy, cluster(),
                          Scheduler.SLURM, "inc-42", NOW, cluster=on, tenant=tenant)


def check(plan: IsolationPlan, approval, *, now=NOW, operation=Operation.ISOLATE, rule: ApprovalRule = RULE,
          where: str | None = "lab", tenant: str | None = None):
    return check_approval(plan, approval, now=now, operation=operation, rule=rule, trusted=trusted(),
                          cluster=where, tenant=tenant)


def test_signed_fresh_approval_passes_and_round_trips(tmp_path: Path) -> None:
    plan = make_plan()
    approval = signed(plan, " alice ", key="alice", at=NOW)
    assert approval.approver == "alice" and approval.expires_at == NOW + timedelta(hours=1)
    assert approval.cluster == "lab" and approval.nodes == ("gpu-node-002",)
    assert approval.channel is ApprovalChannel.CLI_SIGNED and approval.signature
    save_approval(approval, tmp_path / "a.json")
    assert check(plan, load_approval(tmp_path / "a.json"), now=NOW + timedelta(minutes=10)) == approval


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
        approval = signed(make_plan(code=48), at=NOW)
    elif approval_of == "same":
        approval = signed(plan, at=NOW)
    elif approval_of == "same-late":
        approval = signed(plan, at=now - timedelta(minutes=1))
    with pytest.raises(ApprovalError, match=needle):
        check(plan, approval, now=now)


# -- item 2: authenticated approvals ---------------------------------------------------------


def test_a_name_without_a_trusted_key_is_not_enough() -> None:
    plan = make_plan()
    # mallory signs with her own key, which the operator does not trust.
    with pytest.raises(ApprovalError, match="no trusted key is configured for 'mallory'"):
        check(plan, signed(plan, "mallory", at=NOW))
    # mallory signs in alice's name with her own key: the signature does not verify.
    with pytest.raises(ApprovalError, match="does not verify with 'alice'"):
        check(plan, signed(plan, "alice", key="mallory", at=NOW))


def test_an_approval_edited_after_signing_is_refused() -> None:
    plan = make_plan(IsolationPolicy(approval=ApprovalRule(ttl=timedelta(hours=1))))
    approval = signed(plan, at=NOW, nodes=[])
    for change in ({"nodes": ("gpu-node-002",)}, {"approver": "bob"}, {"comment": "edited"},
                   {"expires_at": NOW + timedelta(minutes=30)}):
        with pytest.raises(ApprovalError, match="does not verify"):
            check(plan, approval.model_copy(update=change))


def test_a_prefect_ui_approval_needs_the_channel_and_a_listed_approver_for_tenant_and_cluster() -> None:
    plan = make_plan(tenant="acme")
    ui = ui_approval(plan, "carol", flow_run_id="run-1", at=NOW, ttl=timedelta(hours=1), second_factor="totp")
    with pytest.raises(ApprovalError, match="names no approvers for this tenant and cluster"):
        check(plan, ui, tenant="acme")
    scoped = ApprovalRule(scoped=(ApproverScope(tenant="acme", cluster="lab", names=frozenset({"carol"})),),
                          second_factor=SecondFactor.NONE)
    assert check(plan, ui, rule=scoped, tenant="acme") == ui
    with pytest.raises(ApprovalError, match="names no approvers for this tenant"):
        check(plan, ui, rule=scoped, tenant="globex")
    others = scoped.model_copy(update={"approvers": frozenset({"dave"})})
    with pytest.raises(ApprovalError, match="'carol' is not an allowed approver here \\(dave\\)"):
        check(plan, ui, rule=others, tenant="globex")
    closed = scoped.model_copy(update={"channels": frozenset({ApprovalChannel.CLI_SIGNED})})
    with pytest.raises(ApprovalError, match="does not accept prefect-ui approvals"):
        check(plan, ui, rule=closed, tenant="acme")


def test_a_prefect_ui_approval_is_accepted_only_where_the_runbook_keeps_the_prefect_form() -> None:
    """Issue 30 section 1: a code typed into the Prefect form proves who typed it, not what they
    decided or for which run; with a second factor the approval page decides, never the form."""
    plan = make_plan(tenant="acme")
    bare = ui_approval(plan, "carol", flow_run_id="run-1", at=NOW, ttl=timedelta(hours=1))
    with_code = ui_approval(plan, "carol", flow_run_id="run-1", at=NOW, ttl=timedelta(hours=1), second_factor="totp")
    scoped = ApprovalRule(scoped=(ApproverScope(tenant="acme", cluster="lab", names=frozenset({"carol"})),))
    for record in (bare, with_code):
        with pytest.raises(ApprovalError, match="proves approvers on the approval page .*second_factor: none"):
            check(plan, record, rule=scoped, tenant="acme")
    lenient = scoped.model_copy(update={"second_factor": SecondFactor.NONE})
    assert check(plan, bare, rule=lenient, tenant="acme") == bare


def test_a_signed_approval_names_no_second_factor_and_its_signed_bytes_are_as_before() -> None:
    plan = make_plan()
    approval = signed(plan, at=NOW)
    assert b"second_factor" not in approval.signed_bytes()  # signatures made before the field verify
    with pytest.raises(ValueError, match="names no second_factor"):
        Approval.model_validate({**approval.model_dump(), "second_factor": "totp"})


def test_listed_approvers_restrict_signed_approvals_too() -> None:
    plan = make_plan()
    only_bob = ApprovalRule(approvers=frozenset({"bob"}))
    with pytest.raises(ApprovalError, match="'alice' is not an allowed approver here \\(bob\\)"):
        check(plan, signed(plan, at=NOW), rule=only_bob)
    assert check(plan, signed(plan, "bob", at=NOW), rule=only_bob).approver == "bob"


def test_an_approval_longer_than_the_operators_ttl_is_refused() -> None:
    plan = make_plan(IsolationPolicy(approval=ApprovalRule(ttl=timedelta(days=30))))
    approval = signed(plan, at=NOW)  # the plan's (edited) policy gave it 30 days
    with pytest.raises(ApprovalError, match="lasts longer than the runbook's 1h"):
        check(plan, approval, now=NOW + timedelta(minutes=1))


def test_trusted_approvers_file(tmp_path: Path) -> None:
    from denpex.isolation.approval import public_key_text

    path = tmp_path / "approvers.yaml"
    path.write_text(f"approvers:\n  alice: {public_key_text(KEYS['alice'])}\n  bob: [{public_key_text(KEYS['bob'])}]\n")
    keys = load_trusted_approvers(path)
    plan = make_plan()
    assert keys.verifies(signed(plan, at=NOW)) and keys.verifies(signed(plan, "bob", at=NOW))
    assert not keys.verifies(signed(plan, "alice", key="mallory", at=NOW))
    path.write_text("approvers:\n  alice: not-a-key\n")
    with pytest.raises(Exception, match="alice: 'not-a-key' is not a base64 ed25519 public key"):
        load_trusted_approvers(path)


# -- item 8: cluster binding -------------------------------------------------------------------


def test_an_approval_is_bound_to_the_plans_cluster_by_default() -> None:
    plan = make_plan(on="lab")
    approval = signed(plan, at=NOW)
    assert approval.cluster == "lab"
    with pytest.raises(ApprovalError, match="approved this plan for cluster 'lab', but the settings reach cluster 'prod-a'"):
        check(plan, approval, where="prod-a")
    with pytest.raises(ApprovalError, match="does not say its name"):
        check(plan, approval, where=None)
    with pytest.raises(ApprovalError, match="made for cluster 'lab', not 'prod-a'"):
        signed(plan, at=NOW, cluster="prod-a")


def test_a_plan_without_a_cluster_needs_one_named_in_the_approval() -> None:
    plan = make_plan(on=None)
    with pytest.raises(ApprovalError, match="name the cluster"):
        signed(plan, at=NOW)
    assert check(plan, signed(plan, at=NOW, cluster="lab")).cluster == "lab"


def test_approved_nodes_must_be_the_plans() -> None:
    plan = make_plan()
    with pytest.raises(ApprovalError, match="gpu-node-009 not in the plan"):
        signed(plan, at=NOW, nodes=["gpu-node-009"])
    forged = sign_approval(signed(plan, at=NOW).model_copy(update={"nodes": ("gpu-node-009",)}), KEYS["alice"])
    with pytest.raises(ApprovalError, match="names gpu-node-009, which the plan does not"):
        check(plan, forged)


def test_rollback_of_an_old_plan_is_not_refused_for_its_age() -> None:
    plan = make_plan()
    late = NOW + timedelta(days=3)
    with pytest.raises(ApprovalError, match="triage again"):
        check(plan, signed(plan, at=late), now=late)
    approval = signed(plan, at=late, operation=Operation.ROLLBACK)
    assert check(plan, approval, now=late, operation=Operation.ROLLBACK) == approval


@pytest.mark.parametrize(("approved", "run"), [(Operation.ISOLATE, Operation.ROLLBACK),
                                               (Operation.ROLLBACK, Operation.ISOLATE)])
def test_an_approval_covers_one_operation(approved: Operation, run: Operation) -> None:
    plan = make_plan()
    approval = signed(plan, at=NOW, operation=approved)
    assert check(plan, approval, operation=approved) == approval
    with pytest.raises(ApprovalError) as caught:
        check(plan, approval, operation=run)
    assert (f"the approval by alice is for {approved.value}, not {run.value}; a person approves the "
            f"{run.value} with `denpex approve PLAN --approver NAME --key KEYFILE --operation {run.value}`"
            ) in str(caught.value)


def test_an_unsigned_old_style_approval_file_is_refused(tmp_path: Path) -> None:
    # Written before approvals were authenticated: a name, a hash and times, nothing more.
    plan = make_plan()
    (tmp_path / "a.json").write_text(json.dumps({
        "plan_hash": plan.content_hash(), "incident_id": "inc-42", "approver": "alice",
        "approved_at": NOW.isoformat(), "expires_at": (NOW + timedelta(hours=1)).isoformat()}))
    with pytest.raises(ApprovalError, match="not a valid approval: .*channel"):
        load_approval(tmp_path / "a.json")


def test_an_approval_without_a_time_zone_is_refused_with_the_field_named(tmp_path: Path) -> None:
    plan = make_plan()
    body = signed(plan, at=NOW).model_dump(mode="json")
    body["expires_at"] = "2026-11-29T20:00:00"
    (tmp_path / "a.json").write_text(json.dumps(body))
    with pytest.raises(ApprovalError, match="expires_at: .*timezone"):
        load_approval(tmp_path / "a.json")


def test_cli_keygen_and_signed_approve(tmp_path: Path) -> None:
    runner = CliRunner()
    made = runner.invoke(app, ["approver", "keygen", "--out", str(tmp_path / "carol.key"), "--name", "carol"])
    assert made.exit_code == 0, made.output
    assert (tmp_path / "carol.key").stat().st_mode & 0o777 == 0o600
    (tmp_path / "approvers.yaml").write_text("approvers:\n  " + made.stdout)
    plan_path = tmp_path / "plan.json"
    plan = make_plan()
    save_plan(plan, plan_path)
    approved = runner.invoke(app, ["approve", str(plan_path), "--approver", "carol", "--key", str(tmp_path / "carol.key")])
    assert approved.exit_code == 0, approved.output
    assert "on cluster lab as carol (signed)" in approved.stdout
    approval = load_approval(tmp_path / "plan.approval.json")
    assert load_trusted_approvers(tmp_path / "approvers.yaml").verifies(approval)
    again = runner.invoke(app, ["approver", "keygen", "--out", str(tmp_path / "carol.key")])
    assert again.exit_code == 2 and "exists" in again.stderr
    no_key = runner.invoke(app, ["approve", str(plan_path), "--approver", "carol"])
    assert no_key.exit_code == 2 and "--key" in no_key.output
