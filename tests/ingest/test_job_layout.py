"""Issue 18 through the real ``denpex serve-api`` (moto S3): a job's layout registered at start, so
that a rank that died without a dump still has a host, and a node agent's telemetry without a dump.

The dumps are the real Gloo ``sigkill`` fixture: rank 1 (on gpu-node-002) was SIGKILLed and left
no dump; ranks 0, 2 and 3 waited for it. The kernel log holds an Xid 79 for gpu-node-002, sent by
that node's agent (``lab.node_key`` is bound to gpu-node-002).
"""

from __future__ import annotations

import json
import signal
import sqlite3
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from denpex.ingest.client import IngestClient
from denpex.ingest.registry import IssuedKey
from denpex.ingest.signing import signed_headers
from denpex.investigate import investigate
from denpex.isolation.policy import Scheduler
from ingest.conftest import Engine, Lab, make_lab
from testkit.services.ingest import ROOT
from testkit.services.s3 import MotoS3

# Sized to what it starts: the API and moto.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
FIXTURE = ROOT / "tests" / "fixtures" / "gloo" / "sigkill"
MANIFEST = json.loads((FIXTURE / "manifest.json").read_text())
DEAD_NODE = "gpu-node-002"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, s3: MotoS3) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("layout")
    lab = make_lab(tmp, s3, None, prefix=f"layout-{uuid.uuid4().hex[:6]}")
    yield lab
    lab.api.stop(signal.SIGTERM)


def client(lab: Lab, key: IssuedKey, **kw: str) -> IngestClient:
    return IngestClient(lab.url, key_id=key.key_id, secret=key.secret, tenant=kw.get("tenant", key.tenant),
                        cluster=kw.get("cluster", key.cluster))


def refused(response: httpx.Response, status: int, words: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and words in body["error"], body


def registration(ranks: range | list[int] = range(4), **hosts: str) -> dict[str, Any]:
    """What each rank's collector registers at start (here all at once, as the demo does)."""
    entries = {str(r): {"host": hosts.get(f"r{r}", MANIFEST["ranks"][str(r)]["host"]), "local_rank": 0,
                        "pid": MANIFEST["ranks"][str(r)]["pid"], "gpu_pci_bus_id": "0000:3b:00.0"} for r in ranks}
    return {"world_size": 4, "ranks": entries, "process_groups": MANIFEST["process_groups"]}


def xid79(host: str = DEAD_NODE) -> bytes:
    newest = max(datetime.fromisoformat(r["dumped_at"].replace("Z", "+00:00"))
                 for r in MANIFEST["ranks"].values() if r.get("dumped_at"))
    at = newest - timedelta(seconds=20)
    return (f"{at.strftime('%Y-%m-%dT%H:%M:%S')}+0000 {host} kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=17733, "
            "name=python, GPU has fallen off the bus.\n").encode()


def upload_survivors(lab: Lab, job: str, incident: str) -> None:
    """Ranks 0, 2 and 3 upload their dumps with the job's key; rank 1 is dead and never does."""
    job_client = client(lab, lab.key)
    for rank in (0, 2, 3):
        ident = {k: v for k, v in MANIFEST["ranks"][str(rank)].items()}
        ident |= {"job_id": job, "incident_id": incident, "rank": rank, "world_size": 4}
        response = job_client.upload(ident, (FIXTURE / f"rank_{rank}.pkl").read_bytes(), f"rank_{rank}.pkl")
        assert response.status_code == 201, response.text


def plan_of(lab: Lab, job: str, incident: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("DENPEX_S3_ENDPOINT_URL", lab.s3.endpoint)
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    return investigate(f"s3://{lab.s3.bucket}/{lab.prefix}/acme/c1/{job}/{incident}", scheduler=Scheduler.SLURM,
                       incident_id=incident)


def manifest_of(lab: Lab, job: str, incident: str, ranks: int) -> dict[str, Any]:
    return lab.s3.manifest(f"{lab.prefix}/acme/c1/{job}/{incident}", ranks)


def new_ids() -> tuple[str, str]:
    return f"job-{uuid.uuid4().hex[:8]}", f"inc-{uuid.uuid4().hex[:8]}"


def test_without_a_registration_the_dead_ranks_node_cannot_be_chosen(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's measurement: the uploads alone leave rank 1 without a host, and nothing is proposed."""
    job, incident = new_ids()
    upload_survivors(lab, job, incident)
    sent = client(lab, lab.node_key).upload_telemetry({"job_id": job, "incident_id": incident}, [xid79()])
    assert sent.status_code == 201, sent.text
    found = plan_of(lab, job, incident, monkeypatch)
    assert [c.rank for c in found.report.candidates] == [1]
    assert found.report.plan is not None and found.report.plan.actions == []
    assert "1" not in manifest_of(lab, job, incident, 3)["ranks"]


def test_a_registered_dead_rank_is_drained_on_its_nodes_own_xid(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    job, incident = new_ids()
    answer = client(lab, lab.key).register(job, registration())
    assert answer.status_code == 201, answer.text
    assert answer.json() == {"job_id": job, "registered": 4, "unchanged": 0, "moved": []}
    again = client(lab, lab.key).register(job, registration())  # with each dump, the same: nothing changes
    assert again.status_code == 200 and again.json()["unchanged"] == 4, again.text
    upload_survivors(lab, job, incident)
    # The dead rank's node agent: no dump, only its kernel log (joins the job's open incident).
    sent = client(lab, lab.node_key).upload_telemetry({"job_id": job}, [xid79()])
    assert sent.status_code == 201, sent.text
    assert sent.json() == {"stored": True, "incident_id": incident, "telemetry_stored": 1}
    repeat = client(lab, lab.node_key).upload_telemetry({"job_id": job, "incident_id": incident}, [xid79()])
    assert repeat.status_code == 200 and repeat.json()["stored"] is False, repeat.text

    manifest = manifest_of(lab, job, incident, 4)
    assert manifest["ranks"]["1"]["host"] == DEAD_NODE and manifest["ranks"]["1"]["host_source"] == "registered"
    assert manifest["ranks"]["0"]["host_source"] == "upload"
    found = plan_of(lab, job, incident, monkeypatch)
    [candidate] = found.report.candidates
    assert candidate.rank == 1 and candidate.host == DEAD_NODE and [h.code for h in candidate.hardware] == [79]
    assert found.report.plan is not None and found.report.plan.recommend_isolation is True
    assert [(a.node, a.action) for a in found.report.plan.actions] == [(DEAD_NODE, "drain")]


def test_a_rank_that_moves_is_recorded_and_the_incident_keeps_where_it_ran(lab: Lab,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 restarts on gpu-node-009 after the hang: the move is answered, listed and kept in
    the manifest; the incident opened before it still drains the node the rank died on."""
    job, incident = new_ids()
    assert client(lab, lab.key).register(job, registration()).status_code == 201
    upload_survivors(lab, job, incident)
    time.sleep(0.05)  # the move is after the incident opened (server time)
    moved = client(lab, lab.key).register(job, registration([1], r1="gpu-node-009"))
    assert moved.status_code == 201, moved.text
    [move] = moved.json()["moved"]
    assert (move["rank"], move["from_host"], move["to_host"]) == (1, DEAD_NODE, "gpu-node-009")
    layout = client(lab, lab.key).job_ranks(job).json()
    assert layout["ranks"]["1"]["host"] == "gpu-node-009"
    assert [(m["from_host"], m["to_host"]) for m in layout["moves"]["1"]] == [(DEAD_NODE, "gpu-node-009")]
    assert client(lab, lab.node_key).upload_telemetry({"job_id": job}, [xid79()]).status_code == 201
    deadline = time.monotonic() + 60
    while True:
        rank1 = manifest_of(lab, job, incident, 4)["ranks"]["1"]
        if rank1.get("moved") or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert rank1["host"] == DEAD_NODE and rank1["host_source"] == "registered"
    assert [(m["from_host"], m["to_host"]) for m in rank1["moved"]] == [(DEAD_NODE, "gpu-node-009")]
    found = plan_of(lab, job, incident, monkeypatch)
    assert found.report.plan is not None
    assert [(a.node, a.action) for a in found.report.plan.actions] == [(DEAD_NODE, "drain")]


# -- the trust boundary, as an attacker ---------------------------------------------------------------

def _raw(lab: Lab, key: IssuedKey, url_path: str, body: bytes, *, content_type: str = "application/json",
         **signing: Any) -> httpx.Response:
    """Sent to ``url_path``; signed as ``signing`` says (by default, correctly, for ``url_path``)."""
    args: dict[str, Any] = dict(secret=key.secret.encode(), key_id=key.key_id, tenant=key.tenant, cluster=key.cluster,
                                method="POST", path=url_path, body=body)
    args.update(signing)
    headers = signed_headers(**args) | {"Content-Type": content_type}
    return httpx.post(f"{lab.url}{url_path}", content=body, headers=headers, timeout=30)


def test_another_tenants_or_clusters_registration_is_refused_and_touches_nothing(lab: Lab) -> None:
    job, _ = new_ids()
    assert client(lab, lab.key).register(job, registration()).status_code == 201
    hostile = json.dumps(registration([1], r1="gpu-node-016")).encode()
    path = f"/v1/jobs/{job}/ranks"
    refused(_raw(lab, lab.foreign_key, path, hostile, tenant="acme", cluster="c1"), 403, "cannot act for")
    refused(_raw(lab, lab.other_cluster_key, path, hostile, cluster="c1"), 403, "cluster 'c1'")
    # With its own tenant's headers, globex registers *its* job of that name: acme's is untouched.
    assert client(lab, lab.foreign_key).register(job, registration([1], r1="gpu-node-016")).status_code == 201
    assert client(lab, lab.key).job_ranks(job).json()["ranks"]["1"]["host"] == DEAD_NODE
    assert client(lab, lab.key).job_ranks(job).json()["moves"] == {}
    refused(client(lab, lab.other_cluster_key).job_ranks(job), 404, "no registered job")


def test_unauthenticated_replayed_and_tampered_registrations_are_refused(lab: Lab) -> None:
    job, _ = new_ids()
    path = f"/v1/jobs/{job}/ranks"
    body = json.dumps(registration()).encode()
    refused(httpx.post(f"{lab.url}{path}", content=body, headers={"Content-Type": "application/json"}), 401,
            "X-Denpex")
    refused(_raw(lab, lab.key, path, body, secret=b"guessed"), 401, "does not match")
    refused(_raw(lab, lab.key, path, body, timestamp=int(time.time()) - 301), 401, "behind")
    # Signed for another job's path, sent to this one.
    refused(_raw(lab, lab.key, path, body, path=f"/v1/jobs/{job}x/ranks"), 401, "does not match")
    headers = signed_headers(secret=lab.key.secret.encode(), key_id=lab.key.key_id, tenant="acme", cluster="c1",
                             method="POST", path=path, body=body) | {"Content-Type": "application/json"}
    assert httpx.post(f"{lab.url}{path}", content=body, headers=headers).status_code == 201
    refused(httpx.post(f"{lab.url}{path}", content=body, headers=headers), 401, "replayed")
    tampered = body.replace(b'"gpu-node-002"', b'"gpu-node-016"')
    refused(httpx.post(f"{lab.url}{path}", content=tampered, headers=headers | {"X-Denpex-Nonce": "n2"}), 401,
            "does not match")
    assert client(lab, lab.key).job_ranks(job).json()["ranks"]["1"]["host"] == DEAD_NODE


def test_a_node_agents_key_registers_only_its_own_hosts_ranks(lab: Lab) -> None:
    job, _ = new_ids()
    agent = client(lab, lab.node_key)  # bound to gpu-node-002
    refused(agent.register(job, registration([2])), 403, "bound to host 'gpu-node-002'")
    unnamed = {"world_size": 4, "ranks": {"1": {"local_rank": 0}}}
    assert agent.register(job, unnamed).status_code == 201
    assert client(lab, lab.key).job_ranks(job).json()["ranks"]["1"]["host"] == DEAD_NODE  # the key's host
    # A rank registered on another node cannot be pulled onto this one (and the blame off that node).
    assert client(lab, lab.key).register(job, registration([3])).status_code == 201
    refused(agent.register(job, {"world_size": 4, "ranks": {"3": {"host": DEAD_NODE}}}), 403,
            "registered on host 'gpu-node-004'")
    refused(agent.register(job, {"world_size": 4, "ranks": {"3": {}}}), 403, "registered on host 'gpu-node-004'")
    assert client(lab, lab.key).job_ranks(job).json()["ranks"]["3"]["host"] == "gpu-node-004"


@pytest.mark.parametrize("body, status, words", [
    pytest.param(b'{"world_size": 4, "ranks": {"1": {"host": "gpu-node-002", "hots": 1}}}', 422, "hots", id="unknown"),
    pytest.param(b'{"world_size": 4, "ranks": {"7": {"host": "gpu-node-002"}}}', 422, "outside world_size",
                 id="rank-outside"),
    pytest.param(b'{"world_size": 4, "ranks": {"1": {"host": "gpu node; rm -rf /"}}}', 422, "host",
                 id="hostile-host"),
    pytest.param(b'{"world_size": 4, "ranks": {"1": {}}}', 422, "name no host", id="job-key-no-host"),
    pytest.param(b'{"world_size": 4, "ranks": {}}', 422, "ranks", id="no-ranks"),
    pytest.param(b'{"world_size": 99999999999, "ranks": {"1": {"host": "a"}}}', 422, "world_size", id="huge-world"),
    pytest.param(b'[' * 100_000, 422, "invalid registration", id="deep-json"),
    pytest.param(b'{"world_size": 4, "ranks": {"1": {"host": "gpu-node-002", "gpu_uuid": "a\\nb"}}}', 422,
                 "line break", id="newline"),
])
def test_hostile_registrations_are_refused(lab: Lab, body: bytes, status: int, words: str) -> None:
    job, _ = new_ids()
    refused(_raw(lab, lab.key, f"/v1/jobs/{job}/ranks", body), status, words)
    refused(client(lab, lab.key).job_ranks(job), 404, "no registered job")


def test_an_oversized_registration_and_a_bad_job_id_are_refused(lab: Lab) -> None:
    job, _ = new_ids()
    huge = b'{"world_size": 4, "ranks": {"1": {"host": "' + b"a" * (9 << 20) + b'"}}}'
    refused(_raw(lab, lab.key, f"/v1/jobs/{job}/ranks", huge), 413, "cap")
    refused(_raw(lab, lab.key, "/v1/jobs/-bad/ranks", json.dumps(registration()).encode()), 422,
            "not a valid id")


def test_telemetry_without_a_dump_needs_a_node_agents_key(lab: Lab) -> None:
    job, incident = new_ids()
    upload_survivors(lab, job, incident)
    refused(client(lab, lab.key).upload_telemetry({"job_id": job, "incident_id": incident}, [xid79()]), 403,
            "bound to its host")
    refused(client(lab, lab.node_key).upload_telemetry({"job_id": job, "host": "gpu-node-003"}, [xid79()]), 403,
            "bound to host 'gpu-node-002'")
    refused(client(lab, lab.node_key).upload_telemetry({"job_id": "job-never-seen"}, [xid79()]), 404,
            "no open incident")
    refused(client(lab, lab.node_key).upload_telemetry({"job_id": job, "incident_id": incident}, []), 422,
            "at least one 'telemetry' part")
    refused(client(lab, lab.node_key).upload_telemetry({"job_id": job, "incident_id": incident, "rank": 1},
                                                      [xid79()]), 422, "rank")
    refused(client(lab, lab.node_key).upload_telemetry({"job_id": "other-job", "incident_id": incident}, [xid79()]),
            409, "belongs to job")
    assert not [k for k in lab.s3.keys(f"{lab.prefix}/acme/c1/{job}/{incident}/") if "/telemetry" in k]


def test_an_incident_opened_by_an_alert_alone_takes_its_manifest_from_the_registration(
        tmp_path: Path, s3: MotoS3, engine: Engine) -> None:
    """No rank uploaded anything yet (all wedged, or the watchdog fired first): the alert opens the
    incident and starts its run (the real Prefect engine's probe deployment), and the incident's
    manifest already places every registered rank."""
    lab = make_lab(tmp_path, s3, engine, prefix=f"alert-only-{uuid.uuid4().hex[:6]}")
    try:
        job, incident = new_ids()
        assert client(lab, lab.key).register(job, registration()).status_code == 201
        answer = client(lab, lab.key).alert({"job_id": job, "incident_id": incident, "rank": 0, "world_size": 4,
                                             "alert_time": "2026-11-29T20:30:22Z"})
        assert answer.status_code == 200 and answer.json()["alerts"][0]["run_started"] is True, answer.text
        manifest = manifest_of(lab, job, incident, 4)
    finally:
        lab.api.stop(signal.SIGTERM)
    assert {r: (e["host"], e["host_source"]) for r, e in manifest["ranks"].items()} == {
        str(r): (MANIFEST["ranks"][str(r)]["host"], "registered") for r in range(4)}


def test_restarts_keep_only_what_an_open_incident_needs(lab: Lab) -> None:
    """Issue 30, §3: six registrations of a job's every rank (new pids each restart) kept every
    replaced identity, 5 x the ranks, for a week; now only those an incident opened while they ran."""
    job, incident = new_ids()
    ranks = 256
    acme = client(lab, lab.key)

    def restart(generation: int) -> None:
        body = {"world_size": ranks, "ranks": {str(r): {"host": f"gpu-node-{r // 16 + 1:03d}", "pid": 1000 * generation + r}
                                               for r in range(ranks)}}
        response = acme.register(job, body)
        assert response.status_code == 201, response.text

    def history_rows() -> int:
        db = sqlite3.connect(lab.api.state_dir / "ingest.sqlite3")
        try:
            return int(db.execute("SELECT COUNT(*) FROM job_rank_history WHERE job_id = ?", (job,)).fetchone()[0])
        finally:
            db.close()

    for generation in range(6):
        restart(generation)
    assert history_rows() == 0, "identities no incident can ask for were kept"
    # The hang: rank 0 (of the generation running now, pids 5000 + r) uploads its dump.
    ident = {"job_id": job, "incident_id": incident, "rank": 0, "world_size": ranks, "host": "gpu-node-001"}
    assert acme.upload(ident, (FIXTURE / "rank_0.pkl").read_bytes(), "rank_0.pkl").status_code == 201
    for generation in range(6, 9):
        restart(generation)
    assert history_rows() == ranks  # each rank's process at the incident, once
    manifest = manifest_of(lab, job, incident, ranks)
    assert [manifest["ranks"][str(r)].get("pid") for r in (1, 255)] == [5001, 5255]
