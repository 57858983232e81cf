"""The approvers' webhook (a real local HTTP receiver) and the alert event's shape."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from denpex.analysis.models import Candidate, CandidateKind, Verdict
from denpex.ingest.alert_event import ALERT_EVENT, AlertEvent
from denpex.report import PlanAction, PlanView, TriageReport
from denpex.workflow.notify import NotifyError, approval_notice, post_webhook


class Receiver(BaseHTTPRequestHandler):
    received: list[tuple[str, dict[str, str], bytes]] = []
    status = 200

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Receiver.received.append((self.path, dict(self.headers), body))
        self.send_response(Receiver.status)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[str]:
    Receiver.received = []
    Receiver.status = 200
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hooks/T000/B000/secret"
    server.shutdown()
    server.server_close()


def _report() -> TriageReport:
    return TriageReport(
        verdict=Verdict.LOCALIZED, world_size=4, ranks_with_evidence=[0, 1, 2, 3], missing_ranks=[],
        candidates=[Candidate(rank=2, kind=CandidateKind.NOT_ENTERED, confidence=0.9, host="gpu-node-003")],
        plan=PlanView(recommend_isolation=True, actions=[PlanAction(node="gpu-node-003", action="drain")]),
    )


def test_slack_compatible_notice_reaches_the_receiver(receiver: str) -> None:
    notice = approval_notice(_report(), incident_id="inc-7", cluster="lab", plan_hash="ab" * 32,
                             run_url="http://127.0.0.1:4200/runs/flow-run/123")
    assert post_webhook(receiver, notice) == 200
    [(path, headers, body)] = Receiver.received
    assert path == "/hooks/T000/B000/secret" and headers["Content-Type"] == "application/json"
    text = json.loads(body)["text"]
    assert "drain gpu-node-003" in text and "rank 2 (not_entered on gpu-node-003)" in text
    assert text.endswith("http://127.0.0.1:4200/runs/flow-run/123")


def test_a_failing_webhook_is_one_clear_error(receiver: str) -> None:
    Receiver.status = 500
    notice = approval_notice(_report(), incident_id="inc-7", cluster="lab", plan_hash="ab" * 32, run_url=None)
    with pytest.raises(NotifyError, match="HTTP 500"):
        post_webhook(receiver, notice)
    with pytest.raises(NotifyError, match="not http"):
        post_webhook("file:///etc/passwd", notice)


def test_alert_event_payload_is_the_flow_parameters_and_its_id_is_stable() -> None:
    alert = AlertEvent(tenant="acme", cluster="lab", job_id="job-1", incident_id="inc-7",
                       alert_time=datetime(2026, 11, 29, 20, 29, 50, tzinfo=UTC), evidence="s3://evidence/x",
                       world_size=4, reported_by_rank=0, alert_id="am-1")
    body = alert.event_body(datetime(2026, 11, 29, 20, 30, tzinfo=UTC))
    assert body["event"] == ALERT_EVENT
    assert set(body["payload"]) == {"tenant", "cluster", "job_id", "incident_id", "alert_time", "evidence",
                                    "world_size", "reported_by_rank", "alert_id"}
    again = alert.model_copy().event_body(datetime(2026, 11, 29, 21, 0, tzinfo=UTC))
    assert again["id"] == body["id"]  # a re-sent alert is the same event: one run per incident
