"""Triage straight from S3 (a real moto HTTP server), including a flaky endpoint."""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterator

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.config import Config
from moto.server import ThreadedMotoServer

from denpex.analysis.models import Verdict
from denpex.analysis.triage import triage_store
from denpex.evidence.errors import DumpError, EvidenceSourceError
from denpex.evidence.stacks import StackSource
from denpex.evidence.store import S3Store
from dumps import dump, history


class _EmptyBody:
    def stream(self, **_: object) -> Iterator[bytes]:
        yield b""


def _unavailable(url: str) -> AWSResponse:
    return AWSResponse(url, 503, {}, _EmptyBody())


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3(endpoint: str, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    # The stores here are given this client: a store reopened from its URI instead would reach
    # the default endpoint, here a closed local port, and fail at once rather than go to AWS.
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1",
                       "DENPEX_S3_ENDPOINT_URL": "http://127.0.0.1:9"}.items():
        monkeypatch.setenv(key, value)
    # Three attempts: enough for the flaky case (two failures), few backoff sleeps for the broken one.
    client = boto3.client("s3", endpoint_url=endpoint, config=Config(retries={"max_attempts": 3, "mode": "standard"}))
    client.create_bucket(Bucket="evidence")
    for rank in range(4):
        body = dump(history("0", 5, pending=0 if rank == 1 else 1))
        client.put_object(Bucket="evidence", Key=f"incident-7/rank_{rank}.pkl",
                          Body=pickle.dumps(body, protocol=2))
    client.put_object(Bucket="evidence", Key="incident-7/manifest.json", Body=b'{"world_size": 4}')
    client.put_object(Bucket="evidence", Key="incident-8/rank_0.pkl", Body=b"unrelated")
    return client


def test_a_rewrite_at_the_same_size_gets_a_new_version(s3) -> None:  # noqa: ANN001
    """What tells a re-dump from the first dump when both land in the same second at one size."""
    store = S3Store("evidence", "incident-9", client=s3)
    store.write("rank_0.pkl", b"ab")
    (first,) = store.list()
    store.write("rank_0.pkl", b"cd")
    (second,) = store.list()
    assert first.size == second.size and first.version and second.version
    assert first.version != second.version


def test_triage_from_s3(s3) -> None:  # noqa: ANN001
    result = triage_store(S3Store("evidence", "incident-7", client=s3))
    assert result.verdict is Verdict.LOCALIZED
    assert [c.rank for c in result.candidates] == [1]
    assert result.skipped_files == []


def test_every_read_of_a_triage_goes_through_the_store_it_was_given(s3) -> None:  # noqa: ANN001
    """The stacks, the collector's records and FR's call sites are read with the store's own client
    (a store given a client once reached AWS's default endpoint for them: minutes of retries)."""
    mine = {"rank": 1, "source": "collector", "threads": [
        {"name": "MainThread", "frames": [{"file": "/job/data.py", "line": 45, "function": "next_batch"}]}]}
    s3.put_object(Bucket="evidence", Key="incident-7/collector/rank_1.stacks.json", Body=json.dumps(mine).encode())
    read: list[str] = []

    def seen(request, **_: object) -> None:  # noqa: ANN001
        read.append(request.url.rsplit("/incident-7/", 1)[-1])

    s3.meta.events.register("before-send.s3.GetObject", seen)
    try:
        result = triage_store(S3Store("evidence", "incident-7", client=s3))
    finally:
        s3.meta.events.unregister("before-send.s3.GetObject", seen)
        s3.delete_object(Bucket="evidence", Key="incident-7/collector/rank_1.stacks.json")
    (culprit,) = result.candidates
    assert culprit.stack is not None and culprit.stack.source is StackSource.COLLECTOR
    assert "collector/rank_1.stacks.json" in read
    # The waiting peers' dumps are read a second time, for FR's call sites of the stuck op.
    assert read.count("rank_0.pkl") == 2 and read.count("rank_2.pkl") == 2
    assert not [n for n in result.notes if "cannot" in n]


def test_a_folder_of_an_s3_store_keeps_its_client_and_stays_inside(s3) -> None:  # noqa: ANN001
    store = S3Store("evidence", "incident-7", client=s3)
    sub = store.folder("scratch")
    assert sub.uri == "s3://evidence/incident-7/scratch"
    sub.write("x.json", b"{}")
    assert [o.name for o in sub.list()] == ["x.json"]
    for hostile in ("../incident-8", "/etc", "a/../../b", "", ".", "a//b", "a/"):
        with pytest.raises(EvidenceSourceError, match="escapes"):
            store.folder(hostile)


def test_flaky_s3_is_retried(s3) -> None:  # noqa: ANN001
    failures = {"left": 2}

    def flake(request, **_: object) -> AWSResponse | None:  # noqa: ANN001
        if failures["left"] > 0 and request.method == "GET" and "rank_2" in request.url:
            failures["left"] -= 1
            return _unavailable(request.url)
        return None

    s3.meta.events.register("before-send.s3.GetObject", flake)
    try:
        result = triage_store(S3Store("evidence", "incident-7", client=s3))
    finally:
        s3.meta.events.unregister("before-send.s3.GetObject", flake)
    assert failures["left"] == 0
    assert result.ranks_with_evidence == [0, 1, 2, 3]


def test_s3_that_keeps_failing_is_reported_per_file(s3) -> None:  # noqa: ANN001
    def broken(request, **_: object) -> AWSResponse | None:  # noqa: ANN001
        return _unavailable(request.url) if "rank_3" in request.url else None

    s3.meta.events.register("before-send.s3.GetObject", broken)
    try:
        result = triage_store(S3Store("evidence", "incident-7", client=s3))
    finally:
        s3.meta.events.unregister("before-send.s3.GetObject", broken)
    assert result.missing_ranks == [3]
    assert "cannot read" in result.skipped_files[0].reason


def test_missing_bucket_is_a_clear_error(s3) -> None:  # noqa: ANN001
    with pytest.raises(EvidenceSourceError, match="s3://nope/x: cannot list"):
        S3Store("nope", "x", client=s3).list()
    with pytest.raises(DumpError, match="cannot read"):
        S3Store("evidence", "incident-7", client=s3).read("absent", max_bytes=10)


def test_the_operator_sets_the_attempts_as_for_any_aws_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Five retries in standard mode by default; AWS_MAX_ATTEMPTS and AWS_RETRY_MODE win when set
    (the test API runs with AWS_MAX_ATTEMPTS=2, so a stopped moto is refused in seconds)."""
    from denpex.evidence.store import _s3_client

    monkeypatch.delenv("AWS_MAX_ATTEMPTS", raising=False)
    monkeypatch.delenv("AWS_RETRY_MODE", raising=False)
    assert _s3_client("http://127.0.0.1:9").meta.config.retries == {"total_max_attempts": 6, "mode": "standard"}
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    monkeypatch.setenv("AWS_RETRY_MODE", "adaptive")
    assert _s3_client("http://127.0.0.1:9").meta.config.retries == {"total_max_attempts": 2, "mode": "adaptive"}
