"""Stack evidence read straight from S3 (a real moto HTTP server), as the flow reads uploads."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import boto3
import pytest
from moto.server import ThreadedMotoServer

from denpex.analysis.stack_findings import stack_findings
from denpex.evidence.stacks import MAX_BYTES, StackSource, read_stack_evidence
from denpex.evidence.store import open_store

SAMPLE = Path(__file__).parent.parent / "fixtures" / "stacks" / "stacks_20261202_190811.txt"


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def test_stacks_from_s3_with_a_hostile_file_set_aside(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1", "DENPEX_S3_ENDPOINT_URL": endpoint}.items():
        monkeypatch.setenv(key, value)
    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket="evidence")
    client.put_object(Bucket="evidence", Key=f"inc-1/{SAMPLE.name}", Body=SAMPLE.read_bytes())
    mine = {"rank": 2, "source": "collector", "threads": [
        {"name": "MainThread", "frames": [{"file": "/job/data.py", "line": 45, "function": "next_batch"}]}]}
    client.put_object(Bucket="evidence", Key="inc-1/collector/rank_2.stacks.json", Body=json.dumps(mine).encode())
    client.put_object(Bucket="evidence", Key="inc-1/collector/rank_3.stacks.json", Body=b" " * (MAX_BYTES + 1))
    client.put_object(Bucket="evidence", Key="inc-1/collector/rank_3.record.json", Body=b"{}")

    evidence = read_stack_evidence(open_store("s3://evidence/inc-1"), at=datetime(2026, 12, 2, 19, 8, tzinfo=UTC))
    assert evidence.debug_file == SAMPLE.name
    assert list(evidence.refused) == ["rank_3.stacks.json"] and "over the limit" in evidence.refused["rank_3.stacks.json"]
    found = stack_findings(evidence.records, stuck_groups={"0": [0, 1, 2, 3]}, candidates=[2])
    assert found.candidate_stacks[2].source is StackSource.COLLECTOR
    assert [g.ranks for g in found.stack_groups] == [[0, 1, 3], [2]]
    assert [o.rank for o in found.outliers["0"]] == [2]
