"""The incident flow on the real Prefect engine, real moto S3 (HTTP), real Slurm over real SSH.

The approve path starts from the alert event (the deployment trigger), pauses, is resumed through
the API with an approval, and drains the culprit's node; every other answer leaves the cluster
untouched, with the reason in the report, the audit log and the event feed.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from denpex.isolation.audit import AuditKind
from flow_driver import (
    CULPRIT_NODE,
    CULPRIT_STACK,
    FlowRig,
    alert,
    evidence_prefix,
    find_run,
    fire,
    form_texts,
    keyed_audit_log,
    manifest_with_gpus,
    report_of,
    resume,
    saved_plan,
    start_manual,
    state_message,
    wait_for,
    withheld_one_stacks,
    xid79_log,
)
from conftest import FIXTURES, register_blocks, upload
from lab.rig import drained, drained_nodes, reason_of
from testkit.services.slurm import SlurmLab

# Sized to what it starts: the harness server, served flows and the Slurm lab; runs wait for approval timeouts.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SCENARIO = FIXTURES / "withheld_one"


def _evidence(rig: FlowRig, incident: str, *, ranks: set[int] | None = None) -> str:
    return upload(rig.s3_endpoint, evidence_prefix(incident), SCENARIO, ranks=ranks,
                  extra={"manifest.json": manifest_with_gpus(SCENARIO), "kernel.log": xid79_log(),
                         **withheld_one_stacks()})


def _event_names(incident_id: str, wanted: set[str], *, timeout_s: float = 30) -> set[str]:
    """The incident's event names, once ``wanted`` are all in (events reach the feed asynchronously)."""
    from prefect import get_client
    from prefect.events.filters import EventFilter, EventResourceFilter

    query = {"filter": EventFilter(resource=EventResourceFilter(id=[f"denpex.incident.{incident_id}"]))
             .model_dump(mode="json"), "limit": 50}
    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while True:
            names = {e["event"] for e in client.request("POST", "/events/filter", json=query).json()["events"]}
            if wanted <= names or time.monotonic() > deadline:
                return names
            time.sleep(0.5)


def _decisions(rig: FlowRig, incident_id: str) -> list[str]:
    # Checked with the key, as the next approved drain checks it: a decision written without the
    # key once made that drain refuse the whole log.
    return [r.message for r in keyed_audit_log(rig.state_dir).records()
            if r.incident_id == incident_id and r.kind is AuditKind.DECISION]


class _Receiver(BaseHTTPRequestHandler):
    """A Slack-compatible incoming webhook on loopback."""

    messages: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        _Receiver.messages.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def approvers_webhook() -> Iterator[list[dict[str, Any]]]:
    from blocks import DenpexApprovalWebhook

    _Receiver.messages = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    DenpexApprovalWebhook(url=f"http://127.0.0.1:{server.server_address[1]}/hooks/T1/B1/x").save(
        "approvers", overwrite=True)
    try:
        yield _Receiver.messages
    finally:
        DenpexApprovalWebhook.delete("approvers")
        server.shutdown()
        server.server_close()


def _artifacts(run_id: Any) -> dict[str, Any]:
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run_id])))
    return {a.key: a for a in found if a.key}


@contextmanager
def _runbook(lab: SlurmLab, name: str) -> Iterator[None]:
    """The flows run runbook ``name`` inside the block, the rig's own after it."""
    register_blocks(lab, runbook=name)
    try:
        yield
    finally:
        register_blocks(lab)


def _artifact_keys(run_id: Any) -> set[str]:
    return set(_artifacts(run_id))


def test_alert_event_to_drain_on_approval(flow_rig: FlowRig, lab: SlurmLab,
                                          approvers_webhook: list[dict[str, Any]]) -> None:
    incident = "inc-approve"
    fire(flow_rig.api_url, alert(incident, _evidence(flow_rig, incident)))
    run_id = find_run(incident)
    assert wait_for(run_id, {"PAUSED"}) == "PAUSED"
    [notice] = approvers_webhook
    assert "waits for approval: drain gpu-node-003" in notice["text"]
    assert notice["text"].rstrip().endswith(f"{flow_rig.page_url}/runs/{run_id}")  # the approval page's link
    keys = _artifact_keys(run_id)
    assert {f"denpex-{incident}-coverage", f"denpex-{incident}-report"} <= keys
    # One report, the run's own artifact (listed first, under "Flow run"), holding the candidates
    # and the charts that were once artifacts of their own (issue 31).
    assert not [k for k in keys if k.endswith("-candidates") or "-chart-" in k], keys
    plan = saved_plan(flow_rig.state_dir, incident)
    assert [(a.node, a.action.value) for a in plan.actions] == [(CULPRIT_NODE, "drain")]
    assert drained_nodes(lab) == set()
    # Beside the form: the culprit's stack and its peers', read from the incident's upload (issue 19).
    brief = form_texts(run_id)
    assert f"**Stack:** {CULPRIT_STACK}" in brief, brief
    assert "**Peers' stack:** distributed\\_c10d.py:3252 all\\_reduce\\(\\) ← train.py:88 step\\(\\)" in brief
    assert "Full stack of rank 2" in _artifacts(run_id)[f"denpex-{incident}-report"].data
    assert f"**Decide on the approval page:** [{flow_rig.page_url}/runs/{run_id}]" in brief  # the pause's description

    resume(run_id, {"decision": "approve", "plan_hash": plan.content_hash(), "nodes": [CULPRIT_NODE],
                    "approver": "alice", "comment": "Xid 79 confirmed"}, state_dir=flow_rig.state_dir)
    assert wait_for(run_id, {"COMPLETED"}) == "COMPLETED"

    report = report_of(flow_rig.state_dir, incident, run_id)
    assert report["verdict"] == "localized" and report["outcome"] == "executed", report["reason"]
    assert [c["rank"] for c in report["candidates"]] == [2]
    assert report["candidates"][0]["stack"]["source"] == "collector"
    assert [g["ranks"] for g in report["stack_groups"]] == [[0, 1, 3], [2]]
    assert report["plan"]["actions"] == [{"node": CULPRIT_NODE, "action": "drain"}]
    assert report["approval"]["channel"] == "approval-page" and report["approval"]["flow_run_id"] == str(run_id)
    assert report["approval"]["decision"] == "approve" and report["approval"]["second_factor"] == "totp"
    assert drained_nodes(lab) == {CULPRIT_NODE}
    assert reason_of(lab, CULPRIT_NODE).startswith(f"denpex:{incident} rank 2: xid 79")
    # The notes follow the facts: job gloo-withheld_one runs on no node of the lab, so nothing
    # waits for it and no "never ends" note is due (issue 20 item 4).
    [node] = report["execution"]["nodes"]
    assert node["running_jobs"] == [] and "never ends" not in " ".join(report["execution"]["notes"])
    # The report shows every stuck group's chart; each chart is a markdown image, never an image
    # artifact whose link text would be the whole data URI (issue 20 item 3).
    artifacts = _artifacts(run_id)
    images = artifacts[f"denpex-{incident}-report"].data.count("](data:image/png;base64,")
    assert images == 1 + len(report["stuck"]) >= 3
    the_report = artifacts[f"denpex-{incident}-report"]
    assert the_report.task_run_id is None and str(the_report.flow_run_id) == str(run_id)
    assert f"| 2 | {CULPRIT_NODE} | not_entered | group 2 #3 | 0.90 | drain |" in the_report.data, the_report.data

    audit = keyed_audit_log(flow_rig.state_dir)
    mine = [r for r in audit.records() if r.incident_id == incident]
    # The page's decision, with its comment, before the first intent (issue 30 section 1).
    assert [r.kind for r in mine] == [AuditKind.DECISION, AuditKind.INTENT, AuditKind.RESULT]
    assert mine[0].action == "approved" and mine[0].message.endswith(": Xid 79 confirmed")
    assert all(r.approver == "alice" for r in mine) and all(r.node == CULPRIT_NODE for r in mine[1:])
    wanted = {"denpex.remediation.intent", "denpex.remediation.result"}
    assert wanted <= _event_names(incident, wanted)
    _the_run_page_tells_the_story(run_id, incident)


def _the_run_page_tells_the_story(run_id: Any, incident: str) -> None:
    """The run is named after the incident, its state message gives the verdict, and its Logs tab
    shows the flow's own steps at INFO although Prefect's level is WARNING (as in the demo)."""
    from prefect import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    assert os.environ["PREFECT_LOGGING_LEVEL"] == "WARNING"  # what the served flows inherit
    wanted = ("coverage: dumps of 4 of 4 ranks", "verdict: localized: rank 2 (not_entered) on gpu-node-003",
              f"plan: drain {CULPRIT_NODE} (plan ",
              "waiting for a decision on the approval page: http://127.0.0.1:",
              f"approval: approved by alice for {CULPRIT_NODE} (on the approval page, totp)",
              f"ran: {CULPRIT_NODE}: act, applied, now IDLE+DRAIN", "outcome: executed: approved by alice")
    deadline = time.monotonic() + 90
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(run_id)
        while True:  # the run's log handler sends in batches
            logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))
            mine = [(log.level, log.message) for log in logs if log.name == "prefect.flow_runs.denpex"]
            if all(any(m.startswith(w) for _, m in mine) for w in wanted) or time.monotonic() > deadline:
                break
            time.sleep(1)
    assert run.name == f"lab/{incident}"
    assert run.state is not None and run.state.message is not None
    assert run.state.message.startswith("localized: rank 2 (not_entered) on gpu-node-003; 4 of 4 ranks reported. "
                                        "executed: approved by alice"), run.state.message
    for line in wanted:
        assert any(level == logging.INFO and m.startswith(line) for level, m in mine), f"{line!r} not in {mine}"


def test_a_rejection_on_the_page_touches_nothing(flow_rig: FlowRig, lab: SlurmLab) -> None:
    incident = "inc-rejected"
    run_id = start_manual(alert(incident, _evidence(flow_rig, incident)))
    wait_for(run_id, {"PAUSED"})
    resume(run_id, {"decision": "reject", "approver": "carol", "comment": "job owner is debugging"},
           state_dir=flow_rig.state_dir)
    wait_for(run_id, {"COMPLETED"})
    report = report_of(flow_rig.state_dir, incident, run_id)
    why = "rejected by carol (on the approval page, totp): job owner is debugging"
    assert report["outcome"] == "rejected" and report["reason"] == why
    assert report["execution"] is None
    assert drained_nodes(lab) == set()
    # One decision record, the page's, signed for this run: the flow adds none of its own.
    [decision] = _decisions(flow_rig, incident)
    assert decision == f"rejected by carol on the approval page for run {run_id} (totp): job owner is debugging"
    wanted = {"denpex.remediation.rejected"}
    assert wanted <= _event_names(incident, wanted)


def test_the_prefect_form_decides_where_the_runbook_says_second_factor_none(flow_rig: FlowRig, lab: SlurmLab) -> None:
    """A single trusted operator's runbook keeps the Prefect form; its approval writes a decision
    record with the comment before the first intent (issue 30 section 1)."""
    incident = "inc-form"
    with _runbook(lab, "hang-triage-form"):
        run_id = start_manual(alert(incident, _evidence(flow_rig, incident)))
        wait_for(run_id, {"PAUSED"})
        plan = saved_plan(flow_rig.state_dir, incident)
        resume(run_id, {"decision": "approve", "plan_hash": plan.content_hash(), "nodes": [CULPRIT_NODE],
                        "approver": "bob", "code": "", "comment": "the only operator"})
        wait_for(run_id, {"COMPLETED"})
    report = report_of(flow_rig.state_dir, incident, run_id)
    assert report["outcome"] == "executed", report["reason"]
    assert report["approval"]["channel"] == "prefect-ui" and report["approval"]["second_factor"] is None
    mine = [r for r in keyed_audit_log(flow_rig.state_dir).records() if r.incident_id == incident]
    assert [r.kind for r in mine] == [AuditKind.DECISION, AuditKind.INTENT, AuditKind.RESULT]
    assert mine[0].action == "approved" and mine[0].message.endswith(": the only operator")
    assert drained_nodes(lab) == {CULPRIT_NODE}


def test_a_runbook_without_a_second_factor_that_the_worker_does_not_allow_is_refused(
        flow_rig: FlowRig, lab: SlurmLab) -> None:
    """Issue 30 finding 6: the runbook block is editable through the Prefect API, so pointing it at
    a ``second_factor: none`` runbook must not move incidents to Prefect's form. Only the names in
    the worker's DENPEX_PREFECT_FORM_RUNBOOKS (the rig's: hang-triage-form) are followed."""
    incident = "inc-form-unlisted"
    with _runbook(lab, "hang-triage-form-unlisted"):
        run_id = start_manual(alert(incident, _evidence(flow_rig, incident)))
        assert wait_for(run_id, {"COMPLETED", "FAILED", "PAUSED"}) == "FAILED"
    message = state_message(run_id)
    assert "'hang-triage-form-unlisted' keeps Prefect's form" in message, message
    assert "DENPEX_PREFECT_FORM_RUNBOOKS" in message and "nothing was done" in message, message
    assert not [r for r in keyed_audit_log(flow_rig.state_dir).records() if r.incident_id == incident]
    assert drained_nodes(lab) == set()


def test_a_run_forced_to_running_without_an_answer_refuses_and_records_it(flow_rig: FlowRig, lab: SlurmLab) -> None:
    """Attacker review: a paused run set to Running through the API, with no answer stored, failed
    with a validation error and left no report and no decision in the audit log."""
    from prefect import get_client
    from prefect.states import Running

    incident = "inc-forced-running"
    run_id = start_manual(alert(incident, _evidence(flow_rig, incident)))
    wait_for(run_id, {"PAUSED"})
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(run_id, Running(), force=True)
    wait_for(run_id, {"COMPLETED"})
    report = report_of(flow_rig.state_dir, incident, run_id)
    why = "resumed without a decision that the approval page recorded for it"
    assert report["outcome"] == "refused" and why in report["reason"] and report["execution"] is None
    assert drained_nodes(lab) == set()
    assert any(why in message for message in _decisions(flow_rig, incident))


def test_invalid_input_is_refused_and_the_run_stays_paused_until_it_times_out(flow_rig: FlowRig, lab: SlurmLab) -> None:
    incident = "inc-timeout"
    with _runbook(lab, "hang-triage-quick"):
        run_id = start_manual(alert(incident, _evidence(flow_rig, incident)))
        wait_for(run_id, {"PAUSED"})
        # The server checks an answer against the pause's schema (the page's one `record` field):
        # the Prefect form's answers, and anything else, never resume the run.
        plan = saved_plan(flow_rig.state_dir, incident)
        answered = {"plan_hash": plan.content_hash(), "nodes": [a.node for a in plan.actions], "comment": ""}
        for wrong in ({"decision": "maybe", "unknown": 1}, {**answered, "decision": "approve", "approver": "mallory"},
                      {**answered, "decision": "approve", "approver": "  "}, {**answered, "decision": "approve"}):
            with pytest.raises(Exception, match="(?i)input|valid|schema"):
                resume(run_id, wrong)
        # Prefect fails a run whose pause expired (it can no longer resume); the flow has recorded why.
        wait_for(run_id, {"COMPLETED", "FAILED"}, timeout_s=120)
    report = report_of(flow_rig.state_dir, incident, run_id)
    assert report["outcome"] == "timed_out" and report["execution"] is None
    assert drained_nodes(lab) == set()
    assert any("nobody answered" in m for m in _decisions(flow_rig, incident))


def test_late_evidence_is_waited_for_then_triaged_without_the_missing_rank(flow_rig: FlowRig, lab: SlurmLab) -> None:
    """Ranks 0 and 3 are in when the alert fires, rank 2 arrives during the grace period, rank 1
    never: the run takes rank 2, waits out the grace period, and names rank 1 missing."""
    incident = "inc-late"
    evidence = _evidence(flow_rig, incident, ranks={0, 3})
    started = time.monotonic()
    run_id = start_manual(alert(incident, evidence))
    time.sleep(2)
    upload(flow_rig.s3_endpoint, evidence_prefix(incident), SCENARIO, ranks={2})
    state = wait_for(run_id, {"PAUSED", "COMPLETED"})
    waited = time.monotonic() - started
    if state == "PAUSED":
        plan = saved_plan(flow_rig.state_dir, incident)
        resume(run_id, {"decision": "reject", "approver": "carol", "comment": "test",
                        "plan_hash": plan.content_hash(), "nodes": [a.node for a in plan.actions]},
               state_dir=flow_rig.state_dir)
        wait_for(run_id, {"COMPLETED"})
    report = report_of(flow_rig.state_dir, incident, run_id)
    assert report["missing_ranks"] == [1] and report["ranks_with_evidence"] == [0, 2, 3]
    assert waited >= 6  # the runbook's evidence grace (PT6S): it did wait for rank 1
    assert not drained(lab, CULPRIT_NODE)
