"""Telemetry through the service, end to end to the plan: from a job's key it is shown and never
supports a drain; the same telemetry from the host's node-agent key does.

The dumps are the real Gloo ``withheld_one`` fixture (rank 2 never entered its collective, on
gpu-node-003); the telemetry is one Xid 79 on rank 2's GPU a minute before the dumps.
"""

from __future__ import annotations

import json
import signal
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from denpex.ingest.client import IngestClient
from denpex.investigate import investigate
from denpex.isolation.policy import Scheduler
from ingest.conftest import Lab, make_lab
from testkit.services.ingest import ROOT
from testkit.services.s3 import MotoS3

# Sized to what it starts: the API and moto.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
FIXTURE = ROOT / "tests" / "fixtures" / "gloo" / "withheld_one"
GPU = "0000:3b:00.0"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, s3: MotoS3) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("telemetry")
    lab = make_lab(tmp, s3, None, prefix=f"tel-{uuid.uuid4().hex[:6]}")
    yield lab
    lab.api.stop(signal.SIGTERM)


def _xid_line() -> bytes:
    manifest = json.loads((FIXTURE / "manifest.json").read_text())
    newest = max(datetime.fromisoformat(r["dumped_at"].replace("Z", "+00:00")) for r in manifest["ranks"].values())
    at = newest - timedelta(minutes=1)
    return (f"{at.strftime('%Y-%m-%dT%H:%M:%S')}+0000 gpu-node-003 kernel: NVRM: Xid (PCI:0000:3b:00): 79, "
            "pid=15998, name=python, GPU has fallen off the bus.\n").encode()


def _upload_incident(lab: Lab, telemetry_client: IngestClient, telemetry_rank: int = 2) -> str:
    """Every rank's dump with the job's key, but ``telemetry_rank``'s with ``telemetry_client``'s key
    and rank 2's Xid line (gpu-node-003) beside it."""
    manifest = json.loads((FIXTURE / "manifest.json").read_text())
    incident = "inc-" + uuid.uuid4().hex[:8]
    job_client = IngestClient(lab.url, key_id=lab.key.key_id, secret=lab.key.secret, tenant="acme", cluster="c1")
    for rank in range(4):
        ident = {**manifest["ranks"][str(rank)], "job_id": "job-t", "incident_id": incident, "rank": rank,
                 "world_size": 4, "gpu_pci_bus_id": GPU, "process_groups": manifest["process_groups"]}
        client = telemetry_client if rank == telemetry_rank else job_client
        telemetry = [_xid_line()] if rank == telemetry_rank else []
        response = client.upload(ident, (FIXTURE / f"rank_{rank}.pkl").read_bytes(), f"rank_{rank}.pkl", telemetry)
        assert response.status_code == 201, response.text
    lab.s3.manifest(f"{lab.prefix}/acme/c1/job-t/{incident}", 4)  # hosts and GPUs place the Xid
    return incident


def _plan(lab: Lab, incident: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN202
    monkeypatch.setenv("DENPEX_S3_ENDPOINT_URL", lab.s3.endpoint)
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    return investigate(f"s3://{lab.s3.bucket}/{lab.prefix}/acme/c1/job-t/{incident}", scheduler=Scheduler.SLURM,
                       incident_id=incident)


def test_job_key_telemetry_is_shown_but_never_supports_a_drain(lab: Lab, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    job_client = IngestClient(lab.url, key_id=lab.key.key_id, secret=lab.key.secret, tenant="acme", cluster="c1")
    incident = _upload_incident(lab, job_client)
    found = _plan(lab, incident, tmp_path, monkeypatch)
    [candidate] = found.report.candidates
    assert candidate.rank == 2 and candidate.hardware == []
    assert any("xid 79 on gpu-node-003" in note and "never supports isolation" in note for note in found.report.notes)
    assert found.plan is not None and not found.plan.actions
    assert found.report.plan is not None and found.report.plan.recommend_isolation is False


def test_node_agent_key_telemetry_supports_the_drain(lab: Lab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agent = lab.registry.create_key("acme", "c1", host="gpu-node-003")
    agent_client = IngestClient(lab.url, key_id=agent.key_id, secret=agent.secret, tenant="acme", cluster="c1")
    incident = _upload_incident(lab, agent_client)
    found = _plan(lab, incident, tmp_path, monkeypatch)
    [candidate] = found.report.candidates
    assert [h.code for h in candidate.hardware] == [79]
    assert found.report.plan is not None and found.report.plan.recommend_isolation is True
    assert [(a.node, a.action) for a in found.report.plan.actions] == [("gpu-node-003", "drain")]


def test_a_node_agent_cannot_vouch_for_another_host(lab: Lab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """gpu-node-002's agent reporting an Xid on gpu-node-003 (beside its own rank's dump: it may
    upload no other host's) is shown, never trusted."""
    other = IngestClient(lab.url, key_id=lab.node_key.key_id, secret=lab.node_key.secret, tenant="acme", cluster="c1")
    incident = _upload_incident(lab, other, telemetry_rank=1)
    found = _plan(lab, incident, tmp_path, monkeypatch)
    assert found.report.candidates[0].hardware == []
    assert found.report.plan is not None and found.report.plan.recommend_isolation is False


# Issue 30, §3 ----------------------------------------------------------------------------------------------

def _xid_flood(part: int, size: int = 1 << 20) -> bytes:
    """``size`` bytes of distinct Xid 79 lines, spread over the job's four hosts (about 9,000 lines a MiB)."""
    lines, total, n = [], 0, 0
    while total < size:
        line = (f"2026-11-29T20:{n // 6000 % 60:02d}:{n // 100 % 60:02d}+0000 gpu-node-00{n % 4 + 1} kernel: NVRM: Xid "
                f"(PCI:0000:3b:00): 79, pid={part}{n}, GPU has fallen off the bus.\n")
        lines.append(line)
        total += len(line)
        n += 1
    return "".join(lines).encode()


def test_a_job_keys_repeated_telemetry_makes_a_note_per_kind_and_host(lab: Lab, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Two parts of 1 MiB of Xid lines from a job's key (about 18,000 events on four hosts): one
    note per kind and host, with its count, not one per event."""
    job_client = IngestClient(lab.url, key_id=lab.key.key_id, secret=lab.key.secret, tenant="acme", cluster="c1")
    manifest = json.loads((FIXTURE / "manifest.json").read_text())
    incident = "inc-" + uuid.uuid4().hex[:8]
    for rank in range(4):
        ident = {**manifest["ranks"][str(rank)], "job_id": "job-t", "incident_id": incident, "rank": rank,
                 "world_size": 4, "process_groups": manifest["process_groups"]}
        flood = [_xid_flood(0), _xid_flood(1)] if rank == 0 else []
        response = job_client.upload(ident, (FIXTURE / f"rank_{rank}.pkl").read_bytes(), f"rank_{rank}.pkl", flood)
        assert response.status_code == 201, response.text
    lab.s3.manifest(f"{lab.prefix}/acme/c1/job-t/{incident}", 4)
    notes = _plan(lab, incident, tmp_path, monkeypatch).report.notes
    about_xid = [note for note in notes if note.startswith("xid")]
    assert len(notes) <= 12 and len(about_xid) == 4, f"{len(notes)} notes, {len(about_xid)} of them about an Xid"
    counted = sorted(int(note.split(": ")[1].split(" events")[0].replace(",", "")) for note in about_xid)
    assert sum(counted) > 17_000 and counted[-1] - counted[0] <= 1, counted
    assert all("never support isolation" in note for note in about_xid)


def test_a_key_keeps_a_bounded_telemetry_per_incident(lab: Lab) -> None:
    """A job's key adds at most 16 MiB of telemetry to an incident: past it the whole request is
    refused (413) and nothing of it is stored; the dump alone is taken."""
    job_client = IngestClient(lab.url, key_id=lab.key.key_id, secret=lab.key.secret, tenant="acme", cluster="c1")
    incident = "inc-" + uuid.uuid4().hex[:8]

    def upload(rank: int, telemetry: list[bytes]) -> int:
        ident = {"job_id": "job-t", "incident_id": incident, "rank": rank, "world_size": 4}
        return job_client.upload(ident, (FIXTURE / f"rank_{rank}.pkl").read_bytes(), f"rank_{rank}.pkl",
                                 telemetry).status_code

    assert upload(0, [_xid_flood(p) for p in range(8)]) == 201
    base = f"{lab.prefix}/acme/c1/job-t/{incident}/"
    lab.s3.manifest(base.rstrip("/"), 1)  # written a moment after the upload: wait for it
    before = lab.s3.keys(base)
    over = job_client.upload({"job_id": "job-t", "incident_id": incident, "rank": 1, "world_size": 4},
                             (FIXTURE / "rank_1.pkl").read_bytes(), "rank_1.pkl", [_xid_flood(p) for p in range(8, 17)])
    assert over.status_code == 413 and "a key keeps at most" in over.json()["error"], over.text
    assert [k for k in lab.s3.keys(base) if "rank_1" in k or k not in before] == []  # nothing of it stored
    assert upload(1, []) == 201
