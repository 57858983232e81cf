"""Signed requests: HMAC-SHA256 over a canonical string, as docs/contracts.md fixes it.

    v1\\n{METHOD}\\n{PATH}\\n{tenant}\\n{cluster}\\n{timestamp}\\n{nonce}\\n{sha256 hex of body}

``PATH`` is the request target: the path, and, when the request has a query string, ``?`` and the
query string exactly as sent (:func:`request_target`). A request without a query signs as it
always did; one whose query was changed after signing no longer matches. The signature travels as
``X-Denpex-Signature: v1=<hex>`` beside ``X-Denpex-Tenant``, ``X-Denpex-Cluster``,
``X-Denpex-Key-Id``, ``X-Denpex-Timestamp`` (Unix seconds) and ``X-Denpex-Nonce``.

The fixed test vector (secret, request, expected signature) is in the README and in
``tests/ingest/test_signing.py``.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict

from denpex.ingest.errors import AuthenticationError

__all__ = [
    "SIGNATURE_VERSION",
    "MAX_CLOCK_SKEW_S",
    "HEADER_TENANT",
    "HEADER_CLUSTER",
    "HEADER_KEY_ID",
    "HEADER_TIMESTAMP",
    "HEADER_NONCE",
    "HEADER_SIGNATURE",
    "SignedHeaders",
    "canonical_string",
    "body_sha256",
    "request_target",
    "sign",
    "signed_headers",
    "parse_signed_headers",
    "check_signature",
    "check_timestamp",
]

SIGNATURE_VERSION = "v1"
MAX_CLOCK_SKEW_S = 300
HEADER_TENANT = "X-Denpex-Tenant"
HEADER_CLUSTER = "X-Denpex-Cluster"
HEADER_KEY_ID = "X-Denpex-Key-Id"
HEADER_TIMESTAMP = "X-Denpex-Timestamp"
HEADER_NONCE = "X-Denpex-Nonce"
HEADER_SIGNATURE = "X-Denpex-Signature"

# Newlines in a field would let one canonical string read as another; the nonce is also a key
# of the replay cache, so it is kept short and printable.
_FIELD = re.compile(r"[A-Za-z0-9._:@-]{1,128}")
_HEX_SIGNATURE = re.compile(r"v1=([0-9a-f]{64})")


class SignedHeaders(BaseModel):
    """The authentication headers of one request, parsed and shape-checked."""

    model_config = ConfigDict(frozen=True)

    tenant: str
    cluster: str
    key_id: str
    timestamp: int
    nonce: str
    signature: str
    """The hex digest after ``v1=``."""


def body_sha256(body: bytes) -> str:
    """The hex SHA-256 of the whole body (of the whole multipart body for uploads)."""
    return hashlib.sha256(body).hexdigest()


def request_target(path: str, query: str = "") -> str:
    """What ``{PATH}`` is in the canonical string: the path, plus ``?query`` when there is one.

    >>> request_target("/v1/alerts", "job_id=j1&world_size=4")
    '/v1/alerts?job_id=j1&world_size=4'
    >>> request_target("/v1/evidence")
    '/v1/evidence'
    """
    return f"{path}?{query}" if query else path


def canonical_string(method: str, path: str, tenant: str, cluster: str, timestamp: int, nonce: str,
                     body_hash: str) -> str:
    """The string that is signed.

    >>> canonical_string("post", "/v1/alerts", "acme", "c1", 1764547200, "n1", "ab")
    'v1\\nPOST\\n/v1/alerts\\nacme\\nc1\\n1764547200\\nn1\\nab'
    """
    return "\n".join((SIGNATURE_VERSION, method.upper(), path, tenant, cluster, str(timestamp), nonce,
                      body_hash))


def sign(secret: bytes, method: str, path: str, tenant: str, cluster: str, timestamp: int, nonce: str,
         body: bytes) -> str:
    """``v1=<hex HMAC-SHA256>`` of the canonical string of this request (``path`` is the request target)."""
    return _sign_hash(secret, method, path, tenant, cluster, timestamp, nonce, body_sha256(body))


def _sign_hash(secret: bytes, method: str, path: str, tenant: str, cluster: str, timestamp: int, nonce: str,
               body_hash: str) -> str:
    message = canonical_string(method, path, tenant, cluster, timestamp, nonce, body_hash)
    return f"{SIGNATURE_VERSION}=" + hmac.new(secret, message.encode(), hashlib.sha256).hexdigest()


def signed_headers(*, secret: bytes, key_id: str, tenant: str, cluster: str, method: str, path: str,
                   body: bytes, timestamp: int | None = None, nonce: str | None = None) -> dict[str, str]:
    """Every authentication header for one request (a fresh nonce and the current time by default)."""
    when = int(time.time()) if timestamp is None else timestamp
    once = nonce or secrets.token_hex(16)
    return {
        HEADER_TENANT: tenant,
        HEADER_CLUSTER: cluster,
        HEADER_KEY_ID: key_id,
        HEADER_TIMESTAMP: str(when),
        HEADER_NONCE: once,
        HEADER_SIGNATURE: sign(secret, method, path, tenant, cluster, when, once, body),
    }


def parse_signed_headers(headers: Mapping[str, str]) -> SignedHeaders:
    """Read and shape-check the headers; every missing or malformed one is named at once."""
    lowered = {k.lower(): v for k, v in headers.items()}
    names = (HEADER_TENANT, HEADER_CLUSTER, HEADER_KEY_ID, HEADER_TIMESTAMP, HEADER_NONCE, HEADER_SIGNATURE)
    values = {name: lowered.get(name.lower(), "").strip() for name in names}
    missing = [name for name, value in values.items() if not value]
    if missing:
        raise AuthenticationError(f"unsigned request: missing header(s) {', '.join(missing)}")
    problems = [name for name in (HEADER_TENANT, HEADER_CLUSTER, HEADER_KEY_ID, HEADER_NONCE)
                if not _FIELD.fullmatch(values[name])]
    if not values[HEADER_TIMESTAMP].isascii() or not values[HEADER_TIMESTAMP].isdigit():
        problems.append(f"{HEADER_TIMESTAMP} (Unix seconds expected)")
    signature = _HEX_SIGNATURE.fullmatch(values[HEADER_SIGNATURE])
    if signature is None:
        problems.append(f"{HEADER_SIGNATURE} (v1=<64 lowercase hex digits> expected)")
    if problems or signature is None:
        raise AuthenticationError(f"malformed header(s): {', '.join(problems)}")
    return SignedHeaders(tenant=values[HEADER_TENANT], cluster=values[HEADER_CLUSTER],
                         key_id=values[HEADER_KEY_ID], timestamp=int(values[HEADER_TIMESTAMP][:12]),
                         nonce=values[HEADER_NONCE], signature=signature.group(1))


def check_timestamp(timestamp: int, now: float, max_skew_s: int = MAX_CLOCK_SKEW_S) -> None:
    """Refuse a timestamp more than ``max_skew_s`` from the server's clock (either way)."""
    skew = timestamp - now
    if abs(skew) > max_skew_s:
        direction = "ahead of" if skew > 0 else "behind"
        raise AuthenticationError(f"the request timestamp is {abs(skew):.0f} s {direction} the server's "
                                  f"clock (at most {max_skew_s} s allowed); check the sender's clock")


def check_signature(secret: bytes, signed: SignedHeaders, method: str, path: str, body: bytes | None = None, *,
                    body_hash: str | None = None) -> None:
    """Compare in constant time; a mismatch names what to check, never the expected value.

    ``path`` is the request target (:func:`request_target`). Give the ``body``, or its
    ``body_hash`` when the body was hashed as it streamed to disk (it is never held whole).
    """
    if (body is None) == (body_hash is None):
        raise TypeError("check_signature takes exactly one of body and body_hash")
    digest = body_hash if body_hash is not None else body_sha256(body or b"")
    expected = _sign_hash(secret, method, path, signed.tenant, signed.cluster, signed.timestamp, signed.nonce, digest)
    if not hmac.compare_digest(expected.encode(), f"{SIGNATURE_VERSION}={signed.signature}".encode()):
        raise AuthenticationError("the signature does not match this request: the body, path, query, headers "
                                  "or secret differ from what was signed")
