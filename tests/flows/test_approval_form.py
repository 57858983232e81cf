"""The approval form's schema: what the Prefect server checks an answer against before resuming."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from denpex.isolation.plan import IsolationPlan, utc_now
from denpex.isolation.planner import plan_isolation
from denpex.isolation.policy import ApprovalRule, ApproverScope, IsolationPolicy, Scheduler
from flows.approval import approval_form
from lab.rig import xid79_on


def _plan(policy: IsolationPolicy, tenant: str = "acme") -> IsolationPlan:
    result = xid79_on(["gpu-node-002"])
    return plan_isolation(result, None, policy, None, Scheduler.SLURM, "inc-1", result.as_of or utc_now(),
                          cluster="lab", tenant=tenant)


def test_the_approver_is_a_choice_among_the_runbooks_approvers_for_the_tenant_and_cluster() -> None:
    policy = IsolationPolicy(approval=ApprovalRule(
        approvers=frozenset({"_odd", "name"}),
        scoped=(ApproverScope(tenant="acme", names=frozenset({"alice"})),
                ApproverScope(tenant="globex", names=frozenset({"mallory"})))))
    plan = _plan(policy)
    form = approval_form(plan, "the plan", policy=policy)
    schema = form.model_json_schema()
    assert schema["$defs"]["Approver"]["enum"] == ["_odd", "alice", "name"]  # names as values, any spelling
    assert schema["additionalProperties"] is False and set(schema["required"]) == {"decision", "plan_hash", "nodes",
                                                                                "approver"}
    props = schema["properties"]
    assert props["plan_hash"]["default"] == plan.content_hash() and props["nodes"]["default"] == ["gpu-node-002"]
    assert "authenticator" in props["code"]["description"] and props["code"]["maxLength"] == 32
    assert form._description == "the plan"
    assert form(decision="approve", approver="alice", code="123456").model_dump(mode="json")["approver"] == "alice"
    with pytest.raises(ValidationError):
        form(decision="approve", approver="mallory")  # another tenant's approver


def test_a_runbook_naming_nobody_leaves_a_free_name_that_the_review_refuses() -> None:
    policy = IsolationPolicy(approval=ApprovalRule())
    form = approval_form(_plan(policy), "the plan", policy=policy)
    assert form.model_json_schema()["properties"]["approver"]["type"] == "string"


def test_every_field_keeps_its_description_and_required_fields_stay_required_in_the_schema_the_ui_gets() -> None:
    """Issue 20 item 1: the schema Prefect stores for the UI (``create_v2_schema``, as
    ``RunInput.save`` makes it), not only the model's own."""
    from prefect._internal.pydantic.v2_schema import create_v2_schema

    policy = IsolationPolicy(approval=ApprovalRule(approvers=frozenset({"alice", "carol"})))
    plan = _plan(policy)
    form = approval_form(plan, "the plan", policy=policy)
    schema = create_v2_schema(form.__name__, model_base=form)
    props = schema["properties"]
    assert [name for name, prop in props.items() if not prop.get("description")] == []
    # Pre-filled, yet required: the answer must carry them (the UI then shows no "(Optional)").
    assert schema["required"] == ["decision", "plan_hash", "nodes", "approver"]
    assert props["plan_hash"]["default"] == plan.content_hash()
    assert "alice, carol" in props["approver"]["description"]  # the form says who may approve


def test_the_answers_receipt_is_the_servers_time_of_the_pause_response(prefect_harness: str) -> None:
    """A code is judged when the API received the answer (``review_answer``'s ``answered_at``): read
    from the real API's stored run input, the ``-response`` key only (the form's schema and
    description are stored under the same pause, earlier)."""
    from datetime import timedelta

    from prefect import flow
    from prefect.client.orchestration import get_client

    from flows.approval import answer_received_at

    @flow(name="receipt-probe")
    def probe() -> None:
        pass

    with get_client(sync_client=True) as client:
        run = client.create_flow_run(probe)
        assert answer_received_at(str(run.id)) is None  # no answer yet
        before = utc_now()
        client.create_flow_run_input(run.id, key="paused-1-schema", value="{}")
        client.create_flow_run_input(run.id, key="paused-1-response", value='{"decision": "approve"}')
        after = utc_now()
        [response] = [i for i in client.filter_flow_run_input(run.id, key_prefix="paused-", limit=10,
                                                              exclude_keys=set()) if i.key.endswith("-response")]
    received = answer_received_at(str(run.id))
    assert received is not None and received == response.created
    assert before - timedelta(seconds=5) <= received <= after + timedelta(seconds=5)
