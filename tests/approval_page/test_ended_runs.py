"""What the page does with the Prefect API's answer about which runs ended
(``denpex.approval_page.resume.ended_runs``) when that answer is not Prefect's: a misconfigured
URL or a proxy's page (a JSON object, a list of strings), or a server that answers a byte at a
time. It hides nothing then, and gives up within its deadline. The real server's answer is
checked in tests/flows/test_real_server_flow.py (an ended run is no longer listed)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from denpex.approval_page.resume import PrefectLink, ended_runs

RUN = "0b7e6c1e-2a4f-4f7e-9a51-3d1c2b9e8f00"


@contextmanager
def answering(body: bytes, *, drip_s: float = 0.0) -> Iterator[str]:
    """A plain HTTP server on loopback that answers every POST with ``body`` (200)."""
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the http.server API
            self.rfile.read(int(self.headers.get("content-length") or 0))
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            for at in range(len(body)):
                if drip_s:
                    time.sleep(drip_s)
                try:
                    self.wfile.write(body[at:at + 1] if drip_s else body[at:])
                    self.wfile.flush()
                except OSError:
                    return
                if not drip_s:
                    return

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/api"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("body", [b'{"detail": "Not Found"}', b'["a", "b"]', b"<html>login</html>", b"[{}]"])
def test_an_answer_that_is_not_prefects_hides_nothing(body: bytes) -> None:
    with answering(body) as api:
        assert ended_runs(PrefectLink(api), [RUN]) is None


def test_prefects_shape_names_what_ended_and_what_it_does_not_know() -> None:
    body = (b'[{"id": "' + RUN.encode() + b'", "state_type": "CANCELLED", "state_name": "Cancelled"}]')
    with answering(body) as api:
        assert ended_runs(PrefectLink(api), [RUN, "gone"]) == {RUN: "Cancelled", "gone": "unknown to Prefect"}


def test_a_server_answering_a_byte_at_a_time_is_given_up_on_within_the_deadline() -> None:
    body = b'[{"id": "' + RUN.encode() + b'", "state_type": "PAUSED"}]' + b" " * 1000
    with answering(body, drip_s=0.05) as api:
        started = time.monotonic()
        assert ended_runs(PrefectLink(api), [RUN]) is None
        # The whole answer would take over 50 s; the page gives up after its 3 s deadline (and one read).
        assert time.monotonic() - started < 30
