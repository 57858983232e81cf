"""Issue 18 end to end: a rank that dies without a dump is still isolated, through the ingest path.

A real 4-rank Gloo job (``sigkill``: rank 1 idles and is SIGKILLed mid-step; 0, 2 and 3 wait for
it and dump) whose collectors register the job at start with the real ``denpex serve-api``; rank
1's node agent (``denpex node-agent``, a key bound to gpu-node-002) sends an Xid 79 kernel log; a
signed alert starts the real served incident flow (Prefect), which proposes a drain of exactly
gpu-node-002 (nobody writes a manifest: the service builds it from the registration), and after
approval the node is drained on the real Slurm over SSH.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from conftest import RigIngest
from denpex.collector import EvidenceUploader, UploadTarget
from denpex.ingest.client import IngestClient
from denpex.ingest.incidents import IncidentBook
from denpex.ingest.registry import IssuedKey, Registry
from flow_driver import FlowRig, find_run, report_of, resume, saved_plan, wait_for
from lab.rig import drained_nodes, reason_of
from testkit.generators.gloo_scenarios import SCENARIOS, WORK_DIR, GeneratorOptions, run_scenario
from testkit.services.ingest import ROOT, ApiServer
from testkit.services.slurm import SlurmLab

# Sized to what it starts: 4 Gloo ranks, the API, the served flow, Slurm; a run waits for approval.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]
DEAD_NODE = "gpu-node-002"  # sigkill: rank 1 (testkit.generators.gloo_catalog.host_name)
OPTIONS = GeneratorOptions(long_stall=None, attempts=2)


@dataclass
class Ingest:
    api: ApiServer
    registry: Registry
    job_key: IssuedKey
    node_key: IssuedKey
    prefix: str

    def client(self, key: IssuedKey) -> IngestClient:
        return IngestClient(self.api.url, key_id=key.key_id, secret=key.secret, tenant="acme", cluster="lab")

    def env(self, key: IssuedKey, job: str) -> dict[str, str]:
        return {"DENPEX_INGEST_URL": self.api.url, "DENPEX_INGEST_KEY_ID": key.key_id,
                "DENPEX_INGEST_SECRET": key.secret, "DENPEX_TENANT": "acme", "DENPEX_CLUSTER": "lab",
                "DENPEX_JOB_ID": job}


@pytest.fixture
def ingest(rig_ingest: RigIngest) -> Ingest:
    """The rig's real service (storing into its S3, starting its served flow), with fresh keys."""
    return Ingest(rig_ingest.api, rig_ingest.registry, rig_ingest.key(), rig_ingest.key(DEAD_NODE),
                  rig_ingest.prefix)


def _run_job(ingest: Ingest, job: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The Gloo job with its collectors configured for the service; what a spool still holds is
    delivered as a restarted rank would."""
    for name, value in ingest.env(ingest.job_key, job).items():
        monkeypatch.setenv(name, value)
    run_scenario(tmp_path / "out", SCENARIOS["sigkill"], OPTIONS)
    work = tmp_path / "out" / WORK_DIR / "sigkill"
    target = UploadTarget.from_env()
    assert target is not None
    for spool in sorted((work / "spool").iterdir()):
        leftover = EvidenceUploader(target, dump_dir=work / "collected", spool_dir=spool, attach_nvml=False)
        deadline = time.monotonic() + 60
        while not leftover.deliver_once():
            assert time.monotonic() < deadline, "a spool did not drain"
            time.sleep(0.5)
    return work


def _node_agent_sends_xid(ingest: Ingest, job: str, pid: int, at: datetime, tmp_path: Path) -> dict[str, object]:
    """``denpex node-agent`` on gpu-node-002, with its host-bound key, sends its kernel log."""
    log = tmp_path / "kern.log"
    log.write_text(f"{at.strftime('%Y-%m-%dT%H:%M:%S')}+0000 {DEAD_NODE} kernel: NVRM: Xid (PCI:0000:3b:00): 79, "
                   f"pid={pid}, name=python, GPU has fallen off the bus.\n"
                   f"{at.strftime('%Y-%m-%dT%H:%M:%S')}+0000 {DEAD_NODE} kernel: e1000e eth0: NIC Link is Up\n")
    env = {**os.environ, **ingest.env(ingest.node_key, job), "PYTHONPATH": str(ROOT)}
    env.pop("DENPEX_JOB_ID")
    done = subprocess.run([sys.executable, "-m", "denpex", "node-agent", "--job", job, "--file", str(log)],
                          env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def test_a_dead_ranks_node_is_drained_from_its_registration_and_its_node_agents_xid(
        flow_rig: FlowRig, lab: SlurmLab, ingest: Ingest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job = f"gloo-{uuid.uuid4().hex[:6]}"
    _run_job(ingest, job, tmp_path, monkeypatch)
    job_client = ingest.client(ingest.job_key)

    # The collectors registered every rank at start: rank 1 too, although it never dumped.
    layout = job_client.job_ranks(job).json()
    assert {r: e["host"] for r, e in layout["ranks"].items()} == {
        "0": "gpu-node-001", "1": DEAD_NODE, "2": "gpu-node-003", "3": "gpu-node-004"}, layout
    incident = IncidentBook(ingest.registry.db).open_incident("acme", "lab", job)
    assert incident is not None
    view = job_client.incident(incident).json()
    assert view["ranks_with_evidence"] == [0, 2, 3] and view["missing_ranks"] == [1]

    base = f"{ingest.prefix}/acme/lab/{job}/{incident}"
    manifest = flow_rig_manifest(flow_rig, base)
    assert manifest["ranks"]["1"]["host"] == DEAD_NODE and manifest["ranks"]["1"]["host_source"] == "registered"
    dumped = min(datetime.fromisoformat(r["dumped_at"]) for r in manifest["ranks"].values() if "dumped_at" in r)
    sent = _node_agent_sends_xid(ingest, job, layout["ranks"]["1"]["pid"], dumped - timedelta(seconds=3), tmp_path)
    assert sent == {"stored": True, "incident_id": incident, "telemetry_stored": 1}

    answer = job_client.alert({"job_id": job, "incident_id": incident, "rank": 0, "world_size": 4})
    assert answer.status_code == 200 and answer.json()["alerts"][0]["run_started"] is True, answer.text
    run_id = find_run(incident)
    assert wait_for(run_id, {"PAUSED"}) == "PAUSED"
    plan = saved_plan(flow_rig.state_dir, incident)
    assert [(a.node, a.action.value) for a in plan.actions] == [(DEAD_NODE, "drain")]
    assert drained_nodes(lab) == set()

    resume(run_id, {"decision": "approve", "plan_hash": plan.content_hash(), "nodes": [DEAD_NODE],
                    "approver": "alice", "comment": "Xid 79 on the dead rank's node"}, state_dir=flow_rig.state_dir)
    assert wait_for(run_id, {"COMPLETED"}) == "COMPLETED"
    report = report_of(flow_rig.state_dir, incident, run_id)
    assert report["outcome"] == "executed", report["reason"]
    assert [c["rank"] for c in report["candidates"]] == [1]
    assert drained_nodes(lab) == {DEAD_NODE}
    assert reason_of(lab, DEAD_NODE).startswith(f"denpex:{incident} rank 1: xid 79")


def flow_rig_manifest(flow_rig: FlowRig, base: str, timeout_s: float = 20) -> dict[str, object]:
    """The service's manifest of the incident, once it lists every rank (it is written within a second)."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=flow_rig.s3_endpoint)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            manifest = json.loads(s3.get_object(Bucket="evidence", Key=f"{base}/manifest.json")["Body"].read())
            if len(manifest["ranks"]) == 4:
                return manifest  # type: ignore[no-any-return]
        except s3.exceptions.NoSuchKey:
            pass
        assert time.monotonic() < deadline, f"no 4-rank manifest at {base}"
        time.sleep(0.3)


def _form_texts(run_id: object) -> str:
    """Every input Prefect keeps for the paused run: the form's schema and its description."""
    from prefect import get_client

    with get_client(sync_client=True) as client:
        found = client.filter_flow_run_input(flow_run_id=run_id, key_prefix="", limit=100, exclude_keys=set())
    return "\n".join(str(i.value) for i in found)


def test_with_nothing_registered_the_layout_is_derived_from_slurms_job_record(
        flow_rig: FlowRig, lab: SlurmLab, ingest: Ingest, tmp_path: Path) -> None:
    """No collector registered: the ranks that dumped name their hosts, rank 1 never did. Slurm's
    record of the job (one the test submits to the lab: 4 tasks on gpu-node-[001-004]) places rank 1
    on gpu-node-002 by block distribution; the node agent's Xid there confirms it."""
    job = lab.submit_job(["--nodelist=gpu-node-[001-004]", "--nodes=4", "--ntasks=4"],
                         output=tmp_path / "slurm-%j.out")
    fixture = ROOT / "tests" / "fixtures" / "gloo" / "sigkill"
    manifest = json.loads((fixture / "manifest.json").read_text())
    incident = f"inc-{uuid.uuid4().hex[:8]}"
    job_client = ingest.client(ingest.job_key)
    for rank in (0, 2, 3):
        ident = {**manifest["ranks"][str(rank)], "job_id": job, "incident_id": incident, "rank": rank, "world_size": 4}
        sent = job_client.upload(ident, (fixture / f"rank_{rank}.pkl").read_bytes(), f"rank_{rank}.pkl")
        assert sent.status_code == 201, sent.text
    assert job_client.job_ranks(job).status_code == 404  # nothing registered
    dumped = min(datetime.fromisoformat(r["dumped_at"].replace("Z", "+00:00"))
                 for r in manifest["ranks"].values() if "dumped_at" in r)
    agent = _node_agent_sends_xid(ingest, job, 17733, dumped - timedelta(seconds=6), tmp_path)
    assert agent["stored"] is True

    answer = job_client.alert({"job_id": job, "incident_id": incident, "rank": 0, "world_size": 4,
                               "alert_time": (dumped + timedelta(seconds=6)).isoformat()})
    assert answer.status_code == 200 and answer.json()["alerts"][0]["run_started"] is True, answer.text
    run_id = find_run(incident)
    assert wait_for(run_id, {"PAUSED"}) == "PAUSED"
    plan = saved_plan(flow_rig.state_dir, incident)
    [action] = plan.actions
    assert (action.node, action.action.value) == (DEAD_NODE, "drain")
    assert action.evidence[0] == f"host {DEAD_NODE} derived from the scheduler's job record, confirmed by its own signal"
    form = _form_texts(run_id)
    assert f"host {DEAD_NODE} is derived from the scheduler's job record" in form, form[:3000]

    resume(run_id, {"decision": "approve", "plan_hash": plan.content_hash(), "nodes": [DEAD_NODE],
                    "approver": "bob", "comment": "derived host, confirmed by its own Xid"},
           state_dir=flow_rig.state_dir)
    assert wait_for(run_id, {"COMPLETED"}) == "COMPLETED"
    report = report_of(flow_rig.state_dir, incident, run_id)
    assert report["outcome"] == "executed", report["reason"]
    [candidate] = report["candidates"]
    assert candidate["rank"] == 1 and candidate["host"] == DEAD_NODE
    assert any("derived from the scheduler's job record" in r for r in candidate["reasons"])
    assert DEAD_NODE in drained_nodes(lab)
    lab.run(["scancel", job], check=False)
