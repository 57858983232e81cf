"""How Denpex's own HTTP services (``serve-api``, ``serve-approvals``) run under uvicorn.

uvicorn counts every open connection against ``limit_concurrency``, and it times out a
connection only between requests (keep-alive). A connection that never sends a request, or
dribbles its request line and headers a byte at a time, is held for ever: a stranger with a
thousand sockets and no secret answered every tenant's requests with 503 (the red team, issue
30). Here each request's head must arrive whole within ``HEADER_DEADLINE_S`` of the connection
opening, or of the previous response; a request whose head arrived is the application's to
bound (the ingest spool cuts a body that arrives too slowly).
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["HEADER_DEADLINE_S", "HeadDeadlineProtocol", "serve"]

# nginx's client_header_timeout is 60 s; a collector's request head is a few hundred bytes.
HEADER_DEADLINE_S = 20.0


class HeadDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose next request head is late."""

    _head_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_head_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_deadline()
        super().connection_lost(exc)

    def _arm_head_deadline(self) -> None:
        self._cancel_head_deadline()
        waiting_after = self.cycle  # a new request's head, once parsed, starts a new cycle
        self._head_deadline = self.loop.call_later(HEADER_DEADLINE_S, self._close_if_no_head, waiting_after)

    def _cancel_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _close_if_no_head(self, waiting_after: Any) -> None:
        self._head_deadline = None
        if self.cycle is waiting_after and not self.transport.is_closing():
            self.transport.close()


def serve(app: Any, *, host: str, port: int, max_connections: int) -> None:
    """Run ``app`` until stopped: at most ``max_connections`` at once, late request heads closed.

    ``proxy_headers=False``: uvicorn's default rewrites a loopback caller's address from its own
    ``X-Forwarded-For``, so any local process could pass for a trusted proxy. A caller's address
    is its connection's; the approval page reads a proxy's headers itself, from the proxy's address.
    """
    uvicorn.run(app, host=host, port=port, log_level="info", access_log=False, http=HeadDeadlineProtocol,
                limit_concurrency=max_connections, h11_max_incomplete_event_size=16 * 1024,
                proxy_headers=False, forwarded_allow_ips="")
