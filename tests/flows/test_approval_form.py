"""The approval form's schema: what the Prefect server checks an answer against before resuming."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import ValidationError

from denpex.isolation.plan import IsolationPlan, utc_now
from denpex.isolation.planner import plan_isolation
from denpex.isolation.policy import ApprovalRule, ApproverScope, IsolationPolicy, Scheduler
from flows._shared.pause import approval_form
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


def test_the_answers_lag_is_measured_on_the_servers_clock_for_the_answer_the_flow_read(prefect_harness: str) -> None:
    """A code is matched when the API received the answer (``review_answer``'s ``answer_lag``):
    the lag is the difference of two times the real API wrote, the pause's ``-response`` input and
    a ``-read`` marker, and is refused (None) when it cannot belong to the answer the flow read."""
    import json
    import time
    from uuid import uuid4

    import httpx
    from prefect import flow
    from prefect.client.orchestration import get_client

    from denpex.workflow.approval_answer import ApprovalAnswer
    from flows._shared.pause import answer_lag

    @flow(name="receipt-probe")
    def probe() -> None:
        pass

    answer = ApprovalAnswer(decision="approve", plan_hash="abc", nodes=["gpu-node-002"], approver="alice",
                            code="123456")
    stored = json.dumps({**answer.model_dump(mode="json"), "comment": ""})
    with get_client(sync_client=True) as client:
        run = client.create_flow_run(probe)
        pause, replaced, raced = uuid4().hex, uuid4().hex, uuid4().hex
        assert answer_lag(str(run.id), pause, answer) is None  # no answer yet
        client.create_flow_run_input(run.id, key=f"paused-{pause}-schema", value="{}")
        client.create_flow_run_input(run.id, key=f"paused-{pause}-response", value=stored)
        # Another pause's answer, with another code, written by whoever reaches the API.
        client.create_flow_run_input(run.id, key=f"paused-{replaced}-response",
                                     value=json.dumps({**answer.model_dump(mode="json"), "code": "654321"}))
        # A '-read' marker planted before the flow writes its own.
        client.create_flow_run_input(run.id, key=f"paused-{raced}-response", value=stored)
        client.create_flow_run_input(run.id, key=f"paused-{raced}-read", value='"read"')
        # More than a page of older inputs whose keys merely start with the answer's key.
        flooded = uuid4().hex
        for i in range(60):
            client.create_flow_run_input(run.id, key=f"paused-{flooded}-response{i}", value="{}")
        client.create_flow_run_input(run.id, key=f"paused-{flooded}-response", value=stored)
        time.sleep(2.0)
    lag = answer_lag(str(run.id), pause, answer)
    assert lag is not None and timedelta(seconds=2) <= lag < timedelta(seconds=30)
    assert answer_lag(str(run.id), replaced, answer) is None  # not the answer the flow read
    flooded_lag = answer_lag(str(run.id), flooded, answer)
    assert flooded_lag is not None and timedelta(seconds=2) <= flooded_lag < timedelta(seconds=30)
    with pytest.raises(httpx.HTTPStatusError) as refused:  # no marker of its own: ask_approval matches the code now
        answer_lag(str(run.id), raced, answer)
    assert refused.value.response.status_code == 409
