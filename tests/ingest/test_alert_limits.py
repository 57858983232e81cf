"""Issue 16, finding 8: one request, or one misfiring rule, cannot start thousands of runs.

A real ``serve-api`` with a real Prefect engine: 300 alerts of 300 incidents in one
Alertmanager post are refused before any run starts (429, recorded), and a cluster's runs per
window are capped, the excess answered 429 with Retry-After and recorded, never dropped.
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator

import httpx
import pytest

from denpex.ingest.client import IngestClient
from denpex.ingest.incidents import IncidentBook
from ingest.conftest import Engine, Lab, make_lab
from testkit.services.s3 import MotoS3

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory, s3: MotoS3, engine: Engine) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("limits")
    lab = make_lab(tmp, s3, engine, prefix=tmp.name, extra_args=["--max-runs-per-window", "2"])
    yield lab
    lab.api.stop(signal.SIGTERM)


def _alert(incident: str) -> dict[str, object]:
    return {"status": "firing", "labels": {"alertname": "NCCLWatchdogTimeout", "job_id": "job-1",
                                           "incident_id": incident, "rank": "0"},
            "startsAt": "2026-12-01T13:09:14Z"}


def _book(lab: Lab) -> IncidentBook:
    return IncidentBook(lab.registry.db)


def test_one_post_of_300_incidents_starts_nothing_and_is_recorded(limited: Lab) -> None:
    incidents = [f"inc-{uuid.uuid4().hex[:10]}" for _ in range(300)]
    payload = {"version": "4", "status": "firing", "receiver": "denpex", "alerts": [_alert(i) for i in incidents]}
    bearer = {"Authorization": f"Bearer {limited.token.token}"}
    answer = httpx.post(f"{limited.url}/v1/alerts", json=payload, headers=bearer, timeout=30)
    assert answer.status_code in (413, 429), answer.text
    assert "nothing was started" in answer.json()["error"]
    assert answer.status_code == 413 or int(answer.headers["Retry-After"]) >= 1
    client = IngestClient(limited.url, key_id=limited.key.key_id, secret=limited.key.secret, tenant="acme",
                          cluster="c1")
    assert client.incident(incidents[0]).status_code == 404
    [(_, status, count, reason)] = _book(limited).refusals("acme", "c1")
    assert (status, count) == (answer.status_code, 300) and "300" in reason


def test_a_clusters_runs_per_window_are_capped_and_the_excess_is_429(limited: Lab) -> None:
    client = IngestClient(limited.url, key_id=limited.key.key_id, secret=limited.key.secret, tenant="acme",
                          cluster="c1")
    answers = [client.alert({"job_id": "job-1", "incident_id": f"inc-{uuid.uuid4().hex[:10]}", "rank": 0})
               for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429], [a.text for a in answers]
    assert all(a.json()["alerts"][0]["run_started"] for a in answers[:2])
    assert int(answers[2].headers["Retry-After"]) > 60
    assert "limit of 2" in answers[2].json()["error"]
    # A repeat of an incident that runs already costs nothing and is still answered.
    first = answers[0].json()["alerts"][0]["incident_id"]
    repeat = client.alert({"job_id": "job-1", "incident_id": first, "rank": 1})
    assert repeat.status_code == 200 and repeat.json()["alerts"][0]["run_started"] is False
    reasons = [r[3] for r in _book(limited).refusals("acme", "c1")]
    assert any("limit of 2" in r for r in reasons)
    # Another cluster of the tenant has its own window.
    other = IngestClient(limited.url, key_id=limited.other_cluster_key.key_id,
                         secret=limited.other_cluster_key.secret, tenant="acme", cluster="c2")
    assert other.alert({"job_id": "job-9", "incident_id": f"inc-{uuid.uuid4().hex[:10]}"}).status_code == 200
