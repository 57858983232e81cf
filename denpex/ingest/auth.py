"""Who sent a request: a verified signature or bearer token, bound to one tenant and cluster.

Checks run in this order, and the first failure answers (nothing is stored on any):

1. the headers are all there and well formed                      401
2. the timestamp is within 300 s of the server's clock           401
3. the key exists, and the HMAC matches (constant time)           401
4. the key is not revoked                                         403
5. the tenant and cluster in the headers are the key's own        403
6. the tenant's plan includes hang triage                         403
7. the nonce was never used with this key (recorded from now on)  401
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from denpex.ingest.errors import AuthenticationError, ForbiddenError
from denpex.ingest.nonce_cache import NonceCache
from denpex.ingest.plans import require_hang_triage
from denpex.ingest.registry import Registry, TokenGrant
from denpex.ingest.signing import check_signature, check_timestamp, parse_signed_headers

__all__ = ["Caller", "authenticate_signed", "authenticate_bearer"]


@dataclass(frozen=True, slots=True)
class Caller:
    """A verified sender. ``host`` is set only for a node agent's host-bound key."""

    tenant: str
    cluster: str
    key_id: str
    host: str | None = None


def authenticate_signed(registry: Registry, nonces: NonceCache, headers: Mapping[str, str], *,
                        method: str, path: str, body: bytes, now: float) -> Caller:
    """Verify a signed request; see the module docstring for the order of the checks."""
    signed = parse_signed_headers(headers)
    check_timestamp(signed.timestamp, now)
    key = registry.signing_key(signed.key_id)
    check_signature(key.secret.get_secret_value().encode(), signed, method, path, body)
    if key.revoked:
        raise ForbiddenError(f"key {key.key_id} was revoked; sign with a current key")
    if (signed.tenant, signed.cluster) != (key.tenant, key.cluster):
        raise ForbiddenError(f"key {key.key_id} belongs to tenant {key.tenant!r}, cluster {key.cluster!r}; "
                             f"it cannot act for tenant {signed.tenant!r}, cluster {signed.cluster!r}")
    _require_plan(registry, key.tenant)
    nonces.claim(key.key_id, signed.nonce, now)
    return Caller(tenant=key.tenant, cluster=key.cluster, key_id=key.key_id, host=key.host)


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
