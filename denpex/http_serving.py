"""How Denpex's own HTTP services (``serve-api``, ``serve-approvals``) run under uvicorn.

uvicorn counts every open connection against ``limit_concurrency``, and it times out a
connection only between requests (keep-alive). A connection that never sends a request, or
dribbles its request line and headers a byte at a time, is held for ever: a stranger with a
thousand sockets and no secret answered every tenant's requests with 503 (the red team, issue
30). Here each request's head must arrive whole within ``HEADER_DEADLINE_S`` of the connection
opening, or of the previous response; a request whose head arrived is the application's to
bound (the ingest spool cuts a body that arrives too slowly).

A stranger can still open the whole ``limit_concurrency`` afresh every deadline. So one client
address (an IPv6 caller's /64, which one host is usually given whole) holds at most
``max_per_address`` connections; the next is answered 503 with ``Retry-After`` and closed, before
uvicorn reads a byte of it. A deployment behind a proxy sees the proxy's address: size the bound
for that, or let the proxy limit per client.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
from collections import Counter
from typing import Any, ClassVar

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["HEADER_DEADLINE_S", "HeadDeadlineProtocol", "address_key", "serve"]

# nginx's client_header_timeout is 60 s; a collector's request head is a few hundred bytes.
HEADER_DEADLINE_S = 20.0


def address_key(host: str) -> str:
    """What one client is counted as: its IPv4 address, or its IPv6 address's /64."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host  # a Unix socket's peer, or something uvicorn could not parse: counted as itself
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:  # ::ffff:a.b.c.d is that IPv4 client
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


def _too_many(key: str, cap: int) -> bytes:
    body = json.dumps({"error": f"{cap} connections from {key} are open, its bound; close one or retry "
                                "later"}).encode()
    return (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 5\r\n"
            b"connection: close\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


class HeadDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose next request head is late, and refusing
    one address's connections past ``address_cap`` (set on a subclass by ``serve``)."""

    address_cap: ClassVar[int | None] = None
    open_per_address: ClassVar[Counter[str]] = Counter()
    _head_deadline: asyncio.TimerHandle | None = None
    _counted_as: str | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.address_cap is not None and self.client is not None:
            key = address_key(self.client[0])
            self.open_per_address[key] += 1
            self._counted_as = key
            if self.open_per_address[key] > self.address_cap:
                transport.write(_too_many(key, self.address_cap))
                transport.close()
                return
        self._arm_head_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_head_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_deadline()
        if self._counted_as is not None:
            counts = self.open_per_address
            counts[self._counted_as] -= 1
            if counts[self._counted_as] <= 0:
                del counts[self._counted_as]  # the table holds open connections only
            self._counted_as = None
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


def serve(app: Any, *, host: str, port: int, max_connections: int, max_per_address: int) -> None:
    """Run ``app`` until stopped: at most ``max_connections`` at once and ``max_per_address`` from
    one client, late request heads closed.

    ``proxy_headers=False``: uvicorn's default rewrites a loopback caller's address from its own
    ``X-Forwarded-For``, so any local process could pass for a trusted proxy. A caller's address
    is its connection's; the approval page reads a proxy's headers itself, from the proxy's address.
    """
    protocol = type("CappedHeadDeadlineProtocol", (HeadDeadlineProtocol,),
                    {"address_cap": max_per_address, "open_per_address": Counter()})
    # ws="none": neither service speaks WebSocket, and an upgrade hands the transport to another
    # protocol whose close this one never sees (its address would stay counted for good).
    uvicorn.run(app, host=host, port=port, log_level="info", access_log=False, http=protocol, ws="none",
                limit_concurrency=max_connections, h11_max_incomplete_event_size=16 * 1024,
                proxy_headers=False, forwarded_allow_ips="")
