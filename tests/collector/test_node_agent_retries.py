"""``denpex node-agent`` tries a busy service again (429, 5xx, no answer) and takes a refusal at once.

The service here is a loopback HTTP server that answers from a script: what is under test is the
agent's side, which sees only status lines and headers. (The ingest service's own 503s, from its
connection and spool bounds, are tested against the real ``serve-api`` in ``tests/ingest``.)
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from pydantic import SecretStr

from denpex.collector.node_agent import NodeAgentError, send_telemetry
from denpex.collector.uploader import Backoff, UploadTarget
from denpex.ingest.signing import HEADER_NONCE

_FAST = Backoff(first_s=0.01, max_s=0.05)


@contextmanager
def _service(answers: list[tuple[int, dict[str, str]]]) -> Iterator[tuple[str, list[str]]]:
    """Answers each POST with the next scripted (status, headers); the last one repeats."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers.get("content-length", "0")))
            seen.append(self.headers.get(HEADER_NONCE) or "")
            status, headers = answers[min(len(seen) - 1, len(answers) - 1)]
            body = b'{"ok": true}' if status < 300 else b'{"error": "busy"}'
            self.send_response(status)
            for name, value in {**headers, "content-type": "application/json",
                                "content-length": str(len(body))}.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def _target(url: str) -> UploadTarget:
    return UploadTarget(url=url, key_id="k-node", secret=SecretStr("s" * 32), tenant="acme", cluster="c1", job_id="4242")


def test_a_busy_service_is_tried_again_until_it_takes_the_telemetry() -> None:
    answers = [(503, {"retry-after": "0"}), (429, {"retry-after": "0"}), (408, {}), (502, {}), (201, {})]
    with _service(answers) as (url, seen):
        response = send_telemetry(_target(url), b"NVRM: Xid 79\n", backoff=_FAST)
    assert response.status_code == 201
    assert len(seen) == 5
    assert len(set(seen)) == 5, "each try is signed afresh, never sent again as it was"


def test_a_refusal_is_returned_at_once() -> None:
    with _service([(403, {})]) as (url, seen):
        response = send_telemetry(_target(url), b"NVRM: Xid 79\n", backoff=_FAST)
    assert (response.status_code, len(seen)) == (403, 1)


def test_a_service_busy_for_every_try_gives_its_last_answer() -> None:
    with _service([(503, {"retry-after": "0"})]) as (url, seen):
        response = send_telemetry(_target(url), b"NVRM: Xid 79\n", attempts=3, backoff=_FAST)
    assert (response.status_code, len(seen)) == (503, 3)


def test_no_service_at_all_is_one_clear_error_after_the_tries() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, never listening: every connection is refused
        with pytest.raises(NodeAgentError, match=r"cannot be reached \(3 tries\)"):
            send_telemetry(_target(f"http://127.0.0.1:{port}"), b"x\n", attempts=3, backoff=_FAST)


def test_the_waits_follow_retry_after_bounded_by_the_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """The delays themselves: the service's Retry-After (in seconds, at most the backoff's
    longest; a negative one is 0), else the backoff's doubling delay; a Retry-After that is no
    number counts as none."""
    waits: list[float] = []
    monkeypatch.setattr("denpex.collector.node_agent.time.sleep", waits.append)
    backoff = Backoff(first_s=1.0, max_s=30.0, jitter=0.0)
    answers = [(503, {"retry-after": "2"}), (429, {}), (503, {"retry-after": "999"}), (502, {"retry-after": "soon"}),
               (503, {"retry-after": "-5"}), (201, {})]
    with _service(answers) as (url, seen):
        response = send_telemetry(_target(url), b"NVRM: Xid 79\n", backoff=backoff)
    assert (response.status_code, len(seen)) == (201, 6)
    assert waits == [2.0, 2.0, 30.0, 8.0, 0.0]


@pytest.mark.parametrize("status", [501, 505])
def test_an_answer_that_cannot_change_is_not_tried_again(status: int) -> None:
    with _service([(status, {})]) as (url, seen):
        response = send_telemetry(_target(url), b"NVRM: Xid 79\n", backoff=_FAST)
    assert (response.status_code, len(seen)) == (status, 1)


def test_the_command_says_busy_not_refused_when_every_try_was_busy(monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from denpex.cli import app

    monkeypatch.setattr("denpex.collector.node_agent.time.sleep", lambda s: None)
    log = tmp_path / "kern.log"
    log.write_text("2026-12-06T02:35:50+0000 gpu-node-003 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1\n")
    with _service([(503, {"retry-after": "1"})]) as (url, seen):
        env = {"DENPEX_INGEST_URL": url, "DENPEX_INGEST_KEY_ID": "k-node", "DENPEX_INGEST_SECRET": "s" * 32,
               "DENPEX_TENANT": "acme", "DENPEX_CLUSTER": "c1", "DENPEX_JOB_ID": "4242"}
        result = CliRunner().invoke(app, ["node-agent", "--file", str(log)], env=env)
    assert result.exit_code == 1 and len(seen) == 6, result.output
    assert "busy on every try (HTTP 503 to the last of 6)" in result.output and "refused" not in result.output
