"""Who sent a request: a verified signature or bearer token, bound to one tenant and cluster.

A signed request is checked in steps, so that nothing about the body is read, stored or spent
before the headers alone could pass (the body may be 256 MiB):

:func:`check_signed_headers`, from the headers only, before any body byte is read:

1. the headers are all there and well formed                      401
2. the timestamp is within 300 s of the server's clock           401
3. the key exists                                                 401
4. the key is not revoked                                         403
5. the tenant and cluster in the headers are the key's own        403
6. the tenant's plan includes hang triage                         403
7. the nonce was not used with this key yet (read, not recorded)  401

:func:`verify_headers` for a v2 signature, still from the headers only, before anything is
reserved for the body; :func:`verify_signature` for a v1 signature, once the body has been hashed
as it streamed to the spool (within the small allowance for unverified bodies):

8. the HMAC matches (constant time)                               401
9. the nonce is recorded, atomically: of two requests racing with
   one nonce only one passes; a request whose HMAC failed never
   spends the nonce of the genuine one                            401

A v2 body is then checked against the length and SHA-256 its signature covers as it streams
(:func:`denpex.ingest.body_spool.spool_body`, 401 on any difference). Its nonce is spent already:
a retry signs again with a fresh one, as Denpex's clients do.

A key id is not a secret, so steps 4-6 answer before the signature is known to be good: their
messages name what the headers claimed, never which tenant or cluster the key belongs to.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from denpex.ingest.errors import AuthenticationError, ForbiddenError
from denpex.ingest.nonce_cache import NonceCache
from denpex.ingest.plans import require_hang_triage
from denpex.ingest.registry import Registry, SigningKey, TokenGrant
from denpex.ingest.signing import (
    SignatureVersion,
    SignedHeaders,
    body_sha256,
    check_body,
    check_signature,
    check_timestamp,
    parse_signed_headers,
)

__all__ = ["Caller", "PendingRequest", "check_signed_headers", "verify_headers", "verify_signature",
           "authenticate_signed", "authenticate_bearer"]


@dataclass(frozen=True, slots=True)
class Caller:
    """A verified sender. ``host`` is set only for a node agent's host-bound key."""

    tenant: str
    cluster: str
    key_id: str
    host: str | None = None


@dataclass(frozen=True, slots=True)
class PendingRequest:
    """A signed request whose headers passed; its signature is not verified yet."""

    signed: SignedHeaders
    key: SigningKey

    def __repr__(self) -> str:
        # The key holds the secret (a SecretStr already redacts it); keep reprs short anyway.
        return f"PendingRequest(key_id={self.key.key_id!r}, nonce={self.signed.nonce!r})"


def check_signed_headers(registry: Registry, nonces: NonceCache, headers: Mapping[str, str], *,
                         now: float) -> PendingRequest:
    """Steps 1-7 of the module docstring: everything the headers alone can tell."""
    signed = parse_signed_headers(headers)
    check_timestamp(signed.timestamp, now)
    key = registry.signing_key(signed.key_id)
    if key.revoked:
        raise ForbiddenError(f"key {key.key_id} was revoked; sign with a current key")
    if (signed.tenant, signed.cluster) != (key.tenant, key.cluster):
        raise ForbiddenError(f"key {key.key_id} cannot act for tenant {signed.tenant!r}, cluster "
                             f"{signed.cluster!r}; sign with a key of that tenant and cluster")
    _require_plan(registry, key.tenant)
    nonces.check_unused(key.key_id, signed.nonce, now)
    return PendingRequest(signed=signed, key=key)


def verify_headers(nonces: NonceCache, pending: PendingRequest, *, method: str, target: str, now: float) -> Caller:
    """Steps 8-9 for a v2 signature: the HMAC over the request target and the declared body, from
    the headers alone, then the nonce. The body that arrives must then be the declared one."""
    if pending.signed.version is not SignatureVersion.V2:
        raise ValueError("a v1 signature covers the body itself: verify it with verify_signature once it arrived")
    return _verified(nonces, pending, method=method, target=target, body_hash=None, now=now)


def verify_signature(nonces: NonceCache, pending: PendingRequest, *, method: str, target: str, body_hash: str,
                     now: float) -> Caller:
    """Steps 8-9 for a v1 signature: the HMAC over the request target and the streamed body's hash,
    then the nonce."""
    if pending.signed.version is not SignatureVersion.V1:
        raise ValueError("a v2 signature is verified from the headers, before the body: use verify_headers")
    return _verified(nonces, pending, method=method, target=target, body_hash=body_hash, now=now)


def _verified(nonces: NonceCache, pending: PendingRequest, *, method: str, target: str, body_hash: str | None,
              now: float) -> Caller:
    key = pending.key
    check_signature(key.secret.get_secret_value().encode(), pending.signed, method, target, body_hash=body_hash)
    nonces.claim(key.key_id, pending.signed.nonce, now)
    return Caller(tenant=key.tenant, cluster=key.cluster, key_id=key.key_id, host=key.host)


def authenticate_signed(registry: Registry, nonces: NonceCache, headers: Mapping[str, str], *,
                        method: str, path: str, body: bytes, now: float) -> Caller:
    """Every step for a body already in memory (``path`` is the request target), either version."""
    pending = check_signed_headers(registry, nonces, headers, now=now)
    declared = pending.signed.declared
    if declared is None:
        return verify_signature(nonces, pending, method=method, target=path, body_hash=body_sha256(body), now=now)
    caller = verify_headers(nonces, pending, method=method, target=path, now=now)
    check_body(declared, size=len(body), sha256=body_sha256(body))
    return caller


def authenticate_bearer(registry: Registry, authorization: str) -> TokenGrant:
    """Verify ``Authorization: Bearer <token>`` (Alertmanager's ``http_config.authorization``)."""
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthenticationError("the Authorization header must be 'Bearer <token>'")
    grant = registry.grant_for_token(token.strip())
    _require_plan(registry, grant.tenant)
    return grant


def _require_plan(registry: Registry, tenant: str) -> None:
    plan = registry.plan_of(tenant)
    if plan is None:
        raise ForbiddenError(f"tenant {tenant!r} no longer exists")
    require_hang_triage(tenant, plan)
