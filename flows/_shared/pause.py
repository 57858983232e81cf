"""The approval pause: where the runbook asks for a second factor, the person decides on the
approval page (``flows._shared.page``); only ``second_factor: none`` keeps Prefect's own form,
whose answer is reviewed here (``denpex.workflow.approval_answer``)."""

from __future__ import annotations

import json
from datetime import timedelta
from enum import Enum
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.objects import FlowRunInput
from prefect.exceptions import FlowPauseTimeout
from prefect.flow_runs import pause_flow_run
from prefect.input import RunInput
from prefect.settings import PREFECT_UI_URL
from pydantic import ConfigDict, Field, ValidationError, create_model
from pydantic.fields import FieldInfo

from denpex.analysis.models import TriageResult
from denpex.approval_page.brief import ApprovalBrief
from denpex.charts import Chart, charts_section
from denpex.isolation.plan import IsolationPlan, Operation, utc_now
from denpex.isolation.policy import IsolationPolicy, SecondFactor
from denpex.isolation.second_factor import TotpStore
from denpex.report import TriageReport
from denpex.workflow.approval_answer import AnswerVerdict, ApprovalAnswer, ReviewedAnswer, review_answer
from denpex.workflow.markdown import approval_markdown
from flows._shared.page import ask_on_page
from flows._shared.run import run_id, state_dir
from flows.run_log import incident_log

__all__ = ["ApprovalInput", "approval_form", "ask_approval", "answer_lag", "form_description", "report_url",
           "FORM_GROUP_CHARTS"]

# Beside the form (about 470 px wide): the overview and the group chart nearest the culprit.
FORM_GROUP_CHARTS = 1


def _required_stay_required(schema: dict[str, Any]) -> None:
    """A pre-filled field has a default, which JSON schema reads as optional (the UI then labels it
    "(Optional)"); the answer needs it all the same, so it stays in ``required``."""
    needed = {name for name, field in ApprovalAnswer.model_fields.items() if field.is_required()}
    needed |= set(schema.get("required", []))
    schema["required"] = [name for name in schema.get("properties", {}) if name in needed]


class ApprovalInput(ApprovalAnswer, RunInput):
    """The form beside the paused run (pre-filled with the plan's hash and nodes)."""

    model_config = ConfigDict(json_schema_extra=_required_stay_required)


def report_url(key_prefix: str) -> str | None:
    """The UI's page of the report artifact (the latest under its key); None without a UI address
    (``PREFECT_UI_URL``, which Prefect derives from the API's address)."""
    base = PREFECT_UI_URL.value()
    return f"{str(base).rstrip('/')}/artifacts/key/{key_prefix}-report" if base else None


def form_description(report: TriageReport, result: TriageResult, plan: IsolationPlan, charts: list[Chart], *,
                     incident_id: str, cluster: str, policy: IsolationPolicy, key_prefix: str) -> str:
    """The short plan shown above the approval form, with who may approve and a link to the report."""
    link = report_url(key_prefix)
    where = f"[the full report]({link})" if link else "the report artifact (Artifacts tab)"
    return approval_markdown(
        report, incident_id=incident_id, cluster=cluster, plan=plan, report_link=link,
        approvers=sorted(policy.approval.approvers_for(plan.tenant, plan.cluster)),
        code_needed=policy.approval.second_factor is SecondFactor.TOTP,
        on_page=policy.approval.second_factor is not SecondFactor.NONE,
        charts=charts_section(charts, result, groups=FORM_GROUP_CHARTS, rest_at=where))


def approval_form(plan: IsolationPlan, description: str, *, policy: IsolationPolicy) -> type[ApprovalInput]:
    """The form beside the paused run: the plan's hash and nodes pre-filled, and the approver a
    choice among the runbook's approvers for the plan's tenant and cluster (a name typed freely
    where the runbook lists nobody: that answer is refused with the reason, rather than the
    form failing). The Prefect server validates an answer against this schema before resuming."""
    fields: dict[str, Any] = {}
    defaults = {"plan_hash": plan.content_hash(), "nodes": [a.node for a in plan.actions], "comment": "", "code": ""}
    for key, value in defaults.items():
        # RunInput.with_initial_data would drop each field's description and bounds; keep them.
        known = ApprovalInput.model_fields[key]
        fields[key] = (known.annotation, FieldInfo.merge_field_infos(known, default=value))
    names = sorted(policy.approval.approvers_for(plan.tenant, plan.cluster))
    if names:
        # Member keys of our own: a runbook's names are values, whatever they look like ("_x", "name").
        choice = Enum("Approver", {f"a{i}": name for i, name in enumerate(names)}, type=str)  # type: ignore[misc]
        fields["approver"] = (choice, Field(description="who approves: one of the runbook's approvers for this "
                                                        f"tenant and cluster ({_listed(names)})"))
    form = create_model("ApprovalInput", __base__=ApprovalInput, **fields)
    form._description = description  # what Prefect shows above the form (as with_initial_data sets it)
    return form


def _listed(names: list[str], limit: int = 10) -> str:
    more = len(names) - limit
    return ", ".join(names[:limit]) + (f" and {more} more" if more > 0 else "")


def ask_approval(plan: IsolationPlan, description: str, *, operation: Operation, policy: IsolationPolicy,
                 timeout: timedelta, poll: timedelta, brief: ApprovalBrief, runbook_file: Path) -> ReviewedAnswer | None:
    """Pause until a person answers; None when nobody did within ``timeout``. Where the runbook
    asks for a second factor (the default), the person decides on the approval page
    (``flows._shared.page``); only ``second_factor: none`` keeps the Prefect form."""
    if policy.approval.second_factor is not SecondFactor.NONE:
        return ask_on_page(plan, description, brief, operation=operation, policy=policy, runbook_file=runbook_file,
                           timeout=timeout, poll=poll)
    return _ask_in_form(plan, description, operation=operation, policy=policy, timeout=timeout, poll=poll)


def _ask_in_form(plan: IsolationPlan, description: str, *, operation: Operation, policy: IsolationPolicy,
                 timeout: timedelta, poll: timedelta) -> ReviewedAnswer | None:
    """The Prefect form (``second_factor: none``: a single trusted operator)."""
    form = approval_form(plan, description, policy=policy)
    pause = uuid4().hex  # its keys cannot be guessed, or written, before this pause exists
    try:
        answer = pause_flow_run(wait_for_input=form, timeout=int(timeout.total_seconds()),
                                poll_interval=max(1, int(poll.total_seconds())), key=pause)
    except FlowPauseTimeout:
        return None
    except ValidationError as exc:
        # Resumed with no answer, or one the form refuses (a state forced through the API): nothing
        # runs, and the refusal is recorded like any other.
        return ReviewedAnswer(verdict=AnswerVerdict.REFUSED, reason="approval refused, nothing was done: the run was "
                              f"resumed without a valid answer ({exc.error_count()} problem(s) with the form's fields)")
    core = _answer_of(answer.model_dump(mode="json"))
    this_run = run_id()
    try:
        lag = answer_lag(this_run, pause, core)
    except Exception as exc:  # noqa: BLE001 - without it the code is matched now, as before this lag existed
        lag, unknown = None, f"when it reached the API could not be read ({exc})"
    else:
        unknown = "the answer stored in the API is not the one reviewed" if lag is None else ""
    if lag is None:
        incident_log().info("answer: %s; its code is matched now", unknown)
    else:
        incident_log().info("answer: arrived %.1f s before the flow read it (the Prefect API's clock); its code is "
                            "matched then", lag.total_seconds())
    return review_answer(core, plan, policy=policy, operation=operation, flow_run_id=this_run, at=utc_now(),
                         codes=TotpStore(state_dir()), answer_lag=lag)


def answer_lag(flow_run_id: str, pause: str, answer: ApprovalAnswer) -> timedelta | None:
    """How long ago the Prefect API received ``answer`` to pause ``pause``, on the server's own
    clock; None when the stored answer is not ``answer``. Raises what the API raises (a marker key
    written by someone else: 409).

    Prefect keeps the answer as run input ``paused-<pause>-response``, with the time the server
    wrote it. This stores a marker ``paused-<pause>-read`` and takes the difference of the two
    server times, so the worker's clock never meets the server's (with several API replicas their
    clocks must agree, as for every time Prefect stores). The stored answer must still be the one
    the flow read: one written since (by whoever reaches the API) gives no lag."""
    flow_run_uuid = UUID(flow_run_id)
    with get_client(sync_client=True) as client:
        response = _run_input(client, flow_run_uuid, f"paused-{pause}-response")
        if response is None or response.created is None or not _same_answer(response.value, answer):
            return None
        client.create_flow_run_input(flow_run_uuid, key=f"paused-{pause}-read", value='"read"')
        read = _run_input(client, flow_run_uuid, f"paused-{pause}-read")
    if read is None or read.created is None:
        return None
    return read.created - response.created


def _run_input(client: SyncPrefectClient, flow_run_id: UUID, key: str, pages: int = 5) -> FlowRunInput | None:
    """The input stored under exactly ``key``. The API filters by prefix, oldest first: inputs
    whose keys merely start with ``key`` (anyone may write them) are excluded page by page."""
    seen: set[str] = set()
    for _ in range(pages):
        found = client.filter_flow_run_input(flow_run_id, key_prefix=key, limit=50, exclude_keys=seen)
        exact = next((i for i in found if i.key == key), None)
        if exact is not None or len(found) < 50:
            return exact
        seen |= {i.key for i in found}
    return None


def _answer_of(value: dict[str, Any]) -> ApprovalAnswer:
    """The form's answer as the core reads it: its own fields only (Prefect's form adds metadata)."""
    return ApprovalAnswer.model_validate({k: v for k, v in value.items() if k in ApprovalAnswer.model_fields})


def _same_answer(stored: str, answer: ApprovalAnswer) -> bool:
    try:
        return _answer_of(json.loads(stored)) == answer
    except (ValueError, AttributeError):  # not JSON, not an object, not a valid answer
        return False
