"""Receiving a request's body: nothing is reserved for a sender that is not known yet.

What the HTTP app does between checking the headers and parsing the body, for each kind of sender
(the pools of :mod:`denpex.ingest.body_spool`)::

    v2 signature   headers -> HMAC over the declared length and SHA-256 (401 at once, nothing reserved)
                   -> reserve the declared length in the signed pool, as the key and its tenant
                   -> stream; the body must be exactly the declared one (401)
    v1 signature   headers -> a body within the v1 allowance (413 past its share: "sign v2")
                   -> reserve it in the unverified pool, as the key id it names
                   -> stream, then the HMAC over its hash (401) -> moved to the signed pool
    bearer token   token checked from the headers (401/403) -> reserve in the bearer pool, as the
                   token's cluster and tenant

v1 goes away (docs/contracts.md): ``max_unverified_bytes`` 0 refuses it now. Until then each key
that still signs v1 is logged once per process, so that an operator finds the clients to update.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from denpex.ingest.auth import Caller, PendingRequest, check_signed_headers, verify_headers, verify_signature
from denpex.ingest.body_spool import BodySpool, SpooledFile, SpoolPool, SpoolSlot, spool_body
from denpex.ingest.errors import AuthenticationError, PayloadTooLargeError
from denpex.ingest.nonce_cache import NonceCache
from denpex.ingest.registry import Registry
from denpex.ingest.signing import HEADER_CONTENT_LENGTH, SignatureVersion, body_sha256, request_target

__all__ = ["SignedReceiver", "Received"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Received:
    """A body that arrived whole, from a verified sender, in its spool slot (removed with the slot)."""

    caller: Caller
    body: SpooledFile
    slot: SpoolSlot


class SignedReceiver:
    """Checks signed requests and receives their bodies into one service's spool."""

    def __init__(self, registry: Registry, nonces: NonceCache, spool: BodySpool) -> None:
        self.registry = registry
        self.nonces = nonces
        self.spool = spool
        self._v1_keys: set[str] = set()  # bounded: only keys the registry holds get this far
        self._v1_lock = threading.Lock()

    async def check_headers(self, request: Request, now: float) -> PendingRequest:
        """Steps 1-7 of :mod:`denpex.ingest.auth`: everything the headers alone can tell."""
        return await run_in_threadpool(check_signed_headers, self.registry, self.nonces, dict(request.headers), now=now)

    @asynccontextmanager
    async def body(self, request: Request, pending: PendingRequest, *, cap: int, now: float) -> AsyncIterator[Received]:
        """The body of a signed request, received within ``cap`` into its pool (module docstring);
        its spool files go when the block ends."""
        declared = pending.signed.declared
        if declared is not None:
            _same_length(request, declared.length)
            caller = await self._verify(request, pending, None, now)
            _within(declared.length, cap)
            with self.spool.admit(declared.length, pool=SpoolPool.SIGNED, source=_source(caller.key_id),
                                  tenant=caller.tenant) as slot:
                body = await self._stream(request, slot, cap, declared.length, signed=pending)
                yield Received(caller=caller, body=body, slot=slot)
            return
        allowance = self.spool.limits.source_bytes(SpoolPool.UNVERIFIED)
        if allowance <= 0:
            raise AuthenticationError("this service no longer accepts v1 signatures: sign v2 (X-Denpex-Signature: "
                                      "v2=..., with X-Denpex-Content-Length and X-Denpex-Content-SHA256)")
        length = _declared_length(request)
        _within(length, cap)
        if length is not None and length > allowance:
            raise PayloadTooLargeError(f"a v1-signed body can be checked only once it has arrived, so it may be at "
                                       f"most {allowance:,} bytes, and this one declares {length:,}; sign it v2 "
                                       "(X-Denpex-Content-Length and X-Denpex-Content-SHA256): nothing was stored")
        with self.spool.admit(length, pool=SpoolPool.UNVERIFIED, source=_source(pending.key.key_id)) as slot:
            body = await self._stream(request, slot, min(cap, allowance), length)
            caller = await self._verify(request, pending, body.sha256, now)
            self._note_v1(caller.key_id)
            # Proven now: what the request holds leaves the allowance that strangers can fill.
            self.spool.promote(slot, pool=SpoolPool.SIGNED, source=_source(caller.key_id), tenant=caller.tenant)
            yield Received(caller=caller, body=body, slot=slot)

    async def empty(self, request: Request, pending: PendingRequest, now: float) -> Caller:
        """A request that signs an empty body (a GET): whatever body is attached is never read."""
        declared = pending.signed.declared
        if declared is not None and (declared.length, declared.sha256) != (0, body_sha256(b"")):
            raise AuthenticationError(f"a {request.method} signs an empty body ({HEADER_CONTENT_LENGTH}: 0 and the "
                                      "SHA-256 of no bytes); nothing was read")
        return await self._verify(request, pending, None if declared is not None else body_sha256(b""), now)

    @asynccontextmanager
    async def bearer_body(self, request: Request, tenant: str, cluster: str, *, cap: int) -> AsyncIterator[SpooledFile]:
        """The body of a request whose bearer token checked out, in the bearer pool."""
        length = _declared_length(request)
        _within(length, cap)
        with self.spool.admit(length, pool=SpoolPool.BEARER, source=f"bearer:{tenant}/{cluster}",
                              tenant=tenant) as slot:
            yield await self._stream(request, slot, cap, length)

    async def _stream(self, request: Request, slot: SpoolSlot, cap: int, length: int | None, *,
                      signed: PendingRequest | None = None) -> SpooledFile:
        deadline = self.spool.limits.deadline_s(length, cap)
        return await spool_body(request.stream(), slot, cap=cap, deadline_s=deadline,
                                declared=signed.signed.declared if signed is not None else None)

    async def _verify(self, request: Request, pending: PendingRequest, body_hash: str | None, now: float) -> Caller:
        """The signature over the request target: the path and, when there is one, the query as sent."""
        target = request_target(request.url.path, request.scope.get("query_string", b"").decode("latin-1"))
        if pending.signed.version is SignatureVersion.V2:
            return await run_in_threadpool(verify_headers, self.nonces, pending, method=request.method, target=target,
                                           now=now)
        return await run_in_threadpool(verify_signature, self.nonces, pending, method=request.method, target=target,
                                       body_hash=body_hash or body_sha256(b""), now=now)

    def _note_v1(self, key_id: str) -> None:
        with self._v1_lock:
            if key_id in self._v1_keys:
                return
            self._v1_keys.add(key_id)
        _log.warning("key %s signs its requests v1, which goes away (docs/contracts.md, Signed requests): update "
                     "its client to sign v2", key_id)


def _source(key_id: str) -> str:
    """Whom a signed body is counted against: the key it names (proven, once in the signed pool)."""
    return f"key:{key_id}"


def _declared_length(request: Request) -> int | None:
    declared = request.headers.get("content-length")
    return int(declared) if declared is not None and declared.isascii() and declared.isdigit() else None


def _within(length: int | None, cap: int) -> None:
    """A declared length over ``cap`` is refused (413) before a byte is read."""
    if length is not None and length > cap:
        raise PayloadTooLargeError(f"the body is {length:,} bytes, over the {cap:,}-byte cap; nothing was stored")


def _same_length(request: Request, signed_length: int) -> None:
    """A v2 request's Content-Length, when it has one, must be the signed length (401)."""
    sent = _declared_length(request)
    if sent is not None and sent != signed_length:
        raise AuthenticationError(f"the Content-Length ({sent:,}) differs from the signed {HEADER_CONTENT_LENGTH} "
                                  f"({signed_length:,}): the signature does not match this request")
