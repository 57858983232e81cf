"""The approval page's HTTP app (``denpex serve-approvals``).

Endpoints (docs/contracts.md "Approvals"):

- ``GET /`` the runs waiting for a decision; ``GET /healthz``; ``GET /public-key`` the page's
  ed25519 public key (one base64 line);
- ``GET /runs/{run_id}`` the brief (node and why right above the decision, charts) and the form;
- ``GET /runs/{run_id}/report`` the full report, from the brief the flow saved;
- ``POST /runs/{run_id}/decision`` (form: ``csrf``, ``decision``, ``nodes``, ``approver``,
  ``code``, ``comment``) takes the run's one decision, then resumes the run with the record;
- ``GET /runs/{run_id}/record`` the run's signed decision record (JSON), once there is one.

Who asks: the approver's TOTP code proves them; an authenticating proxy's identity header is
read only from the configured proxy addresses, and ignored from any other. Forms carry a CSRF
token that must equal the page's cookie (``SameSite=Strict``), and a cross-origin ``Origin`` is
refused. Nothing the page renders is trusted: it is escaped (Jinja2 autoescape), and no script
runs (``Content-Security-Policy: script-src 'none'``).
"""

from __future__ import annotations

import ipaddress
import re
import secrets
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from denpex.approval_page.brief import ApprovalBrief, load_brief
from denpex.approval_page.decide import ApprovalDesk, PageAnswer, PageOutcome, take_decision
from denpex.approval_page.hosts import host_allowed
from denpex.approval_page.resume import PrefectLink, ended_runs, resume_run
from denpex.approval_page.store import PendingApproval
from denpex.evidence.loading import validation_problems
from denpex.isolation.ed25519_keys import public_key_text
from denpex.isolation.errors import IsolationError
from denpex.isolation.plan import Operation
from denpex.isolation.policy import IsolationPolicy, SecondFactor
from denpex.isolation.runbook import load_runbook
from denpex.report import render_text
from denpex.state_paths import state_path

__all__ = ["PageConfig", "create_page_app", "CSRF_COOKIE"]

CSRF_COOKIE = "denpex_csrf"
_RUN_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_MAX_FORM_BYTES = 64 * 1024
_CHARTS_ON_PAGE = 2
# Referrer-Policy same-origin, not no-referrer: with no-referrer a browser sends ``Origin: null`` on
# the form's own post, which the origin check must refuse; other sites still get no referrer.
_HEADERS = {"Content-Security-Policy": "default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
                                      "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
            "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin", "Cache-Control": "no-store",
            "X-Frame-Options": "DENY"}


class _EndedRuns:
    """``ended_runs``, each answer kept a few seconds: every visitor's view asks Prefect, and a
    crowd of anonymous ones must not make each approver's view wait on it again."""

    KEEP_S = 5.0

    def __init__(self) -> None:
        self._kept: dict[tuple[str, ...], tuple[float, dict[str, str] | None]] = {}

    def __call__(self, prefect: PrefectLink, run_ids: list[str]) -> dict[str, str] | None:
        key = tuple(sorted(run_ids))
        kept = self._kept.get(key)
        if kept is not None and time.monotonic() - kept[0] < self.KEEP_S:
            return kept[1]
        ended = ended_runs(prefect, run_ids)
        if len(self._kept) > 256:
            self._kept.clear()
        self._kept[key] = (time.monotonic(), ended)
        return ended


@dataclass(frozen=True)
class PageConfig:
    """Everything the page runs with."""

    desk: ApprovalDesk
    prefect: PrefectLink
    trusted_proxies: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    identity_header: str = "X-Forwarded-User"
    prefect_ui_url: str | None = None
    """Where the Prefect UI is, for a link to the run (the run stays seen there)."""
    clock: Any = field(default=lambda: datetime.now(UTC))
    ended_runs: _EndedRuns = field(default_factory=_EndedRuns, compare=False)
    allowed_hosts: tuple[str, ...] = ()
    """Names the page answers to besides IP addresses and ``localhost`` (``hosts.host_allowed``)."""


def create_page_app(config: PageConfig) -> FastAPI:
    """The page's app over ``config``."""
    app = FastAPI(title="Denpex approvals", docs_url=None, redoc_url=None, openapi_url=None)
    templates = Environment(loader=PackageLoader("denpex.approval_page", "templates"),
                            autoescape=select_autoescape(default=True, default_for_string=True))
    desk = config.desk

    def page(name: str, status: int = 200, **values: Any) -> HTMLResponse:
        response = HTMLResponse(templates.get_template(name).render(**values), status_code=status, headers=_HEADERS)
        if values.get("csrf"):  # the form's token, and the cookie it must equal
            response.set_cookie(CSRF_COOKIE, values["csrf"], httponly=True, samesite="strict", path="/")
        return response

    def refused(title: str, message: str, status: int) -> HTMLResponse:
        return page("message.html", status, title=title, message=message)

    @app.middleware("http")
    async def only_its_own_names(request: Request, call_next: Any) -> Response:
        # Before any route: a rebound name must not reach the form, the codes' allowance or the list.
        if not all(host_allowed(h, config.allowed_hosts) for h in _hosts_named(config, request)):
            return PlainTextResponse("this page does not answer to that host name (serve-approvals "
                                     "--allowed-host lists the names it does)\n", status_code=400, headers=_HEADERS)
        response: Response = await call_next(request)
        return response

    @app.get("/healthz")
    async def health() -> JSONResponse:
        return JSONResponse({"ok": True})

    @app.get("/public-key")
    async def public_key() -> PlainTextResponse:
        return PlainTextResponse(public_key_text(desk.key) + "\n", headers=_HEADERS)

    @app.get("/")
    async def index() -> HTMLResponse:
        waiting = await run_in_threadpool(desk.book.waiting)
        ended = await run_in_threadpool(config.ended_runs, config.prefect, [p.run_id for p in waiting])
        rows = [{"run_id": p.run_id, "incident_id": p.incident_id, "cluster": p.cluster, "operation": p.operation,
                 "since": datetime.fromtimestamp(p.created_at, UTC).strftime("%Y-%m-%d %H:%M:%S")}
                for p in waiting if ended is None or p.run_id not in ended]
        return page("index.html", title="Runs waiting", waiting=rows, unchecked=ended is None)

    @app.get("/runs/{run_id}")
    async def run_page(run_id: str, request: Request) -> Response:
        found = await run_in_threadpool(_pending_brief, desk, run_id)
        if isinstance(found, str):
            return refused("Not found", found, 404)
        pending, brief, policy = found
        csrf = request.cookies.get(CSRF_COOKIE) or secrets.token_urlsafe(32)
        return page("run.html", **await run_in_threadpool(
            _run_view, config, pending, brief, policy, csrf=csrf, identity=_identity(config, request)))

    @app.get("/runs/{run_id}/report")
    async def report_page(run_id: str) -> Response:
        found = await run_in_threadpool(_pending_brief, desk, run_id)
        if isinstance(found, str):
            return refused("Not found", found, 404)
        _, brief, _ = found
        stacks = [{"rank": c.rank, "source": c.stack.source.value,
                   "frames": "\n".join(f"{f.file}:{f.line} {f.function}()" for f in (c.stack.all_frames or c.stack.frames))}
                  for c in (brief.report.candidates if brief.report else []) if c.stack is not None][:3]
        return page("report.html", title=brief.headline, run_id=run_id, brief=brief,
                    text=render_text(brief.report) if brief.report else "", stacks=stacks)

    @app.get("/runs/{run_id}/record")
    async def record(run_id: str) -> Response:
        decided = await run_in_threadpool(desk.book.decision, run_id) if _RUN_ID.fullmatch(run_id) else None
        if decided is None:
            return JSONResponse({"error": "this run has no decision recorded"}, status_code=404, headers=_HEADERS)
        return JSONResponse(decided.model_dump(mode="json"), headers=_HEADERS)

    @app.post("/runs/{run_id}/decision")
    async def decide(run_id: str, request: Request) -> Response:
        if not _RUN_ID.fullmatch(run_id):
            return refused("Not found", "no run waits for a decision under this id", 404)
        if int(request.headers.get("content-length") or _MAX_FORM_BYTES + 1) > _MAX_FORM_BYTES:
            return refused("Refused", "the form is too large (or its length was not sent)", 413)
        form = await request.form()
        token = str(form.get("csrf") or "")
        cookie = request.cookies.get(CSRF_COOKIE) or ""
        if not cookie or not secrets.compare_digest(token.encode(), cookie.encode()) or not _same_origin(config, request):
            return refused("Refused", "the form did not come from this page (CSRF check); open the run's page and "
                                      "answer there", 403)
        try:
            answer = PageAnswer.model_validate({
                "decision": str(form.get("decision") or ""), "nodes": [str(n) for n in form.getlist("nodes")],
                "approver": str(form.get("approver") or ""), "code": str(form.get("code") or ""),
                "comment": str(form.get("comment") or "")})
        except ValidationError as exc:
            problem = validation_problems(exc)
            return await _form_again(config, page, run_id, cookie, request, f"the answer is not complete: {problem}", 422)
        verdict = await run_in_threadpool(take_decision, desk, run_id, answer, identity=_identity(config, request),
                                          address=_address(config, request), now=config.clock())
        if verdict.outcome is not PageOutcome.RECORDED or verdict.record is None:
            return await _form_again(config, page, run_id, cookie, request, verdict.reason, verdict.status)
        resumed = await run_in_threadpool(resume_run, config.prefect, verdict.record)
        note = ("The run was resumed with the signed decision." if resumed.resumed else
                f"The decision is recorded, but the run could not be resumed: {resumed.message}. Nothing runs "
                "without it; the run's pause times out.")
        return page("message.html", title="Decision recorded", message=f"{verdict.reason}. {note}") \
            if not resumed.resumed else Response(status_code=303, headers={**_HEADERS, "Location": f"/runs/{run_id}"})

    return app


async def _form_again(config: PageConfig, page: Any, run_id: str, csrf: str, request: Request, problem: str,
                      status: int) -> Response:
    """The run's page again, with what was wrong above the form."""
    found = await run_in_threadpool(_pending_brief, config.desk, run_id)
    if isinstance(found, str):
        return page("message.html", status, title="Refused", message=problem)
    pending, brief, policy = found
    view = await run_in_threadpool(_run_view, config, pending, brief, policy, csrf=csrf,
                                   identity=_identity(config, request))
    response: Response = page("run.html", status, **{**view, "problem": problem})
    return response


def _pending_brief(desk: ApprovalDesk, run_id: str) -> tuple[PendingApproval, ApprovalBrief, IsolationPolicy] | str:
    """The waiting run, its brief and its runbook's policy; or why the page cannot show it."""
    pending = desk.book.pending(run_id) if _RUN_ID.fullmatch(run_id) else None
    if pending is None:
        return "no run waits for a decision under this id (open the link from the paused run)"
    try:
        brief = load_brief(state_path(desk.state_dir, *pending.brief_path.split("/")))
        policy = load_runbook(Path(pending.runbook)).policy()
    except (ValueError, IsolationError) as exc:
        return f"the run's brief or runbook cannot be read: {exc}"
    return pending, brief, policy


def _run_view(config: PageConfig, pending: PendingApproval, brief: ApprovalBrief, policy: IsolationPolicy, *,
              csrf: str, identity: str | None) -> dict[str, Any]:
    desk = config.desk
    decided = desk.book.decision(pending.run_id)
    now = config.clock().timestamp()
    verb = {Operation.ISOLATE: "isolate", Operation.ROLLBACK: "return to service",
            Operation.REQUEUE: "requeue the hung job on"}[pending.operation]
    nodes = ", ".join(n.node for n in brief.nodes) or "no node"
    charts = brief.charts[:_CHARTS_ON_PAGE]
    did = None
    if decided is not None:
        did = (f"{'Approved' if decided.decision == 'approve' else 'Rejected'} by {decided.approver} at "
               f"{decided.approved_at.isoformat()} ({decided.second_factor}): {decided.comment or 'no comment'}. "
               "A run takes one decision.")
    prefect_url = f"{config.prefect_ui_url.rstrip('/')}/runs/flow-run/{pending.run_id}" if config.prefect_ui_url else None
    return {"title": brief.headline, "question": f"{verb.capitalize()} {nodes}?", "run_id": pending.run_id,
            "brief": brief, "verb": verb, "csrf": csrf, "identity": identity, "decided": did,
            "closed": None if decided is not None else _closed(config, pending, now),
            "approvers": sorted(policy.approval.approvers_for(brief.tenant, brief.cluster or None)),
            "code_required": policy.approval.second_factor is SecondFactor.TOTP,
            "shown_charts": charts, "more_charts": len(brief.charts) - len(charts), "prefect_run_url": prefect_url,
            "problem": None}


def _closed(config: PageConfig, pending: PendingApproval, now: float) -> str | None:
    """Why an undecided run takes no decision any more (its pause timed out, or Prefect ended it);
    None if it may."""
    if pending.expires_at <= now:
        return "The run's wait for approval has timed out; nothing runs."
    ended = config.ended_runs(config.prefect, [pending.run_id]) or {}
    if pending.run_id in ended:
        return f"The run has ended in Prefect ({ended[pending.run_id]}); it waits for no decision, and nothing runs."
    return None


def _from_trusted_proxy(config: PageConfig, request: Request) -> bool:
    if request.client is None or not config.trusted_proxies:
        return False
    try:
        address = ipaddress.ip_address(request.client.host)
    except ValueError:
        return False
    return any(address in network for network in config.trusted_proxies)


def _identity(config: PageConfig, request: Request) -> str | None:
    """Who the authenticating proxy says asks; None unless the request came from a trusted proxy."""
    if not _from_trusted_proxy(config, request):
        return None
    value = request.headers.get(config.identity_header, "").strip()
    return value[:200] or None


def _address(config: PageConfig, request: Request) -> str:
    """The client's address, for the lockout: the proxy's last hop when a trusted proxy forwarded it."""
    if _from_trusted_proxy(config, request):
        forwarded = request.headers.get("x-forwarded-for", "").split(",")[-1].strip()
        if forwarded:
            return forwarded[:64]
    return request.client.host if request.client else "unknown"


def _hosts_named(config: PageConfig, request: Request) -> list[str]:
    """The request's ``Host``, and the name a trusted proxy says the browser asked for."""
    named = [request.headers.get("host", "")]
    if _from_trusted_proxy(config, request) and "x-forwarded-host" in request.headers:
        named += request.headers["x-forwarded-host"].split(",")  # each proxy on the way adds one
    return named


def _same_origin(config: PageConfig, request: Request) -> bool:
    """A browser sends ``Origin`` with a form post; it must name this page's own host (as a
    trusted proxy forwarded it, else the request's ``Host``)."""
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return origin is None
    forwarded = request.headers.get("x-forwarded-host") if _from_trusted_proxy(config, request) else None
    host = forwarded or request.headers.get("host", "")
    return origin.split("://", 1)[-1].rstrip("/") == host
