"""The signing contract of ARCHITECTURE.md, with the fixed test vector of the README."""

from __future__ import annotations

import subprocess

import pytest

from denpex.ingest.errors import AuthenticationError
from denpex.ingest.signing import (
    DeclaredBody,
    SignatureVersion,
    body_sha256,
    canonical_string,
    canonical_string_v2,
    check_body,
    check_signature,
    check_timestamp,
    parse_signed_headers,
    request_target,
    sign,
    sign_v2,
    signed_headers,
)

# The README's test vector: anyone writing a collector in another language checks against it.
VECTOR_SECRET = b"denpex-test-secret"
VECTOR_REQUEST = dict(method="POST", path="/v1/evidence", tenant="acme", cluster="c1",
                      timestamp=1764547200, nonce="n-0001", body=b"hello")
VECTOR_SIGNATURE = "v1=b2eec23203945131bf3ac39351f1afcb0d66a1672812e7aeefa7569d608e54be"
# The v2 vector (issue 30): the same request, its body declared as 5 bytes and their SHA-256.
VECTOR_SIGNATURE_V2 = "v2=177252d4c3dab4f741eeb4bb26715e07a8fd468d4948bc7e55d66ea36d401176"


def test_the_fixed_vector() -> None:
    assert sign(VECTOR_SECRET, **VECTOR_REQUEST) == VECTOR_SIGNATURE  # type: ignore[arg-type]


def test_the_vector_agrees_with_openssl() -> None:
    """An implementation that is not ours computes the same digest from the canonical string."""
    message = canonical_string("POST", "/v1/evidence", "acme", "c1", 1764547200, "n-0001", body_sha256(b"hello"))
    out = subprocess.run(["openssl", "dgst", "-sha256", "-hmac", VECTOR_SECRET.decode()],
                         input=message.encode(), capture_output=True, check=True).stdout.decode()
    assert out.strip().endswith(VECTOR_SIGNATURE.removeprefix("v1="))


def test_the_fixed_v2_vector_agrees_with_openssl() -> None:
    assert sign_v2(VECTOR_SECRET, **VECTOR_REQUEST) == VECTOR_SIGNATURE_V2  # type: ignore[arg-type]
    message = "v2\nPOST\n/v1/evidence\nacme\nc1\n1764547200\nn-0001\n5\n" + body_sha256(b"hello")
    assert message == canonical_string_v2("POST", "/v1/evidence", "acme", "c1", 1764547200, "n-0001",
                                          DeclaredBody(length=5, sha256=body_sha256(b"hello")))
    out = subprocess.run(["openssl", "dgst", "-sha256", "-hmac", VECTOR_SECRET.decode()],
                         input=message.encode(), capture_output=True, check=True).stdout.decode()
    assert out.strip().endswith(VECTOR_SIGNATURE_V2.removeprefix("v2="))


def test_a_v2_signature_is_checked_from_the_headers_alone() -> None:
    """Issue 30, §2: the declared length and digest are signed, so the body is not needed to verify."""
    headers = _signed(version=SignatureVersion.V2)
    assert headers["X-Denpex-Content-Length"] == "5" and headers["X-Denpex-Signature"] == VECTOR_SIGNATURE_V2
    parsed = parse_signed_headers(headers)
    assert parsed.version is SignatureVersion.V2 and parsed.declared == DeclaredBody(length=5, sha256=body_sha256(b"hello"))
    check_signature(VECTOR_SECRET, parsed, "POST", "/v1/evidence")
    check_signature(VECTOR_SECRET, parsed, "POST", "/v1/evidence", b"hello")
    declared_other = {"X-Denpex-Content-Length": "6", "X-Denpex-Content-SHA256": body_sha256(b"hello!")}
    for changed in (headers | declared_other, headers | {"X-Denpex-Content-Length": "6"},
                    headers | {"X-Denpex-Signature": "v1=" + VECTOR_SIGNATURE_V2[3:]}):
        with pytest.raises(AuthenticationError, match="does not match"):
            check_signature(VECTOR_SECRET, parse_signed_headers(changed), "POST", "/v1/evidence", b"hello")
    with pytest.raises(AuthenticationError, match="does not match its signed"):
        check_signature(VECTOR_SECRET, parsed, "POST", "/v1/evidence", b"hellO")


@pytest.mark.parametrize("size, body, words", [(5, b"hellO", "other bytes"), (4, b"hell", "4 bytes arrived"),
                                               (6, b"hello!", "6 bytes arrived")], ids=["bytes", "short", "long"])
def test_a_v2_body_must_be_exactly_the_declared_one(size: int, body: bytes, words: str) -> None:
    declared = DeclaredBody(length=5, sha256=body_sha256(b"hello"))
    check_body(declared, size=5, sha256=body_sha256(b"hello"))
    with pytest.raises(AuthenticationError, match=words):
        check_body(declared, size=size, sha256=body_sha256(body))


def test_v2_headers_are_all_named_when_missing_or_malformed() -> None:
    headers = _signed(version=SignatureVersion.V2)
    with pytest.raises(AuthenticationError, match="X-Denpex-Content-Length, X-Denpex-Content-SHA256"):
        parse_signed_headers({k: v for k, v in headers.items() if not k.startswith("X-Denpex-Content")})
    bad = headers | {"X-Denpex-Content-Length": "+5", "X-Denpex-Content-SHA256": "AB" * 32}
    with pytest.raises(AuthenticationError) as caught:
        parse_signed_headers(bad)
    assert "X-Denpex-Content-Length" in str(caught.value) and "X-Denpex-Content-SHA256" in str(caught.value)
    for length in ("05", "1e3", "-1", "1" * 16):
        with pytest.raises(AuthenticationError, match="X-Denpex-Content-Length"):
            parse_signed_headers(headers | {"X-Denpex-Content-Length": length})


def test_v1_still_verifies_and_ignores_content_headers() -> None:
    """A v1 client is unchanged: its signature covers the body, whatever else the headers hold."""
    headers = _signed(version=SignatureVersion.V1)
    assert headers["X-Denpex-Signature"] == VECTOR_SIGNATURE and "X-Denpex-Content-SHA256" not in headers
    parsed = parse_signed_headers(headers | {"X-Denpex-Content-Length": "nonsense"})
    assert parsed.version is SignatureVersion.V1 and parsed.declared is None
    check_signature(VECTOR_SECRET, parsed, "POST", "/v1/evidence", b"hello")


def test_canonical_string_layout() -> None:
    assert canonical_string("get", "/v1/incidents/i-1", "t", "c", 5, "n", "h") == "v1\nGET\n/v1/incidents/i-1\nt\nc\n5\nn\nh"


def _signed(**overrides: object) -> dict[str, str]:
    args: dict[str, object] = dict(secret=VECTOR_SECRET, key_id="dk_1", tenant="acme", cluster="c1",
                                   method="POST", path="/v1/evidence", body=b"hello", timestamp=1764547200,
                                   nonce="n-0001", version=SignatureVersion.V1)
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
    bad = _signed() | {"X-Denpex-Timestamp": "yesterday", "X-Denpex-Signature": "v3=abc", "X-Denpex-Tenant": "a\nb"}
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
