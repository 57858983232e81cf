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
