"""The approval page's app, over a real state directory (a saved plan, a brief, the runbook, the
approvers' enrolled TOTP secrets, the audit log): who may decide, with which proof, once per run.

The Prefect API the page resumes runs through is not running here (the flow tests run it): the
page then says the decision is recorded but the run could not be resumed, which is what these
tests look past. Every request goes through the app's real routing, forms and cookies.
"""

from __future__ import annotations

import html
import re
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from denpex.approval_page.app import PageConfig, create_page_app
from denpex.approval_page.brief import build_brief, save_brief
from denpex.approval_page.decide import MAX_WRONG_FROM_ADDRESS, ApprovalDesk
from denpex.approval_page.resume import PrefectLink
from denpex.approval_page.store import ApprovalBook, PendingApproval
from denpex.isolation.approval import Approval
from denpex.isolation.audit import AuditKind
from denpex.isolation.ed25519_keys import generate_key
from denpex.isolation.operator import state_audit_log
from denpex.isolation.page_record import signature_verifies
from denpex.isolation.plan import IsolationPlan, Operation, save_plan, utc_now
from denpex.isolation.planner import plan_isolation
from denpex.isolation.policy import ApprovalChannel, ApprovalRule, IsolationPolicy, Scheduler, SecondFactor
from denpex.isolation.second_factor import MAX_WRONG_CODES, TotpStore
from denpex.report import TriageReport
from denpex.state_paths import plan_file
from isolation.trust import write_runbook
from lab.rig import xid79_on
from testkit.services.net import free_port

NODE = "gpu-node-002"
HOSTILE = '<img src=x onerror="alert(1)">'


class Rig:
    """A state directory with one run waiting, and the page over it."""

    def __init__(self, tmp: Path, second_factor: SecondFactor = SecondFactor.TOTP, proxies: tuple[str, ...] = (),
                 clock: Any = None) -> None:
        import ipaddress

        self.state = tmp / "state"
        self.policy = IsolationPolicy(approval=ApprovalRule(approvers=frozenset({"alice", "bob"}),
                                                            second_factor=second_factor, channels=frozenset(
                                                                {ApprovalChannel.CLI_SIGNED, ApprovalChannel.APPROVAL_PAGE})))
        self.runbook = write_runbook(tmp / "runbook.yaml", self.policy)
        self.codes = TotpStore(self.state)
        for name in ("alice", "bob", "mallory"):
            self.codes.enroll(name)
        self.key = generate_key()
        self.book = ApprovalBook(self.state)
        self.desk = ApprovalDesk(state_dir=self.state, book=self.book, key=self.key)
        self.app = create_page_app(PageConfig(
            desk=self.desk, prefect=PrefectLink(f"http://127.0.0.1:{free_port()}/api", timeout_s=0.5,
                                                 attempts=1),  # nothing listens: one try
            trusted_proxies=tuple(ipaddress.ip_network(p) for p in proxies),
            **({"clock": clock} if clock is not None else {})))

    def waiting_run(self, incident: str = "inc-page", *, expires_in: float = 600,
                    target: str = "") -> tuple[str, IsolationPlan]:
        result = xid79_on([NODE])
        culprit = result.candidates[0]
        hostile = culprit.model_copy(update={"reasons": [f"rank 1 stopped reporting {HOSTILE}", *culprit.reasons]})
        result = result.model_copy(update={"candidates": [hostile]})
        plan = plan_isolation(result, None, self.policy, None, Scheduler.SLURM, incident, result.as_of or utc_now(),
                              cluster="lab", tenant=None)
        path = plan_file(self.state, None, "lab", incident)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_plan(plan, path)
        run_id = str(uuid.uuid4())
        brief_path = self.state / "approvals" / run_id / "brief.json"
        save_brief(build_brief(plan, Operation.ISOLATE, report=TriageReport(**dict(result)), target=target), brief_path)
        now = time.time()
        self.book.add_pending(PendingApproval(
            run_id=run_id, tenant=None, cluster="lab", incident_id=incident, operation=Operation.ISOLATE,
            plan_path=path.relative_to(self.state).as_posix(), plan_hash=plan.content_hash(),
            runbook=str(self.runbook), brief_path=brief_path.relative_to(self.state).as_posix(), created_at=now,
            expires_at=now + expires_in))
        return run_id, plan

    def client(self, address: str = "10.1.2.3") -> TestClient:
        # As a browser that reached the page by its address (the page answers to no other name unlisted).
        return TestClient(self.app, base_url="http://127.0.0.1:8090", client=(address, 40000), follow_redirects=False)


def _token(client: TestClient, run_id: str) -> str:
    page = client.get(f"/runs/{run_id}")
    assert page.status_code == 200, page.text
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    # A page without a form (decided, timed out) still set the cookie a hand-made post would carry.
    return found.group(1) if found else str(client.cookies.get("denpex_csrf"))


def _shown(response: Any) -> str:
    """The page's text as a person reads it (entities decoded)."""
    return html.unescape(response.text)


def _post(client: TestClient, run_id: str, token: str | None = None, **fields: Any) -> Any:
    form = {"csrf": token if token is not None else _token(client, run_id), "decision": "approve",
            "nodes": [NODE], "comment": "Xid 79 on its GPU", **fields}
    return client.post(f"/runs/{run_id}/decision", data=form)


def test_the_page_shows_the_node_and_why_above_the_decision_and_escapes_the_evidence(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    run_id, plan = rig.waiting_run()
    page = rig.client().get(f"/runs/{run_id}")
    assert page.status_code == 200
    text = page.text
    # The node and the why come before the form; the code is marked required (issue 31 items 3, 4).
    assert text.index(f"<strong>{NODE}</strong> (drain)") < text.index("Why:") < text.index("<form")
    assert re.search(r'Code <span class="req">\(required\)</span>', text)
    assert 'name="code" id="code" inputmode="numeric" autocomplete="one-time-code" maxlength="32" required' in text
    assert f'href="/runs/{run_id}/report"' in text and plan.content_hash()[:12] in text
    # Evidence is shown as text, never as markup; no script may run at all.
    assert HOSTILE not in text and "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;" in text
    assert "script-src" not in page.headers["content-security-policy"]  # default-src 'none' covers scripts
    assert page.headers["content-security-policy"].startswith("default-src 'none'")
    assert "httponly" in page.headers["set-cookie"].lower() and "samesite=strict" in page.headers["set-cookie"].lower()
    report = rig.client().get(f"/runs/{run_id}/report")
    assert report.status_code == 200 and HOSTILE not in report.text and "EVIDENCE INCOMPLETE" in report.text
    assert rig.client().get(f"/runs/{uuid.uuid4()}").status_code == 404
    assert rig.client().get("/runs/..%2F..%2Fetc").status_code == 404


def test_the_page_says_where_the_approved_commands_go(tmp_path: Path) -> None:
    """Red team, issue 30: the target block (which an API writer may edit) decides where the drain
    commands go; the approver sees it beside the decision, as text."""
    rig = Rig(tmp_path)
    run_id, _ = rig.waiting_run(target=f"Slurm commands over SSH to root@10.0.0.5:22 {HOSTILE}")
    text = rig.client().get(f"/runs/{run_id}").text
    assert '<span class="label">Sent to:</span> Slurm commands over SSH to root@10.0.0.5:22' in text
    assert text.index("Sent to:") < text.index("<form") and HOSTILE not in text
    old, _ = rig.waiting_run("inc-old-brief")  # a brief saved before the line existed shows none
    assert "Sent to:" not in rig.client().get(f"/runs/{old}").text


def test_the_page_answers_only_to_its_own_names(tmp_path: Path) -> None:
    """Red team, issue 30: with no Host allowlist, a site rebinding its name to the page's address
    could post wrong codes from the approver's own browser and address. Addresses and localhost
    are always answered; any other name only when listed."""
    import ipaddress

    rig = Rig(tmp_path)
    run_id, _ = rig.waiting_run()
    rebound = TestClient(rig.app, base_url="http://evil.example:8090", client=("10.1.2.3", 40000))
    for response in (rebound.get("/"), rebound.get(f"/runs/{run_id}"), rebound.get("/healthz"),
                     rebound.post(f"/runs/{run_id}/decision", data={"approver": "alice", "code": "000000"})):
        assert response.status_code == 400 and "--allowed-host" in response.text
    assert rig.book.answers(run_id) == []  # no wrong code was counted
    for base in ("http://localhost:8090", "http://[::1]:8090", "http://10.0.0.5"):
        assert TestClient(rig.app, base_url=base).get("/").status_code == 200, base
    named = create_page_app(PageConfig(desk=rig.desk, prefect=PrefectLink("http://127.0.0.1:9/api", attempts=1),
                                       allowed_hosts=("approvals.example.com", "*.gpu.example.com"),
                                       trusted_proxies=(ipaddress.ip_network("10.0.0.2/32"),)))
    for base, status in (("http://approvals.example.com", 200), ("http://Approvals.Example.com.:443", 200),
                         ("http://page.gpu.example.com", 200), ("http://gpu.example.com", 400),
                         ("http://approvals.example.com.evil.example", 400)):
        assert TestClient(named, base_url=base).get("/").status_code == status, base
    # A trusted proxy's X-Forwarded-Host is held to the same names; anyone else's is not read.
    proxy = TestClient(named, base_url="http://10.0.0.9", client=("10.0.0.2", 40000))
    assert proxy.get("/", headers={"X-Forwarded-Host": "evil.example"}).status_code == 400
    assert proxy.get("/", headers={"X-Forwarded-Host": "approvals.example.com"}).status_code == 200
    # A list (one name per proxy on the way) is held name by name (hostile review).
    assert proxy.get("/", headers={"X-Forwarded-Host": "evil.example, x.gpu.example.com"}).status_code == 400


def test_an_approval_is_signed_recorded_once_and_audited_before_the_run_is_resumed(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    run_id, plan = rig.waiting_run()
    client = rig.client()
    token = _token(client, run_id)
    answer = _post(client, run_id, token, approver="alice", code=rig.codes.current_code("alice"))
    # Recorded; the run's Prefect API is not running here, so it says it could not resume it.
    assert answer.status_code == 200 and "approved by alice (totp)" in _shown(answer)
    assert "could not be resumed" in _shown(answer)
    record = Approval.model_validate(client.get(f"/runs/{run_id}/record").json())
    assert (record.channel.value, record.decision, record.flow_run_id, record.plan_hash, record.nodes) == (
        "approval-page", "approve", run_id, plan.content_hash(), (NODE,))
    assert record.second_factor == "totp" and record.approver == "alice" and record.comment == "Xid 79 on its GPU"
    assert signature_verifies(record, [rig.key.public_key()])
    assert not signature_verifies(record.model_copy(update={"decision": "reject"}), [rig.key.public_key()])
    assert "code" not in record.model_dump() and rig.codes.current_code("alice") not in record.model_dump_json()
    [decision] = [r for r in state_audit_log(rig.state).records() if r.incident_id == plan.incident_id]
    assert decision.kind is AuditKind.DECISION and decision.action == "approved" and decision.approver == "alice"
    assert decision.message == f"approved by alice on the approval page for run {run_id} (totp): Xid 79 on its GPU"
    # One decision per run: bob's rejection afterwards is refused, and the page shows the decision.
    later = _post(client, run_id, token, approver="bob", decision="reject", code=rig.codes.current_code("bob"))
    assert later.status_code == 409 and "already approved by alice" in _shown(later)
    assert "Approved by alice" in client.get(f"/runs/{run_id}").text
    assert [a.outcome for a in rig.book.answers(run_id)] == ["recorded", "already_decided"]


def test_a_rejection_needs_the_same_proof_and_is_signed(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    run_id, _ = rig.waiting_run()
    client = rig.client()
    unproven = _post(client, run_id, approver="bob", decision="reject", code="")
    assert unproven.status_code == 403 and "requires bob's current TOTP code" in _shown(unproven)
    assert rig.book.decision(run_id) is None
    rejected = _post(client, run_id, approver="bob", decision="reject", code=rig.codes.current_code("bob"),
                     comment="the job owner is debugging")
    assert rejected.status_code == 200
    record = rig.book.decision(run_id)
    assert record is not None and record.decision == "reject" and record.expires_at == record.approved_at
    assert signature_verifies(record, [rig.key.public_key()])


@pytest.mark.parametrize("change, status, why", [
    ({"approver": "mallory"}, 403, "'mallory' may not decide for tenant (none) on cluster lab (alice, bob"),
    ({"nodes": ["gpu-node-009"]}, 403, "gpu-node-009 not in the plan (gpu-node-002)"),
    ({"nodes": []}, 403, "choose at least one node to approve"),
    ({"decision": "maybe"}, 422, "the answer is not complete: decision"),
], ids=["not-an-approver", "foreign-node", "no-node", "bad-decision"])
def test_a_refused_answer_records_nothing_and_spends_no_code(tmp_path: Path, change: dict[str, Any], status: int,
                                                           why: str) -> None:
    rig = Rig(tmp_path)
    run_id, _ = rig.waiting_run()
    code = rig.codes.current_code(str(change.get("approver", "alice")))
    refused = _post(rig.client(), run_id, **{"approver": "alice", "code": code, **change})
    assert refused.status_code == status and why in _shown(refused), refused.text
    assert rig.book.decision(run_id) is None
    assert rig.codes.check("alice", rig.codes.current_code("alice")).accepted  # alice's code was not spent


def test_a_runbook_that_does_not_list_the_page_takes_no_decision_from_it(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    write_runbook(rig.runbook, rig.policy.model_copy(update={"approval": rig.policy.approval.model_copy(
        update={"channels": frozenset({ApprovalChannel.CLI_SIGNED})})}))
    run_id, _ = rig.waiting_run()
    refused = _post(rig.client(), run_id, approver="alice", code=rig.codes.current_code("alice"))
    assert refused.status_code == 403 and "does not accept approvals from this page" in _shown(refused)
    assert rig.book.decision(run_id) is None


def test_forms_from_elsewhere_are_refused(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    run_id, _ = rig.waiting_run()
    client = rig.client()
    token = _token(client, run_id)
    fresh = rig.client()  # another browser: no cookie of this page
    code = rig.codes.current_code("alice")
    assert _post(fresh, run_id, token=token, approver="alice", code=code).status_code == 403
    assert _post(client, run_id, token="forged", approver="alice", code=code).status_code == 403
    for origin in ("https://evil.example", "null"):  # "null": a sandboxed frame, a page with no-referrer
        cross = client.post(f"/runs/{run_id}/decision", headers={"Origin": origin},
                            data={"csrf": token, "decision": "approve", "nodes": [NODE], "approver": "alice",
                                  "code": code})
        assert cross.status_code == 403 and "CSRF" in _shown(cross)
    # Its own pages send their origin with the post (a browser sends "null" under no-referrer).
    assert client.get(f"/runs/{run_id}").headers["referrer-policy"] == "same-origin"
    assert rig.book.decision(run_id) is None and rig.book.answers(run_id) == []


def test_wrong_codes_lock_out_the_approver_and_the_address(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    run_id, _ = rig.waiting_run()
    client = rig.client("10.9.9.9")
    for _ in range(MAX_WRONG_CODES):
        wrong = _post(client, run_id, approver="alice", code="000000")
        assert wrong.status_code == 403 and "not alice's current code" in _shown(wrong)
    locked = _post(client, run_id, approver="alice", code=rig.codes.current_code("alice"))
    assert locked.status_code == 429 and "wrong codes for alice" in _shown(locked)
    # The same address guessing across approvers is refused as a whole past its own bound.
    for _ in range(MAX_WRONG_FROM_ADDRESS - MAX_WRONG_CODES):
        _post(client, run_id, approver="bob", code="000000")
    blocked = _post(client, run_id, approver="bob", code=rig.codes.current_code("bob"))
    assert blocked.status_code == 429 and "too many wrong codes from 10.9.9.9" in _shown(blocked)
    assert rig.book.decision(run_id) is None
    assert [a.outcome for a in rig.book.answers(run_id)].count("wrong_code") == MAX_WRONG_FROM_ADDRESS


def test_a_full_answer_log_does_not_switch_the_address_lockout_off(tmp_path: Path) -> None:
    """Red team, issue 30: answers refused before any code is checked filled the run's log to its
    cap, after which wrong codes were no longer kept, so the address lockout never counted them."""
    from denpex.approval_page.store import MAX_ANSWERS_PER_RUN, StoredAnswer

    rig = Rig(tmp_path)
    run_id, _ = rig.waiting_run()
    for n in range(MAX_ANSWERS_PER_RUN):  # as the attacker's refused posts left them
        rig.book.record_answer(StoredAnswer(run_id=run_id, at=time.time(), address="10.9.9.9",
                                            approver=f"mallory{n}", decision="approve", outcome="refused",
                                            reason="not an approver"))
    client = rig.client("10.9.9.9")
    for _ in range(MAX_WRONG_CODES):
        _post(client, run_id, approver="alice", code="000000")
    for _ in range(MAX_WRONG_FROM_ADDRESS - MAX_WRONG_CODES):
        _post(client, run_id, approver="bob", code="000000")
    assert [a.outcome for a in rig.book.answers(run_id)].count("wrong_code") == MAX_WRONG_FROM_ADDRESS
    blocked = _post(client, run_id, approver="bob", code=rig.codes.current_code("bob"))
    assert blocked.status_code == 429 and "too many wrong codes from 10.9.9.9" in _shown(blocked)
    assert rig.book.decision(run_id) is None


def test_a_strangers_wrong_codes_do_not_lock_the_approver_out_of_their_own_address(tmp_path: Path) -> None:
    from datetime import UTC, datetime

    now = [time.time()]
    rig = Rig(tmp_path, clock=lambda: datetime.fromtimestamp(now[0], UTC))
    first, _ = rig.waiting_run("inc-first")
    desk = rig.client("10.0.0.7")
    assert _post(desk, first, approver="alice", code=rig.codes.current_code("alice", at=now[0])).status_code != 403
    assert rig.book.decision(first) is not None
    second, _ = rig.waiting_run("inc-second")
    stranger = rig.client("10.6.6.6")
    for _ in range(MAX_WRONG_CODES + 2):  # more than the approver's bound, within the address's own
        now[0] += 1
        assert _post(stranger, second, approver="alice", code="000000").status_code in (403, 429)
    now[0] += 60  # alice's next code
    code = rig.codes.current_code("alice", at=now[0])
    elsewhere = _post(rig.client("10.0.0.8"), second, approver="alice", code=code)
    assert elsewhere.status_code == 429 and "wrong codes for alice" in _shown(elsewhere)
    answered = _post(desk, second, approver="alice", code=code)
    record = rig.book.decision(second)
    assert record is not None, (answered.status_code, re.findall(r"\d+ wrong codes[^<]*", _shown(answered)))
    assert record.approver == "alice"


def test_an_approver_the_proxy_signed_in_is_not_locked_out_by_a_strangers_codes(tmp_path: Path) -> None:
    rig = Rig(tmp_path, proxies=("10.0.0.2/32",))  # TOTP still required, behind the proxy
    run_id, _ = rig.waiting_run()
    stranger = rig.client("10.6.6.6")
    for _ in range(MAX_WRONG_CODES):
        _post(stranger, run_id, approver="alice", code="000000")
    code = rig.codes.current_code("alice")
    assert _post(stranger, run_id, approver="alice", code=code).status_code == 429
    proxy = rig.client("10.0.0.2")  # alice's first answer ever, signed in at the proxy
    proxy.headers.update({"X-Forwarded-User": "alice", "X-Forwarded-For": "10.0.0.9"})
    answered = _post(proxy, run_id, approver="", code=code)
    record = rig.book.decision(run_id)
    assert record is not None and (record.approver, record.second_factor) == ("alice", "totp"), _shown(answered)


def test_an_authenticating_proxys_identity_counts_only_from_its_address(tmp_path: Path) -> None:
    rig = Rig(tmp_path, SecondFactor.PROXY, proxies=("10.0.0.2/32",))
    run_id, _ = rig.waiting_run()
    stranger = rig.client("10.7.7.7")
    token = _token(stranger, run_id)
    spoofed = stranger.post(f"/runs/{run_id}/decision", headers={"X-Forwarded-User": "alice"},
                            data={"csrf": token, "decision": "approve", "nodes": [NODE], "approver": "alice"})
    assert spoofed.status_code == 403 and "did not come through it" in _shown(spoofed)
    proxy = rig.client("10.0.0.2")
    proxy.headers["X-Forwarded-User"] = "bob"
    assert "signed in through the authenticating proxy" in proxy.get(f"/runs/{run_id}").text
    claimed = _post(proxy, run_id, approver="alice")
    assert claimed.status_code == 403 and "the authenticating proxy says you are 'bob', not 'alice'" in _shown(claimed)
    assert _post(proxy, run_id, approver="").status_code == 200
    record = rig.book.decision(run_id)
    assert record is not None and (record.approver, record.second_factor) == ("bob", "proxy")


def test_no_decision_after_the_pause_timed_out(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    run_id, _ = rig.waiting_run(expires_in=-1)
    late = _post(rig.client(), run_id, approver="alice", code=rig.codes.current_code("alice"))
    assert late.status_code == 410 and rig.book.decision(run_id) is None
    assert "timed out" in rig.client().get(f"/runs/{run_id}").text
    assert rig.client().get("/").status_code == 200 and run_id not in rig.client().get("/").text


def test_the_index_lists_the_runs_waiting(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    run_id, _ = rig.waiting_run()
    listed = rig.client().get("/")
    assert f'href="/runs/{run_id}"' in _shown(listed) and "inc-page" in _shown(listed)
    # Prefect is not running here: nothing is hidden, and the page says it could not check.
    assert "could not be asked which of these runs have ended" in _shown(listed)
    assert rig.client().get("/public-key").text.strip() == __import__("denpex.isolation.ed25519_keys").isolation.\
        ed25519_keys.public_key_text(rig.key)


@pytest.mark.parametrize("proxy", ["10.0.0.2/32", "127.0.0.1/32"])
def test_the_served_page_takes_the_callers_address_from_the_connection_not_x_forwarded_for(
        tmp_path: Path, proxy: str) -> None:
    """Red team, issue 30: uvicorn's defaults let a loopback caller's X-Forwarded-For replace its
    address, so `X-Forwarded-For: <the proxy>` from any local process passed for the proxy, and a
    proxy on the same host was never believed. The real `serve-approvals` process, both ways."""
    import httpx

    from testkit.services.approval_page import approval_page

    rig = Rig(tmp_path, SecondFactor.PROXY, proxies=(proxy,))
    run_id, _ = rig.waiting_run()
    with approval_page(rig.state, f"http://127.0.0.1:{free_port()}/api", log=tmp_path / "page.log",
                       extra_args=["--trusted-proxy", proxy]) as page, httpx.Client(base_url=page.url) as client:
        seen = client.get(f"/runs/{run_id}", headers={"X-Forwarded-For": "10.0.0.2, 10.0.0.2",
                                                       "X-Forwarded-User": "alice"})
    assert seen.status_code == 200, seen.text
    # From loopback: the proxy only when loopback is the configured proxy, whatever the header says.
    assert ("signed in through the authenticating proxy" in seen.text) == (proxy == "127.0.0.1/32")


def _closed_by_peer(sock: Any) -> bool:
    """A readable socket's end: EOF, or a reset (a byte sent after the server closed is answered
    with RST, which can arrive before our read of the EOF: CI saw it once)."""
    try:
        return sock.recv(4096) == b""
    except ConnectionResetError:
        return True


def test_the_served_page_closes_a_connection_whose_request_head_is_late(tmp_path: Path) -> None:
    """Red team, issue 30: idle sockets held every one of uvicorn's connection slots, so the page
    (and `serve-api`, which serves the same way: denpex.http_serving) answered everyone 503. Now
    a connection that sends nothing, or dribbles its head, is closed; a prompt one is served."""
    import select
    import socket

    import httpx

    from denpex.http_serving import HEADER_DEADLINE_S
    from testkit.services.approval_page import approval_page

    with approval_page(tmp_path / "state", f"http://127.0.0.1:{free_port()}/api", log=tmp_path / "page.log") as page:
        port = int(page.url.rsplit(":", 1)[1])
        idle, dribbling = socket.create_connection(("127.0.0.1", port)), socket.create_connection(("127.0.0.1", port))
        dribbling.sendall(b"GET /healthz HTTP/1.1\r\n")
        opened, closed = time.monotonic(), set()
        # Wait for the server's close (EOF), a header byte a second on one; bounded for a loaded machine.
        while len(closed) < 2 and time.monotonic() - opened < HEADER_DEADLINE_S + 100:
            if dribbling not in closed:
                try:
                    dribbling.sendall(b"X")
                except OSError:
                    closed.add(dribbling)
            ready, _, _ = select.select([s for s in (idle, dribbling) if s not in closed], [], [], 1.0)
            closed.update(s for s in ready if _closed_by_peer(s))
        took = time.monotonic() - opened
        assert closed == {idle, dribbling}, f"still open after {took:.0f} s"
        assert took >= HEADER_DEADLINE_S - 1
        assert httpx.get(f"{page.url}/healthz", timeout=30).status_code == 200
        idle.close()
        dribbling.close()


def test_the_served_page_bounds_the_connections_one_address_holds(tmp_path: Path) -> None:
    """Red team, issue 30 (A3): with the head deadline alone, one stranger could still open every
    slot afresh each 20 s. One address now holds at most its share; the next connection from it is
    answered 503 at once, while another address is served, and a slot freed is usable again."""
    import socket

    import httpx

    from testkit.services.approval_page import approval_page

    cap = 4
    with approval_page(tmp_path / "state", f"http://127.0.0.1:{free_port()}/api", log=tmp_path / "page.log",
                       extra_args=["--max-connections-per-address", str(cap)]) as page:
        port = int(page.url.rsplit(":", 1)[1])
        held = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(cap)]
        refused = socket.create_connection(("127.0.0.1", port), timeout=30)
        answer = b""
        while chunk := refused.recv(4096):  # the server writes its answer and closes
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 503") and b"4 connections from 127.0.0.1" in answer, answer
        # Another address (all of 127/8 is loopback) is served while 127.0.0.1 is at its bound.
        other = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"), timeout=30)
        assert other.get(f"{page.url}/healthz").status_code == 200
        held.pop().close()
        freed = httpx.get(f"{page.url}/healthz", timeout=30)  # the closed slot is counted out
        assert freed.status_code == 200
        for sock in held:
            sock.close()
        # WebSocket upgrades are not served: each is an ordinary request, and its close counted out
        # (an upgrade once handed the connection to a protocol whose close was never counted).
        upgrade = {"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
                   "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
        for _ in range(cap + 1):
            with httpx.Client(timeout=30) as fresh:
                assert fresh.get(f"{page.url}/healthz", headers=upgrade).status_code == 200
        assert httpx.get(f"{page.url}/healthz", timeout=30).status_code == 200
        other.close()


@pytest.mark.parametrize(("peer", "counted_as"), [
    ("10.1.2.3", "10.1.2.3"),
    ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),  # one host is usually given a whole /64
    ("2001:db8:1:2:ffff::9", "2001:db8:1:2::/64"),
    ("::ffff:10.1.2.3", "10.1.2.3"),  # an IPv4 client on a dual-stack socket
    ("not-an-address", "not-an-address"),
])
def test_a_client_is_counted_by_its_address_or_its_ipv6_64(peer: str, counted_as: str) -> None:
    from denpex.http_serving import address_key

    assert address_key(peer) == counted_as
