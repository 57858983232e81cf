"""The ingest API against the real HTTP server (``denpex serve-api``) on loopback, moto S3, Prefect.

The checks of issue 11: valid upload; bad, expired and replayed signatures; a tampered body; a
cross-tenant and a cross-cluster key; each non-Data-Center tier refused; a hostile pickle refused;
an oversized body refused; a duplicate upload; a duplicate alert starting one run; S3 down then
back; an alert starting a flow run on the real Prefect engine.
"""

from __future__ import annotations

import json
import pickle
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from denpex.analysis.models import Verdict
from denpex.evidence.store import S3Store
from denpex.analysis.triage import triage_store
from denpex.ingest.client import IngestClient, encode_multipart
from denpex.ingest.plans import PlanTier
from denpex.ingest.registry import IssuedKey
from denpex.ingest.signing import signed_headers
from ingest.conftest import Engine, Lab
from testkit.services.ingest import ROOT

# Sized to what it starts: the API, moto and the session's Prefect server with its served probe.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
FIXTURE = ROOT / "tests" / "fixtures" / "gloo" / "withheld_one"
WATCHDOG_LINE = ("[rank3]:[E1201 13:09:14.540958 ProcessGroupNCCL.cpp:632] [PG ID 0 PG GUID 0(default_pg) Rank 3] "
                 "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=16, OpType=ALLREDUCE, NumelIn=1, "
                 "NumelOut=1, Timeout(ms)=600000) ran for 600011 milliseconds before timing out.")


def client(lab: Lab, key: IssuedKey, **kw: Any) -> IngestClient:
    return IngestClient(lab.url, key_id=key.key_id, secret=key.secret, tenant=kw.get("tenant", key.tenant),
                        cluster=kw.get("cluster", key.cluster))


def identity(rank: int, incident: str, job: str = "job-1", **extra: Any) -> dict[str, Any]:
    return {"job_id": job, "incident_id": incident, "rank": rank, "world_size": 4, "host": f"gpu-node-00{rank + 1}",
            "dumped_at": "2026-12-01T13:09:14+00:00",
            "process_groups": {"0": {"desc": "default_pg", "ranks": [0, 1, 2, 3]}}, **extra}


def dump_bytes(rank: int, ext: str = ".pkl") -> bytes:
    return (FIXTURE / f"rank_{rank}{ext}").read_bytes()


def new_incident() -> str:
    return "inc-" + uuid.uuid4().hex[:10]


def objects(lab: Lab, incident: str) -> list[str]:
    return lab.s3.keys(f"{lab.prefix}/acme/c1/job-1/{incident}/")


def refused(response: httpx.Response, status: int, words: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and words in body["error"], body


# 1 -----------------------------------------------------------------------------------------------
def test_valid_upload_lands_where_triage_reads_it(lab: Lab) -> None:
    incident = new_incident()
    for rank in (0, 1, 3):
        response = client(lab, lab.key).upload(identity(rank, incident), dump_bytes(rank), f"rank_{rank}.pkl")
        assert response.status_code == 201, response.text
        assert response.json()["stored"] is True and response.json()["version"] == 1
    base = f"{lab.prefix}/acme/c1/job-1/{incident}"
    assert f"{base}/rank_0.pkl" in objects(lab, incident)
    manifest = lab.s3.manifest(base, 3)
    assert manifest["world_size"] == 4 and set(manifest["ranks"]) == {"0", "1", "3"}
    assert manifest["ranks"]["3"]["host"] == "gpu-node-004" and manifest["tenant"] == "acme"
    # `denpex triage s3://...` reads the incident folder as is.
    result = triage_store(S3Store(lab.s3.bucket, base, client=lab.s3.client()))
    assert result.missing_ranks == [2] and result.verdict is not Verdict.NO_HANG
    coverage = client(lab, lab.key).incident(incident)
    assert coverage.status_code == 200, coverage.text
    assert coverage.json()["ranks_with_evidence"] == [0, 1, 3] and coverage.json()["missing_ranks"] == [2]


# 2, 3, 4, 5 -------------------------------------------------------------------------------------
def _raw_upload(lab: Lab, key: IssuedKey, headers_for: Any, body_for: Any = None) -> httpx.Response:
    incident = new_incident()
    body, content_type = encode_multipart({"identity": json.dumps(identity(0, incident))},
                                          [("dump", "rank_0.pkl", dump_bytes(0))])
    headers = headers_for(body)
    headers["Content-Type"] = content_type
    response = httpx.post(f"{lab.url}/v1/evidence", content=body_for(body) if body_for else body, headers=headers)
    assert objects(lab, incident) == []  # nothing stored, whatever the refusal
    return response


def _headers(lab: Lab, key: IssuedKey, **kw: Any) -> Any:
    def make(body: bytes) -> dict[str, str]:
        args = dict(secret=key.secret.encode(), key_id=key.key_id, tenant=key.tenant, cluster=key.cluster,
                    method="POST", path="/v1/evidence", body=body)
        args.update(kw)
        return signed_headers(**args)  # type: ignore[arg-type]
    return make


def test_bad_signature(lab: Lab) -> None:
    refused(_raw_upload(lab, lab.key, _headers(lab, lab.key, secret=b"not-the-secret")), 401, "does not match")


def test_expired_signature(lab: Lab) -> None:
    refused(_raw_upload(lab, lab.key, _headers(lab, lab.key, timestamp=int(time.time()) - 301)), 401, "behind")


def test_replayed_signature(lab: Lab) -> None:
    incident = new_incident()
    body, content_type = encode_multipart({"identity": json.dumps(identity(0, incident))},
                                          [("dump", "rank_0.pkl", dump_bytes(0))])
    headers = _headers(lab, lab.key)(body) | {"Content-Type": content_type}
    first = httpx.post(f"{lab.url}/v1/evidence", content=body, headers=headers)
    assert first.status_code == 201, first.text
    refused(httpx.post(f"{lab.url}/v1/evidence", content=body, headers=headers), 401, "replayed")


def test_tampered_body(lab: Lab) -> None:
    response = _raw_upload(lab, lab.key, _headers(lab, lab.key), lambda body: body.replace(b'"rank": 0', b'"rank": 1'))
    refused(response, 401, "does not match")


# 6, 7 --------------------------------------------------------------------------------------------
def test_cross_tenant_key(lab: Lab) -> None:
    """globex's key, signing a request that claims to be acme's."""
    refused(_raw_upload(lab, lab.foreign_key, _headers(lab, lab.foreign_key, tenant="acme")), 403, "cannot act for")


def test_cross_cluster_key(lab: Lab) -> None:
    refused(_raw_upload(lab, lab.other_cluster_key, _headers(lab, lab.other_cluster_key, cluster="c1")), 403,
            "cluster 'c1'")


def test_a_node_agents_key_uploads_only_its_own_hosts_ranks(lab: Lab) -> None:
    """lab.node_key is bound to gpu-node-002 (rank 1 in identity()): a compromised node cannot
    replace another node's dump and pin the hang on it."""
    incident = new_incident()
    agent = client(lab, lab.node_key)
    refused(agent.upload(identity(2, incident), dump_bytes(2), "rank_2.pkl"), 403, "bound to host 'gpu-node-002'")
    assert objects(lab, incident) == []
    assert agent.upload(identity(1, incident), dump_bytes(1), "rank_1.pkl").status_code == 201
    unnamed = {k: v for k, v in identity(0, incident).items() if k != "host"}
    assert agent.upload(unnamed, dump_bytes(0), "rank_0.pkl").status_code == 201
    manifest = lab.s3.manifest(f"{lab.prefix}/acme/c1/job-1/{incident}", 2)
    assert manifest["ranks"]["0"]["host"] == "gpu-node-002"  # an unnamed host is the key's
    # Naming its own host (or none) does not let it replace a rank another host uploaded.
    assert client(lab, lab.key).upload(identity(2, incident), dump_bytes(2), "rank_2.pkl").status_code == 201
    unnamed_two = {k: v for k, v in identity(2, incident).items() if k != "host"}
    for forged in (unnamed_two, {**identity(2, incident), "host": "gpu-node-002"}):
        refused(agent.upload(forged, dump_bytes(3), "rank_2.pkl"), 403, "uploaded from host 'gpu-node-003'")


def test_incident_of_another_tenant_is_not_visible(lab: Lab) -> None:
    incident = new_incident()
    assert client(lab, lab.key).upload(identity(0, incident), dump_bytes(0), "rank_0.pkl").status_code == 201
    refused(client(lab, lab.foreign_key).incident(incident), 404, "no incident")
    refused(client(lab, lab.other_cluster_key).incident(incident), 404, "no incident")


# 8 -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("plan", [PlanTier.FREE, PlanTier.TEAM, PlanTier.SCALE, PlanTier.GROWTH], ids=str)
def test_each_other_tier_is_refused(lab: Lab, plan: PlanTier) -> None:
    key = lab.tier_keys[plan]
    small = client(lab, key)
    refused(small.upload(identity(0, new_incident()), dump_bytes(0), "rank_0.pkl"), 403, "data-center plan")
    refused(small.alert({"job_id": "job-1"}), 403, f"{plan.value} plan")
    token = lab.registry.create_token(key.tenant, key.cluster)
    refused(httpx.post(f"{lab.url}/v1/alerts", headers={"Authorization": f"Bearer {token.token}"},
                       json={"version": "4", "alerts": []}), 403, "data-center plan")


# 9 -----------------------------------------------------------------------------------------------
def test_hostile_pickle_is_refused_and_nothing_runs(lab: Lab, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    hostile = b"cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR."
    incident = new_incident()
    refused(client(lab, lab.key).upload(identity(0, incident), hostile, "rank_0.pkl"), 422, "refused")
    assert not marker.exists() and objects(lab, incident) == []
    refused(client(lab, lab.key).upload(identity(0, incident), b'{"entries": []}', "rank_0.json"), 422,
            "no 'version' field")
    refused(client(lab, lab.key).upload(identity(0, incident), dump_bytes(0), "rank_0.json"), 422, "says json")
    refused(client(lab, lab.key).upload(identity(7, incident), dump_bytes(0), "rank_0.pkl"), 422, "outside world_size")


def test_a_json_dump_padded_with_empty_objects_is_refused(lab: Lab) -> None:
    """Issue 30, §3: the check worker no longer builds a JSON dump, so it counts what it would take:
    3 MiB of ``{}`` (75 MiB decoded) is no Flight Recorder dump, and nothing of it is stored."""
    incident = new_incident()
    flood = json.dumps({"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": [{}] * (3 << 18)}).encode()
    refused(client(lab, lab.key).upload(identity(0, incident), flood, "rank_0.json"), 422, "flood of empty objects")
    assert objects(lab, incident) == []


# 10 ----------------------------------------------------------------------------------------------
def test_oversized_dump_is_refused(lab: Lab) -> None:
    """This server runs with a 4 MiB cap per dump (the default is 256 MiB)."""
    incident = new_incident()
    padded = pickle.dumps({"version": "2.10", "pg_config": {}, "pg_status": {}, "pad": "x" * (5 << 20)}, protocol=2)
    refused(client(lab, lab.key).upload(identity(0, incident), padded, "rank_0.pkl"), 413, "cap per dump")
    assert objects(lab, incident) == []


# 11 ----------------------------------------------------------------------------------------------
def test_duplicate_upload_is_idempotent_and_new_bytes_are_a_new_version(lab: Lab) -> None:
    incident = new_incident()
    c = client(lab, lab.key)
    first = c.upload(identity(1, incident), dump_bytes(1), "rank_1.pkl").json()
    again = c.upload(identity(1, incident), dump_bytes(1), "rank_1.pkl")
    assert again.status_code == 200 and again.json() == {**first, "stored": False}
    # The JSON of the same dump (same moment) joins version 1.
    joined = c.upload(identity(1, incident), dump_bytes(1, ".json"), "rank_1.json").json()
    assert joined["stored"] is True and joined["version"] == 1
    # Different bytes for the same rank: version 2, version 1 kept.
    later = c.upload(identity(1, incident, dumped_at="2026-12-01T13:10:00+00:00"), dump_bytes(3), "rank_1.pkl").json()
    assert later["stored"] is True and later["version"] == 2
    base = f"{lab.prefix}/acme/c1/job-1/{incident}"
    keys = objects(lab, incident)
    assert {f"{base}/versions/rank_1/v1.pkl", f"{base}/versions/rank_1/v1.json", f"{base}/versions/rank_1/v2.pkl"} <= set(keys)
    assert lab.s3.read(f"{base}/versions/rank_1/v1.pkl") == dump_bytes(1)
    assert lab.s3.read(f"{base}/rank_1.pkl") == dump_bytes(3)
    assert f"{base}/rank_1.json" not in keys  # the old JSON must not stand beside the new pickle


# 12, 13 ------------------------------------------------------------------------------------------
def _runs_for(engine: Engine, alert_id: str, *, wait_s: float = 180.0, at_least: int = 1) -> list[dict[str, Any]]:
    deadline = time.monotonic() + wait_s
    runs: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        listed = httpx.post(f"{engine.api_url}/flow_runs/filter", json={"limit": 200}, timeout=10).json()
        runs = [r for r in listed if r.get("parameters", {}).get("alert_id") == alert_id]
        if len(runs) >= at_least and all(r["state"]["type"] in ("COMPLETED", "FAILED", "CRASHED") for r in runs):
            return runs
        time.sleep(0.5)
    return runs


def test_alert_starts_a_flow_run_on_the_real_prefect_engine(lab: Lab, engine: Engine) -> None:
    incident = new_incident()
    response = client(lab, lab.key).alert({"job_id": "job-1", "incident_id": incident, "rank": 3, "world_size": 4,
                                           "alert_time": "2026-12-01T13:09:14Z"})
    assert response.status_code == 200, response.text
    [receipt] = response.json()["alerts"]
    assert receipt["run_started"] is True
    [run] = _runs_for(engine, receipt["alert_id"])
    assert run["state"]["type"] == "COMPLETED"
    assert datetime.fromisoformat(run["parameters"].pop("alert_time").replace("Z", "+00:00")) == datetime(
        2026, 12, 1, 13, 9, 14, tzinfo=UTC)
    assert run["parameters"] == {
        "tenant": "acme", "cluster": "c1", "job_id": "job-1", "incident_id": incident,
        "evidence": f"s3://{lab.s3.bucket}/{lab.prefix}/acme/c1/job-1/{incident}",
        "world_size": 4, "reported_by_rank": 3, "alert_id": receipt["alert_id"]}
    view = client(lab, lab.key).incident(incident).json()
    assert view["run_state"] == "started" and view["flow_run"]["flow_run_id"] == run["id"]
    assert view["flow_run"]["state"] == "COMPLETED"


def test_duplicate_alerts_start_exactly_one_run(lab: Lab, engine: Engine) -> None:
    incident = new_incident()
    c = client(lab, lab.key)
    receipts = [c.alert({"job_id": "job-1", "incident_id": incident, "rank": r}).json()["alerts"][0] for r in range(4)]
    receipts.append(c.watchdog_line(WATCHDOG_LINE, job_id="job-1", incident_id=incident).json()["alerts"][0])
    assert [r["run_started"] for r in receipts] == [True, False, False, False, False]
    assert len({r["alert_id"] for r in receipts}) == 1
    # The engine handles alert events in the order they came: once the run of an alert sent after
    # these has been made, a wrongly emitted second event for them would have made its run too.
    later = c.alert({"job_id": "job-1", "incident_id": new_incident(), "rank": 0}).json()["alerts"][0]
    assert len(_runs_for(engine, later["alert_id"])) == 1
    assert len(_runs_for(engine, receipts[0]["alert_id"])) == 1
    assert c.incident(incident).json()["alert_deliveries"] == 5


def test_watchdog_line_and_resolved_alertmanager_notification(lab: Lab, engine: Engine) -> None:
    incident = new_incident()
    line = client(lab, lab.key).watchdog_line(WATCHDOG_LINE, job_id="job-1", incident_id=incident)
    assert line.status_code == 200, line.text
    [run] = _runs_for(engine, line.json()["alerts"][0]["alert_id"])
    assert run["parameters"]["reported_by_rank"] == 3
    refused(client(lab, lab.key).watchdog_line("just some log line", job_id="job-1"), 422, "not an NCCL watchdog")
    payload = {"version": "4", "status": "resolved", "receiver": "denpex", "alerts": [{
        "status": "resolved", "labels": {"alertname": "NCCLWatchdogTimeout", "tenant": "acme", "cluster": "c1",
                                         "job_id": "job-1", "incident_id": incident, "rank": "3"},
        "startsAt": "2026-12-01T13:09:14.1234567Z", "endsAt": "2026-12-01T13:19:14Z"}]}
    bearer = {"Authorization": f"Bearer {lab.token.token}"}
    response = httpx.post(f"{lab.url}/v1/alerts", json=payload, headers=bearer)
    assert response.status_code == 200, response.text
    assert client(lab, lab.key).incident(incident).json()["resolved_at"] is not None
    foreign = json.loads(json.dumps(payload))
    foreign["alerts"][0]["labels"]["tenant"] = "globex"
    refused(httpx.post(f"{lab.url}/v1/alerts", json=foreign, headers=bearer), 403, "token belongs to")
    refused(httpx.post(f"{lab.url}/v1/alerts", json=payload, headers={"Authorization": "Bearer nope"}), 401,
            "unknown bearer token")


def test_a_query_changed_after_signing_is_refused(lab: Lab) -> None:
    """Issue 16, finding 9: the signature covers the query (job_id, incident_id, world_size) as sent."""
    incident = new_incident()
    target = f"/v1/alerts?job_id=job-1&incident_id={incident}&world_size=4"
    # A signature over the path alone no longer lets any query through.
    path_only = _headers(lab, lab.key, path="/v1/alerts")(WATCHDOG_LINE.encode()) | {"Content-Type": "text/plain"}
    refused(httpx.post(f"{lab.url}{target}", content=WATCHDOG_LINE.encode(), headers=path_only), 401,
            "does not match")
    headers = _headers(lab, lab.key, path=target)(WATCHDOG_LINE.encode()) | {"Content-Type": "text/plain"}
    for changed in (f"/v1/alerts?job_id=job-2&incident_id={incident}&world_size=4",
                    f"/v1/alerts?job_id=job-1&incident_id={incident}&world_size=8", "/v1/alerts"):
        refused(httpx.post(f"{lab.url}{changed}", content=WATCHDOG_LINE.encode(), headers=headers), 401,
                "does not match")
    # The request as signed still passes: the refused ones did not spend its nonce.
    sent = httpx.post(f"{lab.url}{target}", content=WATCHDOG_LINE.encode(), headers=headers)
    assert sent.status_code == 200, sent.text
    assert sent.json()["alerts"][0]["incident_id"] == incident
    assert client(lab, lab.key).incident(incident).json()["world_size"] == 4


# 14 ----------------------------------------------------------------------------------------------
def test_s3_down_then_back(lab: Lab) -> None:
    incident = new_incident()
    c = client(lab, lab.key)
    lab.s3.stop()
    try:
        down = c.upload(identity(2, incident), dump_bytes(2), "rank_2.pkl")
    finally:
        lab.s3.start()
    refused(down, 503, "cannot be written")
    assert objects(lab, incident) == []  # a refused request leaves nothing, not even its version
    assert c.incident(incident).status_code == 404  # nothing recorded
    back = c.upload(identity(2, incident), dump_bytes(2), "rank_2.pkl")
    assert back.status_code == 201 and back.json()["version"] == 1
    assert c.incident(incident).json()["ranks_with_evidence"] == [2]


def test_api_restart_keeps_the_replay_cache(lab: Lab) -> None:
    incident = new_incident()
    body, content_type = encode_multipart({"identity": json.dumps(identity(0, incident))},
                                          [("dump", "rank_0.pkl", dump_bytes(0))])
    headers = _headers(lab, lab.key)(body) | {"Content-Type": content_type}
    assert httpx.post(f"{lab.url}/v1/evidence", content=body, headers=headers).status_code == 201
    lab.api.stop()
    lab.api.start()
    refused(httpx.post(f"{lab.url}/v1/evidence", content=body, headers=headers), 401, "replayed")


# Issue 16, finding 10 ------------------------------------------------------------------------------
def test_an_alert_naming_another_jobs_incident_is_refused_and_the_genuine_one_starts_the_run(
        lab: Lab, engine: Engine) -> None:
    """The ranks of job-1 opened the incident; an alert for job-2 naming it must not take its one run."""
    incident = new_incident()
    c = client(lab, lab.key)
    assert c.upload(identity(0, incident), dump_bytes(0), "rank_0.pkl").status_code == 201
    refused(c.alert({"job_id": "job-2", "incident_id": incident, "rank": 0}), 409, "belongs to job 'job-1'")
    refused(c.watchdog_line(WATCHDOG_LINE, job_id="job-2", incident_id=incident), 409, "belongs to job 'job-1'")
    assert c.incident(incident).json()["run_state"] == "not_started"
    genuine = c.alert({"job_id": "job-1", "incident_id": incident, "rank": 0})
    assert genuine.status_code == 200, genuine.text
    [receipt] = genuine.json()["alerts"]
    assert receipt["run_started"] is True
    [run] = _runs_for(engine, receipt["alert_id"])
    assert run["parameters"]["job_id"] == "job-1" and run["parameters"]["evidence"].endswith(f"/job-1/{incident}")
    # An upload of another job into the incident an alert opened is a conflict too, and leaves nothing.
    refused(c.upload(identity(1, incident, job="job-2"), dump_bytes(1), "rank_1.pkl"), 409, "belongs to job")
    assert not lab.s3.keys(f"{lab.prefix}/acme/c1/job-2/{incident}/")


# Issue 16, finding 5 -------------------------------------------------------------------------------
def test_an_alerts_world_size_is_bounded_and_coverage_never_lists_every_rank(lab: Lab) -> None:
    c = client(lab, lab.key)
    refused(c.alert({"job_id": "job-1", "incident_id": new_incident(), "world_size": 30_000_000}), 422,
            "world_size")
    huge = c.send("POST", "/v1/alerts", WATCHDOG_LINE.encode(), content_type="text/plain",
                  params={"job_id": "job-1", "incident_id": new_incident(), "world_size": "30000000"})
    refused(huge, 422, "world_size 30000000 is out of range")
    digits = c.send("POST", "/v1/alerts", WATCHDOG_LINE.encode(), content_type="text/plain",
                    params={"job_id": "job-1", "incident_id": new_incident(), "world_size": "9" * 5000})
    refused(digits, 422, "world_size")
    payload = {"version": "4", "status": "firing", "receiver": "denpex", "alerts": [{
        "status": "firing", "labels": {"alertname": "NCCLWatchdogTimeout", "job_id": "job-1",
                                       "incident_id": new_incident(), "world_size": "30000000"},
        "startsAt": "2026-12-01T13:09:14Z"}]}
    bearer = {"Authorization": f"Bearer {lab.token.token}"}
    refused(httpx.post(f"{lab.url}/v1/alerts", json=payload, headers=bearer), 422, "out of range")
    # The largest world an upload may claim: the answer lists a bounded prefix and counts the rest.
    incident = new_incident()
    assert c.alert({"job_id": "job-1", "incident_id": incident, "world_size": 1 << 20}).status_code == 200
    started = time.monotonic()
    view = c.incident(incident)
    assert view.status_code == 200, view.text
    body = view.json()
    assert body["world_size"] == 1 << 20 and body["missing_count"] == 1 << 20
    assert body["missing_ranks_truncated"] is True and body["missing_ranks"][:3] == [0, 1, 2]
    assert len(body["missing_ranks"]) == 4096 and len(view.content) < 256 * 1024
    assert time.monotonic() - started < 30  # a bounded answer, not one rank at a time (room for load)
