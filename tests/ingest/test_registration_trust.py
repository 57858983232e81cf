"""The hostile reviewer's findings 4, 5 and 7 (issue 19) through the real ``denpex serve-api`` on
moto S3: what a compromised node agent's key may no longer do to the registration and to an
incident's telemetry, so that it cannot keep its own faulty node from being drained."""

from __future__ import annotations

import json
import signal
import uuid
from collections.abc import Iterator

import pytest

from ingest.conftest import Lab, make_lab
from ingest.test_job_layout import (
    DEAD_NODE,
    FIXTURE,
    MANIFEST,
    client,
    manifest_of,
    new_ids,
    plan_of,
    refused,
    registration,
    upload_survivors,
    xid79,
    _raw,
)
from testkit.services.s3 import MotoS3

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, s3: MotoS3) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("trust")
    lab = make_lab(tmp, s3, None, prefix=f"trust-{uuid.uuid4().hex[:6]}")
    yield lab
    lab.api.stop(signal.SIGTERM)


def test_a_node_agents_key_cannot_shrink_the_job_or_replace_its_groups(lab: Lab,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding 4: the agent of the dead rank's node (gpu-node-002, rank 1) tries to hide the job's
    other ranks and groups; its own rank, re-sent the same, is still accepted."""
    job, incident = new_ids()
    assert client(lab, lab.key).register(job, registration()).status_code == 201
    upload_survivors(lab, job, incident)
    agent = client(lab, lab.node_key)
    refused(agent.register(job, {"world_size": 2, "ranks": registration([1])["ranks"]}), 403, "world size")
    refused(agent.register(job, registration([1]) | {"process_groups": {"evil": {"ranks": [1]}}}), 403,
            "process groups")
    same = agent.register(job, registration([1]))
    assert same.status_code == 200 and same.json()["unchanged"] == 1, same.text
    layout = client(lab, lab.key).job_ranks(job).json()
    assert layout["world_size"] == 4 and layout["process_groups"] == MANIFEST["process_groups"]
    assert agent.upload_telemetry({"job_id": job, "incident_id": incident}, [xid79()]).status_code == 201
    assert set(manifest_of(lab, job, incident, 4)["ranks"]) == {"0", "1", "2", "3"}
    found = plan_of(lab, job, incident, monkeypatch)
    assert found.report.plan is not None
    assert [(a.node, a.action) for a in found.report.plan.actions] == [(DEAD_NODE, "drain")]


def test_a_node_agent_cannot_upload_a_rank_registered_on_another_host(lab: Lab) -> None:
    """Finding 5: rank 1 is registered on gpu-node-002 and died without a dump; another node's
    agent may not upload a dump as rank 1 and take its place in the manifest."""
    job, incident = new_ids()
    assert client(lab, lab.key).register(job, registration()).status_code == 201
    upload_survivors(lab, job, incident)
    intruder = lab.registry.create_key("acme", "c1", host="gpu-node-009")
    ident = {"job_id": job, "incident_id": incident, "rank": 1, "world_size": 4}
    refused(client(lab, intruder).upload(ident, (FIXTURE / "rank_0.pkl").read_bytes(), "rank_1.pkl"), 403,
            "registered on host 'gpu-node-002'")
    rank1 = manifest_of(lab, job, incident, 4)["ranks"]["1"]
    assert (rank1["host"], rank1["host_source"], rank1["pid"]) == (DEAD_NODE, "registered",
                                                                   MANIFEST["ranks"]["1"]["pid"])


def test_telemetry_alone_joins_an_existing_incident_within_a_per_host_cap(lab: Lab) -> None:
    """Finding 7: telemetry alone opens no incident (404), and one host holds at most 64 files per
    incident, so one agent's key cannot grow telemetry.json past what the flow reads."""
    job, incident = new_ids()
    agent = client(lab, lab.node_key)
    refused(agent.upload_telemetry({"job_id": job, "incident_id": incident}, [xid79()]), 404, "no incident")
    assert not lab.s3.keys(f"{lab.prefix}/acme/c1/{job}/")
    upload_survivors(lab, job, incident)
    for batch in range(2):
        sent = agent.upload_telemetry({"job_id": job, "incident_id": incident},
                                      [f"{batch}-{i}\n".encode() for i in range(32)])
        assert sent.status_code == 201 and sent.json()["telemetry_stored"] == 32, sent.text
    refused(agent.upload_telemetry({"job_id": job, "incident_id": incident}, [b"one too many\n"]), 413,
            "64 telemetry files")
    index = json.loads(lab.s3.read(f"{lab.prefix}/acme/c1/{job}/{incident}/telemetry.json"))
    assert len(index["trusted"]) == 64


def test_a_registration_of_a_million_repeated_ranks_is_refused_briefly(lab: Lab) -> None:
    """Finding 2 (r_parse2.py): the 422 echoed the whole list (12 MB), parsed on the event loop."""
    job, _ = new_ids()
    body = (b'{"world_size":1048576,"ranks":{"0":{"host":"a"}},"process_groups":{"g":{"ranks":['
            + b"0," * 200_000 + b'1]}}}')
    answer = _raw(lab, lab.key, f"/v1/jobs/{job}/ranks", body)
    refused(answer, 422, "invalid registration")
    assert len(answer.text) < 1000


def test_unnamed_telemetry_is_not_diverted_to_an_incident_another_key_opened(lab: Lab) -> None:
    """Finding 7: any key of the cluster can open a newer incident of the job; telemetry that names
    no incident joined the newest one. With two open, it must name one (409)."""
    job, incident = new_ids()
    upload_survivors(lab, job, incident)
    upload_survivors(lab, job, f"{incident}-decoy")
    agent = client(lab, lab.node_key)
    refused(agent.upload_telemetry({"job_id": job}, [xid79()]), 409, "several open incidents")
    named = agent.upload_telemetry({"job_id": job, "incident_id": incident}, [xid79()])
    assert named.status_code == 201 and named.json()["incident_id"] == incident, named.text
