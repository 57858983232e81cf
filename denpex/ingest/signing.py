"""Signed requests: HMAC-SHA256 over a canonical string, as docs/contracts.md fixes it.

Two versions, told apart by the prefix of ``X-Denpex-Signature``::

    v1=<hex>  v1\\n{METHOD}\\n{PATH}\\n{tenant}\\n{cluster}\\n{timestamp}\\n{nonce}\\n{sha256 hex of body}
    v2=<hex>  v2\\n{METHOD}\\n{PATH}\\n{tenant}\\n{cluster}\\n{timestamp}\\n{nonce}\\n{length}\\n{sha256 hex of body}

A v1 signature can only be checked once the whole body has arrived, so the server has to take the
body (up to 256 MiB) from anyone who names a key id. A v2 request declares the body's length and
SHA-256 in two more headers, ``X-Denpex-Content-Length`` and ``X-Denpex-Content-SHA256``, and
signs them: the server checks the signature from the headers alone, before it reserves or reads
anything, and then checks the body it streams against the declared digest and length. Denpex's
own clients send v2; v1 is accepted within a small allowance until it goes away (docs/contracts.md).

``PATH`` is the request target: the path, and, when the request has a query string, ``?`` and the
query string exactly as sent (:func:`request_target`). A request without a query signs as it
always did; one whose query was changed after signing no longer matches. The signature travels
beside ``X-Denpex-Tenant``, ``X-Denpex-Cluster``, ``X-Denpex-Key-Id``, ``X-Denpex-Timestamp``
(Unix seconds) and ``X-Denpex-Nonce``.

The fixed test vectors (secret, request, expected signature) are in the README,
docs/contracts.md and ``tests/ingest/test_signing.py``.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Mapping
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from denpex.ingest.errors import AuthenticationError

__all__ = [
    "SIGNATURE_VERSION",
    "SignatureVersion",
    "MAX_CLOCK_SKEW_S",
    "HEADER_TENANT",
    "HEADER_CLUSTER",
    "HEADER_KEY_ID",
    "HEADER_TIMESTAMP",
    "HEADER_NONCE",
    "HEADER_SIGNATURE",
    "HEADER_CONTENT_LENGTH",
    "HEADER_CONTENT_SHA256",
    "DeclaredBody",
    "SignedHeaders",
    "canonical_string",
    "canonical_string_v2",
    "body_sha256",
    "request_target",
    "sign",
    "sign_v2",
    "signed_headers",
    "parse_signed_headers",
    "check_signature",
    "check_body",
    "check_timestamp",
]

SIGNATURE_VERSION = "v1"
"""The first version; :func:`sign` and :func:`canonical_string` make it (the contract's first vector)."""
MAX_CLOCK_SKEW_S = 300
HEADER_TENANT = "X-Denpex-Tenant"
HEADER_CLUSTER = "X-Denpex-Cluster"
HEADER_KEY_ID = "X-Denpex-Key-Id"
HEADER_TIMESTAMP = "X-Denpex-Timestamp"
HEADER_NONCE = "X-Denpex-Nonce"
HEADER_SIGNATURE = "X-Denpex-Signature"
HEADER_CONTENT_LENGTH = "X-Denpex-Content-Length"
HEADER_CONTENT_SHA256 = "X-Denpex-Content-SHA256"


class SignatureVersion(StrEnum):
    """How a request is signed (the prefix of ``X-Denpex-Signature``)."""

    V1 = "v1"
    """Over the body's hash only: checkable once the whole body arrived. Deprecated."""
    V2 = "v2"
    """Over the declared length and hash too: checkable from the headers, before the body."""


# Newlines in a field would let one canonical string read as another; the nonce is also a key
# of the replay cache, so it is kept short and printable.
_FIELD = re.compile(r"[A-Za-z0-9._:@-]{1,128}")
_HEX_SIGNATURE = re.compile(r"(v1|v2)=([0-9a-f]{64})")
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")
# A length is decimal digits without a sign or leading zeros (one spelling per number), at most 15 of them.
_LENGTH = re.compile(r"0|[1-9][0-9]{0,14}")


class DeclaredBody(BaseModel):
    """The body a v2 request signed for: its length in bytes and its SHA-256 (hex)."""

    model_config = ConfigDict(frozen=True)

    length: int
    sha256: str


class SignedHeaders(BaseModel):
    """The authentication headers of one request, parsed and shape-checked."""

    model_config = ConfigDict(frozen=True)

    tenant: str
    cluster: str
    key_id: str
    timestamp: int
    nonce: str
    signature: str
    """The hex digest after ``v1=`` or ``v2=``."""
    version: SignatureVersion = SignatureVersion.V1
    declared: DeclaredBody | None = None
    """The body a v2 request declares (None for v1)."""


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
    """The string a v1 signature signs.

    >>> canonical_string("post", "/v1/alerts", "acme", "c1", 1764547200, "n1", "ab")
    'v1\\nPOST\\n/v1/alerts\\nacme\\nc1\\n1764547200\\nn1\\nab'
    """
    return "\n".join((SIGNATURE_VERSION, method.upper(), path, tenant, cluster, str(timestamp), nonce,
                      body_hash))


def canonical_string_v2(method: str, path: str, tenant: str, cluster: str, timestamp: int, nonce: str,
                        declared: DeclaredBody) -> str:
    """The string a v2 signature signs: v1's fields, with the body's declared length before its hash.

    >>> canonical_string_v2("post", "/v1/alerts", "acme", "c1", 1764547200, "n1", DeclaredBody(length=5, sha256="ab"))
    'v2\\nPOST\\n/v1/alerts\\nacme\\nc1\\n1764547200\\nn1\\n5\\nab'
    """
    return "\n".join((SignatureVersion.V2.value, method.upper(), path, tenant, cluster, str(timestamp), nonce,
                      str(declared.length), declared.sha256))


def sign(secret: bytes, method: str, path: str, tenant: str, cluster: str, timestamp: int, nonce: str,
         body: bytes) -> str:
    """``v1=<hex HMAC-SHA256>`` of the canonical string of this request (``path`` is the request target)."""
    return _hmac(secret, SignatureVersion.V1, canonical_string(method, path, tenant, cluster, timestamp, nonce,
                                                               body_sha256(body)))


def sign_v2(secret: bytes, method: str, path: str, tenant: str, cluster: str, timestamp: int, nonce: str,
            body: bytes) -> str:
    """``v2=<hex HMAC-SHA256>`` of the v2 canonical string (the body's length and hash declared)."""
    declared = DeclaredBody(length=len(body), sha256=body_sha256(body))
    return _hmac(secret, SignatureVersion.V2, canonical_string_v2(method, path, tenant, cluster, timestamp, nonce,
                                                                  declared))


def _hmac(secret: bytes, version: SignatureVersion, message: str) -> str:
    return f"{version.value}=" + hmac.new(secret, message.encode(), hashlib.sha256).hexdigest()


def signed_headers(*, secret: bytes, key_id: str, tenant: str, cluster: str, method: str, path: str,
                   body: bytes, timestamp: int | None = None, nonce: str | None = None,
                   version: SignatureVersion = SignatureVersion.V2) -> dict[str, str]:
    """Every authentication header for one request (a fresh nonce and the current time by default);
    v2 unless ``version`` asks for v1 (an old client's request, in tests)."""
    when = int(time.time()) if timestamp is None else timestamp
    once = nonce or secrets.token_hex(16)
    headers = {HEADER_TENANT: tenant, HEADER_CLUSTER: cluster, HEADER_KEY_ID: key_id, HEADER_TIMESTAMP: str(when),
               HEADER_NONCE: once}
    if version is SignatureVersion.V1:
        return headers | {HEADER_SIGNATURE: sign(secret, method, path, tenant, cluster, when, once, body)}
    return headers | {HEADER_CONTENT_LENGTH: str(len(body)), HEADER_CONTENT_SHA256: body_sha256(body),
                      HEADER_SIGNATURE: sign_v2(secret, method, path, tenant, cluster, when, once, body)}


def parse_signed_headers(headers: Mapping[str, str]) -> SignedHeaders:
    """Read and shape-check the headers; every missing or malformed one is named at once."""
    lowered = {k.lower(): v for k, v in headers.items()}
    names = (HEADER_TENANT, HEADER_CLUSTER, HEADER_KEY_ID, HEADER_TIMESTAMP, HEADER_NONCE, HEADER_SIGNATURE)
    values = {name: lowered.get(name.lower(), "").strip() for name in names}
    signature = _HEX_SIGNATURE.fullmatch(values[HEADER_SIGNATURE])
    v2 = signature is not None and signature.group(1) == SignatureVersion.V2.value
    if v2:
        values |= {name: lowered.get(name.lower(), "").strip() for name in (HEADER_CONTENT_LENGTH, HEADER_CONTENT_SHA256)}
    missing = [name for name, value in values.items() if not value]
    if missing:
        raise AuthenticationError(f"unsigned request: missing header(s) {', '.join(missing)}")
    problems = [name for name in (HEADER_TENANT, HEADER_CLUSTER, HEADER_KEY_ID, HEADER_NONCE)
                if not _FIELD.fullmatch(values[name])]
    if not values[HEADER_TIMESTAMP].isascii() or not values[HEADER_TIMESTAMP].isdigit():
        problems.append(f"{HEADER_TIMESTAMP} (Unix seconds expected)")
    if signature is None:
        problems.append(f"{HEADER_SIGNATURE} (v2=<64 lowercase hex digits> expected, or v1=...)")
    if v2 and not _LENGTH.fullmatch(values[HEADER_CONTENT_LENGTH]):
        problems.append(f"{HEADER_CONTENT_LENGTH} (the body's length in bytes expected)")
    if v2 and not _HEX_DIGEST.fullmatch(values[HEADER_CONTENT_SHA256]):
        problems.append(f"{HEADER_CONTENT_SHA256} (64 lowercase hex digits expected)")
    if problems or signature is None:
        raise AuthenticationError(f"malformed header(s): {', '.join(problems)}")
    declared = DeclaredBody(length=int(values[HEADER_CONTENT_LENGTH]), sha256=values[HEADER_CONTENT_SHA256]) if v2 else None
    return SignedHeaders(tenant=values[HEADER_TENANT], cluster=values[HEADER_CLUSTER],
                         key_id=values[HEADER_KEY_ID], timestamp=int(values[HEADER_TIMESTAMP][:12]),
                         nonce=values[HEADER_NONCE], signature=signature.group(2),
                         version=SignatureVersion(signature.group(1)), declared=declared)


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

    ``path`` is the request target (:func:`request_target`). A v1 signature needs the ``body``, or
    its ``body_hash`` when the body was hashed as it streamed to disk (it is never held whole). A
    v2 signature is checked from the headers alone (its declared body); a ``body`` or ``body_hash``
    given as well must be the declared one.
    """
    if signed.version is SignatureVersion.V2 and signed.declared is not None:
        message = canonical_string_v2(method, path, signed.tenant, signed.cluster, signed.timestamp, signed.nonce,
                                      signed.declared)
        _compare(_hmac(secret, SignatureVersion.V2, message), signed)
        if body is not None:
            check_body(signed.declared, size=len(body), sha256=body_sha256(body))
        elif body_hash is not None and not hmac.compare_digest(body_hash, signed.declared.sha256):
            check_body(signed.declared, size=signed.declared.length, sha256=body_hash)
        return
    if (body is None) == (body_hash is None):
        raise TypeError("check_signature takes exactly one of body and body_hash for a v1 signature")
    digest = body_hash if body_hash is not None else body_sha256(body or b"")
    message = canonical_string(method, path, signed.tenant, signed.cluster, signed.timestamp, signed.nonce, digest)
    _compare(_hmac(secret, SignatureVersion.V1, message), signed)


def _compare(expected: str, signed: SignedHeaders) -> None:
    if not hmac.compare_digest(expected.encode(), f"{signed.version.value}={signed.signature}".encode()):
        raise AuthenticationError("the signature does not match this request: the body, path, query, headers "
                                  "or secret differ from what was signed")


def check_body(declared: DeclaredBody, *, size: int, sha256: str) -> None:
    """A v2 request's body, as it arrived, against the length and digest its signature covers (401)."""
    if size != declared.length or not hmac.compare_digest(sha256, declared.sha256):
        what = f"{size:,} bytes" if size != declared.length else "other bytes"
        raise AuthenticationError(f"the body does not match its signed {HEADER_CONTENT_LENGTH} and "
                                  f"{HEADER_CONTENT_SHA256}: {what} arrived where {declared.length:,} were signed "
                                  "(changed or cut short after signing); nothing was stored")
