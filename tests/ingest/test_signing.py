"""The signing contract of ARCHITECTURE.md, with the fixed test vector of the README."""

from __future__ import annotations

import subprocess

import pytest

from denpex.ingest.errors import AuthenticationError
from denpex.ingest.signing import (
    body_sha256,
    canonical_string,
    check_signature,
    check_timestamp,
    parse_signed_headers,
    request_target,
    sign,
    signed_headers,
)

# The README's test vector: anyone writing a collector in another language checks against it.
VECTOR_SECRET = b"denpex-test-secret"
VECTOR_REQUEST = dict(method="POST", path="/v1/evidence", tenant="acme", cluster="c1",
                      timestamp=1764547200, nonce="n-0001", body=b"hello")
VECTOR_SIGNATURE = "v1=b2eec23203945131bf3ac39351f1afcb0d66a1672812e7aeefa7569d608e54be"


def test_the_fixed_vector() -> None:
    assert sign(VECTOR_SECRET, **VECTOR_REQUEST) == VECTOR_SIGNATURE  # type: ignore[arg-type]


def test_the_vector_agrees_with_openssl() -> None:
    """An implementation that is not ours computes the same digest from the canonical string."""
    message = canonical_string("POST", "/v1/evidence", "acme", "c1", 1764547200, "n-0001", body_sha256(b"hello"))
    out = subprocess.run(["openssl", "dgst", "-sha256", "-hmac", VECTOR_SECRET.decode()],
                         input=message.encode(), capture_output=True, check=True).stdout.decode()
    assert out.strip().endswith(VECTOR_SIGNATURE.removeprefix("v1="))


def test_canonical_string_layout() -> None:
    assert canonical_string("get", "/v1/incidents/i-1", "t", "c", 5, "n", "h") == "v1\nGET\n/v1/incidents/i-1\nt\nc\n5\nn\nh"


def _signed(**overrides: object) -> dict[str, str]:
    args: dict[str, object] = dict(secret=VECTOR_SECRET, key_id="dk_1", tenant="acme", cluster="c1",
                                   method="POST", path="/v1/evidence", body=b"hello", timestamp=1764547200,
                                   nonce="n-0001")
    args.update(overrides)
    return signed_headers(**args)  # type: ignore[arg-type]


def test_headers_round_trip_and_verify() -> None:
    parsed = parse_signed_headers(_signed())
    assert (parsed.tenant, parsed.cluster, parsed.key_id, parsed.nonce) == ("acme", "c1", "dk_1", "n-0001")
    check_signature(VECTOR_SECRET, parsed, "POST", "/v1/evidence", b"hello")


@pytest.mark.parametrize("method, path, body, secret", [
    ("POST", "/v1/evidence", b"hellO", VECTOR_SECRET),
    ("PUT", "/v1/evidence", b"hello", VECTOR_SECRET),
    ("POST", "/v1/alerts", b"hello", VECTOR_SECRET),
    ("POST", "/v1/evidence", b"hello", b"another-secret"),
], ids=["tampered-body", "method", "path", "secret"])
def test_any_change_breaks_the_signature(method: str, path: str, body: bytes, secret: bytes) -> None:
    with pytest.raises(AuthenticationError, match="does not match"):
        check_signature(secret, parse_signed_headers(_signed()), method, path, body)


def test_missing_and_malformed_headers_are_all_named() -> None:
    with pytest.raises(AuthenticationError, match="X-Denpex-Nonce, X-Denpex-Signature"):
        parse_signed_headers({k: v for k, v in _signed().items() if k not in ("X-Denpex-Nonce", "X-Denpex-Signature")})
    bad = _signed() | {"X-Denpex-Timestamp": "yesterday", "X-Denpex-Signature": "v2=abc", "X-Denpex-Tenant": "a\nb"}
    with pytest.raises(AuthenticationError) as caught:
        parse_signed_headers(bad)
    for name in ("X-Denpex-Tenant", "X-Denpex-Timestamp", "X-Denpex-Signature"):
        assert name in str(caught.value)


@pytest.mark.parametrize("skew, ok", [(0, True), (300, True), (-300, True), (301, False), (-301, False)])
def test_clock_skew_window(skew: int, ok: bool) -> None:
    if ok:
        check_timestamp(1_000_000 + skew, 1_000_000)
    else:
        with pytest.raises(AuthenticationError, match="300 s"):
            check_timestamp(1_000_000 + skew, 1_000_000)


def test_the_request_target_carries_the_query_as_sent() -> None:
    """Issue 16, finding 9: ``{PATH}`` is the path plus ``?query``; without a query it is the path alone."""
    assert request_target("/v1/evidence") == "/v1/evidence"
    target = request_target("/v1/alerts", "job_id=job-1&world_size=4")
    assert target == "/v1/alerts?job_id=job-1&world_size=4"
    assert canonical_string("POST", target, "acme", "c1", 1, "n", "h").split("\n")[2] == target
    # The fixed vector has no query, so it holds as before.
    assert sign(VECTOR_SECRET, **{**VECTOR_REQUEST, "path": request_target("/v1/evidence", "")}) == VECTOR_SIGNATURE  # type: ignore[arg-type]


def test_a_changed_query_breaks_the_signature() -> None:
    headers = parse_signed_headers(_signed(path="/v1/alerts?job_id=job-1"))
    check_signature(VECTOR_SECRET, headers, "POST", "/v1/alerts?job_id=job-1", b"hello")
    for changed in ("/v1/alerts?job_id=job-2", "/v1/alerts", "/v1/alerts?job_id=job-1&world_size=4"):
        with pytest.raises(AuthenticationError, match="does not match"):
            check_signature(VECTOR_SECRET, headers, "POST", changed, b"hello")


def test_a_streamed_body_is_checked_by_its_hash() -> None:
    headers = parse_signed_headers(_signed())
    check_signature(VECTOR_SECRET, headers, "POST", "/v1/evidence", body_hash=body_sha256(b"hello"))
    with pytest.raises(AuthenticationError, match="does not match"):
        check_signature(VECTOR_SECRET, headers, "POST", "/v1/evidence", body_hash=body_sha256(b"hellO"))
