"""The paused run's side of the approval page (``denpex serve-approvals``).

Before it pauses, the run saves what the page shows (the brief: plan, evidence, charts) in the
state directory and registers itself as waiting; its pause description links to the page. The
page takes the one decision, records it (its database, the audit log) and resumes the run with
the signed record. The run then acts on the decision recorded for it, never on its input alone
(``denpex.workflow.page_decision``). No code and nothing that proves a person passes through
Prefect.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path
from uuid import UUID, uuid4

from prefect.client.schemas.objects import State
from prefect.exceptions import FlowPauseTimeout
from prefect.flow_runs import pause_flow_run
from prefect.input import RunInput
from pydantic import ConfigDict, Field, ValidationError

from denpex.approval_page.brief import ApprovalBrief, save_brief
from denpex.approval_page.store import ApprovalBook, PendingApproval
from denpex.isolation.page_record import load_page_public_keys, page_public_key_path
from denpex.isolation.plan import IsolationPlan, Operation
from denpex.isolation.policy import IsolationPolicy
from denpex.markdown_text import inline
from denpex.state_dir import resolve_state_dir
from denpex.state_paths import plan_file, state_path
from denpex.workflow.approval_answer import AnswerVerdict, ReviewedAnswer
from denpex.workflow.page_decision import review_page_decision
from flows._shared.run import run_id
from flows.run_log import incident_log

__all__ = ["PAGE_URL_ENV", "PageDecisionInput", "page_url", "ask_on_page", "claim_incident", "release_incident"]

PAGE_URL_ENV = "DENPEX_APPROVAL_PAGE_URL"
"""The approval page's address as approvers reach it (the workers' environment), for the links."""


class PageDecisionInput(RunInput):
    """What the approval page resumes the run with: its signed record. Nobody types it."""

    model_config = ConfigDict(extra="forbid")

    record: str = Field(max_length=20000, description="filled in by the approval page when a person decides "
                                                      "there (the link above); a record typed here is not trusted")


def page_url(run_id: str) -> str | None:
    """The page of run ``run_id`` on the approval page, or None when no address is configured."""
    base = os.environ.get(PAGE_URL_ENV, "").strip().rstrip("/")
    return f"{base}/runs/{run_id}" if base else None


_CLAIM_SLACK = timedelta(hours=1)
"""How long past its pause a run holds its incident if it never ends (crashed where Prefect cannot tell)."""


def claim_incident(plan: IsolationPlan, pause: timedelta) -> str | None:
    """Claim the plan's incident for this run (one question per incident at a time): None once
    claimed, else why not, naming the run that holds it.

    A second run (a manual start, a repeated alert, a follow-up) must not save its plan over the
    one an approver is reading, nor ask a second question about the same nodes. The claim is taken
    in one transaction before anything is saved, so two runs started together cannot both pass.
    A holder that Prefect has ended (crashed or cancelled while paused) is taken over; the claim
    of one that never says so lapses an hour after its ``pause`` would have timed out."""
    this_run = run_id()
    book = ApprovalBook(resolve_state_dir())
    key = (plan.tenant, plan.cluster or "", plan.incident_id)
    expires = time.time() + (pause + _CLAIM_SLACK).total_seconds()
    holder = book.claim(*key, run_id=this_run, expires_at=expires)
    if holder is None:
        return None
    state = _prefect_state(holder)
    if state is not None and state.is_final():
        holder = book.claim(*key, run_id=this_run, expires_at=expires, replacing=holder) or None
        if holder is None:
            return None
    known = "" if state is not None else " (Prefect could not say whether it still runs)"
    return (f"run {holder} already waits for a decision on incident {plan.incident_id}, or is about to ask"
            f"{known}; decide there. This run saved no plan and asks nothing")


def release_incident(plan: IsolationPlan) -> None:
    """Let go of the plan's incident, if this run claimed it."""
    ApprovalBook(resolve_state_dir()).release(plan.tenant, plan.cluster or "", plan.incident_id,
                                              run_id())


def _prefect_state(run_id: str) -> State | None:
    """The run's state in Prefect; None when it cannot be read (then the claim stands). A run
    Prefect no longer knows counts as ended."""
    from prefect import get_client
    from prefect.client.schemas.objects import State as PrefectState
    from prefect.client.schemas.objects import StateType
    from prefect.exceptions import ObjectNotFound

    try:
        with get_client(sync_client=True) as client:
            return client.read_flow_run(UUID(run_id)).state
    except ObjectNotFound:
        return PrefectState(type=StateType.COMPLETED, name="unknown to Prefect")
    except Exception:  # noqa: BLE001 - an unreachable or failing API, or a foreign id: the claim stands
        return None


def ask_on_page(plan: IsolationPlan, description: str, brief: ApprovalBrief, *, operation: Operation,
                policy: IsolationPolicy, runbook_file: Path, timeout: timedelta,
                poll: timedelta) -> ReviewedAnswer | None:
    """Register the run with the page, pause until it is resumed, and return the decision the
    page recorded for it (None: nobody decided within ``timeout``)."""
    this_run = run_id()
    folder = resolve_state_dir()
    book = ApprovalBook(folder)
    if book.decision(this_run) is not None:
        # A run started again after its decision (a forced state): the decision stands, once.
        earlier = _review(book, this_run, plan, operation, policy, folder, None)
        if earlier.verdict is AnswerVerdict.APPROVED:
            return ReviewedAnswer(verdict=AnswerVerdict.REFUSED, reason="approval refused, nothing was done: run "
                                  f"{this_run} was already decided and started again; a decision is taken once")
        return earlier
    brief_path = state_path(folder, "approvals", this_run, "brief.json")
    save_brief(brief, brief_path)
    now = time.time()
    plan_path = plan_file(folder, plan.tenant, plan.cluster or "", plan.incident_id)
    book.add_pending(PendingApproval(
        run_id=this_run, tenant=plan.tenant, cluster=plan.cluster or "", incident_id=plan.incident_id,
        operation=operation, plan_path=plan_path.relative_to(folder).as_posix(), plan_hash=plan.content_hash(),
        runbook=str(runbook_file.resolve()), brief_path=brief_path.relative_to(folder).as_posix(),
        created_at=now, expires_at=now + timeout.total_seconds()))
    link = page_url(this_run)
    where = f"[{inline(link, bare_links=True)}]({link})" if link else f"the approval page's `/runs/{this_run}` (set {PAGE_URL_ENV})"
    incident_log().info("waiting for a decision on the approval page: %s", link or f"/runs/{this_run}")
    form = PageDecisionInput.with_initial_data(
        description=f"**Decide on the approval page:** {where}\n\nThe page shows this plan and its evidence, "
                    "takes your second factor and signs your decision for this run; a resume from here proves "
                    f"nobody and runs nothing.\n\n{description}")
    try:
        answer = pause_flow_run(wait_for_input=form, timeout=int(timeout.total_seconds()),
                                poll_interval=max(1, int(poll.total_seconds())), key=uuid4().hex)
    except FlowPauseTimeout:
        return None
    except ValidationError:
        answer = None  # resumed with no valid input: the page's record decides all the same
    return _review(book, this_run, plan, operation, policy, folder, answer.record if answer else None)


def _review(book: ApprovalBook, run_id: str, plan: IsolationPlan, operation: Operation, policy: IsolationPolicy,
            folder: Path, submitted: str | None) -> ReviewedAnswer:
    keys = load_page_public_keys(page_public_key_path(os.environ, folder))
    return review_page_decision(book, run_id, plan, operation=operation, policy=policy, page_keys=keys,
                                submitted=submitted)
