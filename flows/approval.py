"""What the triage and return-to-service flows share: configuration lookup, the approval pause,
decision records and events. Prefect-facing; the decisions themselves are in ``denpex.workflow``."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import timedelta
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID, uuid4

from prefect.blocks.core import Block
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.objects import FlowRunInput
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.events import emit_event
from prefect.exceptions import FlowPauseTimeout, ObjectAlreadyExists
from prefect.flow_runs import pause_flow_run
from prefect.input import RunInput
from prefect.logging import get_run_logger
from prefect.runtime import flow_run
from prefect.settings import PREFECT_UI_URL
from pydantic import ConfigDict, Field, ValidationError, create_model
from pydantic.fields import FieldInfo

from blocks.notify import DenpexApprovalWebhook
from blocks.runbook import DEFAULT_RUNBOOK, DenpexRunbook, form_runbooks, runbook_path
from blocks.targets import DenpexKubernetesTarget, DenpexSlurmTarget, block_name_for
from denpex.analysis.models import TriageResult
from denpex.approval_page.brief import ApprovalBrief
from denpex.charts import Chart, charts_section
from denpex.isolation.cluster_secrets import SECRETS_ENV, cluster_secrets_dir
from denpex.isolation.config import IsolationSettings
from denpex.evidence.store import open_store
from denpex.isolation.errors import AuditChainError, ConfigError, RunbookError, StoreError
from denpex.isolation.operator import resolve_audit_store, state_audit_log
from denpex.isolation.plan import IsolationPlan, Operation, utc_now
from denpex.isolation.policy import IsolationPolicy, Scheduler, SecondFactor
from denpex.isolation.runbook import Runbook, form_runbook_refusal, load_runbook
from denpex.isolation.second_factor import TotpStore
from denpex.report import TriageReport
from denpex.state_dir import resolve_state_dir
from denpex.tenancy import judge_target, read_ownership
from denpex.workflow.approval_answer import AnswerVerdict, ApprovalAnswer, ReviewedAnswer, review_answer
from denpex.workflow.decision_audit import record_decision
from denpex.workflow.markdown import approval_markdown
from flows.approval_page import ask_on_page
from flows.run_log import incident_log

__all__ = ["ApprovalInput", "Target", "TargetLookup", "load_runbook_for_flow", "find_target", "approval_form", "ask_approval",
           "record_not_done", "record_approved", "emit", "remediation_limit", "ensure_limit", "webhook_url", "state_dir",
           "run_id", "answer_lag", "artifact_prefix", "form_description", "report_url", "FORM_GROUP_CHARTS"]

# Beside the form (about 470 px wide): the overview and the group chart nearest the culprit.
FORM_GROUP_CHARTS = 1

B = TypeVar("B", bound=Block)


def _required_stay_required(schema: dict[str, Any]) -> None:
    """A pre-filled field has a default, which JSON schema reads as optional (the UI then labels it
    "(Optional)"); the answer needs it all the same, so it stays in ``required``."""
    needed = {name for name, field in ApprovalAnswer.model_fields.items() if field.is_required()}
    needed |= set(schema.get("required", []))
    schema["required"] = [name for name in schema.get("properties", {}) if name in needed]


class ApprovalInput(ApprovalAnswer, RunInput):
    """The form beside the paused run (pre-filled with the plan's hash and nodes)."""

    model_config = ConfigDict(json_schema_extra=_required_stay_required)


@dataclass(frozen=True)
class Target:
    """The cluster to act on, as its block describes it."""

    scheduler: Scheduler
    settings: IsolationSettings
    cluster_name: str
    tenant: str | None = None
    """The cluster's owner in the operator's registry (None: no registered owner, no tenant scoping)."""


@dataclass(frozen=True)
class TargetLookup:
    """What ``find_target`` found: a usable target, or why a registered one may not be used."""

    target: Target | None
    refused: str | None = None
    note: str = ""

    def target_or_raise(self, cluster: str) -> Target:
        """The target, else ValueError saying why there is none."""
        if self.target is None:
            raise ValueError(self.refused or f"no Slurm or Kubernetes target block is registered for cluster "
                                             f"{cluster!r}")
        return self.target


def _load(kind: type[B], name: str) -> B | None:
    try:
        return kind.load(name)  # type: ignore[return-value]
    except ValueError:  # Prefect raises ValueError for a block document that does not exist
        return None


def state_dir() -> Path:
    return resolve_state_dir()


def run_id() -> str:
    return str(flow_run.get_id() or "local")


def artifact_prefix(incident_id: str) -> str:
    """Artifact keys take lowercase letters, digits and dashes."""
    return "denpex-" + block_name_for(incident_id)


def load_runbook_for_flow() -> tuple[Runbook, Path]:
    """The runbook the ``default`` DenpexRunbook block names (else hang-triage), from the operator's folder."""
    block = _load(DenpexRunbook, "default")
    name = block.name if block else DEFAULT_RUNBOOK
    path = runbook_path(name)
    runbook = load_runbook(path)
    refusal = form_runbook_refusal(name, runbook, form_runbooks())
    if refusal:
        raise RunbookError(refusal)
    return runbook, path


def find_target(cluster: str, runbook: Path, *, tenant: str | None) -> TargetLookup:
    """The Slurm or Kubernetes target block named after ``cluster`` (no target when none is
    registered), usable only when it names ``cluster`` exactly and the operator's registry in the
    state directory does not give that cluster to a tenant other than ``tenant`` (None: any).
    The target's tenant is the registry's owner, never the parameter's (``denpex.tenancy``).

    The executor's settings name the runbook file, so execution enforces the operator's policy.
    Where the audit log's copy is kept is not among them: the operator's configuration names it
    (``DENPEX_AUDIT_STORE``), never a block, a parameter or the incident's evidence folder.
    """
    name = block_name_for(cluster)
    block: DenpexSlurmTarget | DenpexKubernetesTarget | None = _load(DenpexSlurmTarget, name)
    scheduler = Scheduler.SLURM
    if block is None:
        block, scheduler = _load(DenpexKubernetesTarget, name), Scheduler.KUBERNETES
    if block is None:
        return TargetLookup(None)
    decision = judge_target(read_ownership(state_dir(), cluster), tenant=tenant, block_cluster=block.cluster_name)
    if not decision.allowed:
        return TargetLookup(None, refused=decision.reason)
    # Settings are made (key files written) only for a target that may be used. A credential in
    # the block where the worker keeps its own, or none anywhere, refuses the target: the triage
    # still reports, and nothing connects.
    try:
        settings = block.settings(state_dir(), runbook, os.environ)
        own_folder = cluster_secrets_dir(os.environ) is not None
    except ConfigError as exc:
        return TargetLookup(None, refused=str(exc))
    exposed = "" if own_folder else (f"the target block carries cluster {cluster!r}'s credential, which Prefect gives "
                                     f"to any API client that asks: keep it in the workers' {SECRETS_ENV} folder")
    return TargetLookup(Target(scheduler, settings, block.cluster_name, decision.tenant),
                        note="; ".join(n for n in (decision.reason, exposed) if n))


def webhook_url() -> str | None:
    block = _load(DenpexApprovalWebhook, "approvers")
    return block.url.get_secret_value() if block else os.environ.get("DENPEX_APPROVAL_WEBHOOK_URL") or None


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
    (``flows.approval_page``); only ``second_factor: none`` keeps the Prefect form."""
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


def emit(event: str, incident_id: str, cluster: str, payload: dict[str, Any]) -> None:
    """A Prefect event about this incident (the event feed is part of the audit trail)."""
    emit_event(
        event=event,
        resource={"prefect.resource.id": f"denpex.incident.{incident_id}", "denpex.cluster": cluster},
        related=[{"prefect.resource.id": f"prefect.flow-run.{run_id()}", "prefect.resource.role": "flow-run"}],
        payload=payload,
    )


def record_approved(plan: IsolationPlan, answer: ReviewedAnswer, *, operation: Operation, cluster: str) -> None:
    """The approval's ``decision`` record, with its comment, before the first intent (the approval
    page wrote its own before it resumed the run)."""
    if answer.recorded or answer.approval is None:
        return
    comment = answer.approval.comment or "no comment"
    _record(plan, operation=operation, outcome="approved", reason=f"{answer.reason}: {comment}",
            approver=answer.approver or None, cluster=cluster)


def record_not_done(plan: IsolationPlan, *, operation: Operation, outcome: str, reason: str,
                    approver: str | None, cluster: str, audited: bool = False) -> None:
    """Audit log (and the cluster's stored copy, in the operator's audit store) and event feed:
    why nothing was done (``audited``: the approval page already wrote the decision)."""
    payload = {"plan_hash": plan.content_hash(), "operation": operation.value, "reason": reason}
    if not audited:
        payload |= _record(plan, operation=operation, outcome=outcome, reason=reason, approver=approver,
                           cluster=cluster)
    emit(f"denpex.remediation.{outcome}", plan.incident_id, cluster, payload)


def _record(plan: IsolationPlan, *, operation: Operation, outcome: str, reason: str, approver: str | None,
            cluster: str) -> dict[str, str]:
    """One decision record in the audit log and the cluster's stored copy. A copy that fails is a
    warning (returned for the event): the record is in the log, and the cluster's next action
    checks the log against the copy as it stands."""
    folder = state_dir()
    payload: dict[str, str] = {}
    try:
        record_decision(state_audit_log(folder), plan, operation=operation, outcome=outcome, reason=reason,
                        approver=approver, at=utc_now(), store=open_store(resolve_audit_store(None, folder)),
                        cluster=plan.cluster or cluster)
    except (StoreError, AuditChainError) as exc:
        get_run_logger().warning("the %s decision is in the audit log but not in its stored copy: %s",
                                 outcome, exc)
        payload["audit_copy_warning"] = str(exc)
    return payload


def remediation_limit(cluster: str) -> str:
    """The global concurrency limit that keeps one cluster's remediation to one run at a time."""
    return f"denpex-remediation-{block_name_for(cluster)}"


def ensure_limit(name: str) -> None:
    """Create the limit (one slot) if it does not exist yet; Prefect only honours existing limits."""
    with get_client(sync_client=True) as client:
        try:
            client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
        except ObjectAlreadyExists:
            pass
