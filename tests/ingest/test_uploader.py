"""The collector's uploader against the real service: refused for good is set aside, never retried;
a store outage keeps the upload in the spool until it is acknowledged; a restart finds the spool."""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from denpex.collector import Backoff, DumpRecord, DumpRequest, DumpTrigger, EvidenceUploader, UploadTarget
from denpex.collector.uploader import incident_id_for
from denpex.ingest.client import IngestClient
from ingest.conftest import Lab, make_lab
from testkit.services.ingest import ROOT
from testkit.services.s3 import MotoS3

# Sized to what it starts: the API and moto, stopped and started.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
FIXTURE = ROOT / "tests" / "fixtures" / "gloo" / "withheld_one"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, s3: MotoS3) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("uploader")
    lab = make_lab(tmp, s3, None, prefix=f"up-{uuid.uuid4().hex[:6]}")
    yield lab
    lab.api.stop(signal.SIGTERM)


def _uploader(lab: Lab, tmp_path: Path, key_id: str, secret: str, job: str) -> EvidenceUploader:
    target = UploadTarget(url=lab.url, key_id=key_id, secret=secret, tenant="acme", cluster="c1",  # type: ignore[arg-type]
                          job_id=job)
    return EvidenceUploader(target, dump_dir=FIXTURE, spool_dir=tmp_path / "spool", attach_nvml=False,
                            identity={"world_size": 4}, backoff=Backoff(first_s=0.1, max_s=0.5))


def _record(rank: int) -> tuple[DumpRecord, DumpRequest]:
    now = datetime.now(UTC)
    record = DumpRecord(rank=rank, host=f"gpu-node-00{rank + 1}", pid=1, dumped_at=now, trigger=DumpTrigger.STALL,
                        reason="test", files=[f"rank_{rank}.pkl"], dump_seconds=0.0)
    return record, DumpRequest(requested_by=f"rank {rank}", reason="test", requested_at=now)


def test_a_refused_upload_is_set_aside_and_never_retried(lab: Lab, tmp_path: Path) -> None:
    revoked = lab.registry.create_key("acme", "c1")
    lab.registry.revoke_key(revoked.key_id)
    uploader = _uploader(lab, tmp_path, revoked.key_id, revoked.secret, "job-u")
    uploader.submit(*_record(0))
    assert uploader.spool.pending() == []
    [rejected] = uploader.spool.rejected()
    assert "HTTP 403" in (rejected / "error.txt").read_text() and "revoked" in (rejected / "error.txt").read_text()
    assert uploader.delivered == 0


def test_a_store_outage_keeps_the_upload_until_acknowledged(lab: Lab, tmp_path: Path) -> None:
    job = f"job-{uuid.uuid4().hex[:6]}"
    uploader = _uploader(lab, tmp_path, lab.key.key_id, lab.key.secret, job)
    record, request = _record(1)
    lab.s3.stop()
    try:
        uploader.submit(record, request)  # the API answers 503: spooled, not lost
        assert len(uploader.spool.pending()) == 1 and uploader.delivered == 0
    finally:
        lab.s3.start()
    # A restarted rank: a new uploader over the same spool delivers it.
    again = _uploader(lab, tmp_path, lab.key.key_id, lab.key.secret, job)
    assert again.deliver_once() is True and again.delivered == 1
    base = f"{lab.prefix}/acme/c1/{job}/{incident_id_for(request)}"
    assert lab.s3.read(f"{base}/rank_1.pkl") == (FIXTURE / "rank_1.pkl").read_bytes()


def test_the_uploader_registers_its_rank_at_start_and_a_restart_elsewhere_is_a_recorded_move(
        lab: Lab, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    job = f"job-{uuid.uuid4().hex[:6]}"
    target = UploadTarget(url=lab.url, key_id=lab.key.key_id, secret=lab.key.secret, tenant="acme",  # type: ignore[arg-type]
                          cluster="c1", job_id=job)
    identity = {"rank": 1, "world_size": 4, "host": "gpu-node-002", "local_rank": 0, "pid": 4242}
    first = EvidenceUploader(target, dump_dir=FIXTURE, spool_dir=tmp_path / "a", attach_nvml=False,
                             identity=identity).start()
    first.stop()
    assert first.registered == 1
    client = IngestClient(lab.url, key_id=lab.key.key_id, secret=lab.key.secret, tenant="acme", cluster="c1")
    assert client.job_ranks(job).json()["ranks"]["1"] == {"host": "gpu-node-002", "local_rank": 0, "pid": 4242}
    # The job restarts; rank 1 now runs on gpu-node-009.
    restarted = EvidenceUploader(target, dump_dir=FIXTURE, spool_dir=tmp_path / "b", attach_nvml=False,
                                 identity={**identity, "host": "gpu-node-009", "pid": 5151}).start()
    restarted.stop()
    layout = client.job_ranks(job).json()
    assert layout["ranks"]["1"]["host"] == "gpu-node-009"
    assert [(m["from_host"], m["to_host"]) for m in layout["moves"]["1"]] == [("gpu-node-002", "gpu-node-009")]
    assert any("re-registered from gpu-node-002 to gpu-node-009" in r.getMessage() for r in caplog.records)


def test_a_registration_the_service_cannot_take_is_retried_by_the_delivery_thread(lab: Lab, tmp_path: Path) -> None:
    job = f"job-{uuid.uuid4().hex[:6]}"
    target = UploadTarget(url=lab.url, key_id=lab.key.key_id, secret=lab.key.secret, tenant="acme",  # type: ignore[arg-type]
                          cluster="c1", job_id=job)
    lab.api.stop()
    uploader = EvidenceUploader(target, dump_dir=FIXTURE, spool_dir=tmp_path / "s", attach_nvml=False,
                                identity={"rank": 0, "world_size": 4, "host": "gpu-node-001"},
                                backoff=Backoff(first_s=0.1, max_s=0.5))
    try:
        uploader.start()  # the service is down: the job starts anyway
        assert uploader.registered == 0
        lab.api.start()
        deadline = time.monotonic() + 30
        while uploader.registered == 0:
            assert time.monotonic() < deadline, "the registration was not retried"
            time.sleep(0.2)
    finally:
        uploader.stop()
        if lab.api.proc is None:
            lab.api.start()
    client = IngestClient(lab.url, key_id=lab.key.key_id, secret=lab.key.secret, tenant="acme", cluster="c1")
    assert client.job_ranks(job).json()["ranks"]["0"]["host"] == "gpu-node-001"


def test_a_dump_whose_telemetry_is_refused_is_sent_again_without_it(lab: Lab, tmp_path: Path) -> None:
    """Issue 30, §3: once the job's key holds all the telemetry it may add to an incident (16 MiB),
    a rank's upload with more is refused (413); the uploader sends the dump alone, never losing it."""
    job = f"job-{uuid.uuid4().hex[:6]}"
    uploader = _uploader(lab, tmp_path, lab.key.key_id, lab.key.secret, job)
    record, request = _record(2)
    incident = incident_id_for(request)
    client = IngestClient(lab.url, key_id=lab.key.key_id, secret=lab.key.secret, tenant="acme", cluster="c1")
    full = [bytes([65 + i]) * (2 << 20) for i in range(8)]  # 16 MiB of the key's telemetry in this incident
    held = client.upload({"job_id": job, "incident_id": incident, "rank": 0, "world_size": 4},
                         (FIXTURE / "rank_0.pkl").read_bytes(), "rank_0.pkl", full)
    assert held.status_code == 201, held.text
    identity = {"job_id": job, "incident_id": incident, "rank": 2, "world_size": 4, "host": "gpu-node-003"}
    uploader.spool.put(identity, FIXTURE / "rank_2.pkl", [b"one NVML snapshot too many\n"])
    assert uploader.deliver_once() is True and uploader.delivered == 1
    assert uploader.spool.rejected() == []
    base = f"{lab.prefix}/acme/c1/{job}/{incident}"
    assert lab.s3.read(f"{base}/rank_2.pkl") == (FIXTURE / "rank_2.pkl").read_bytes()
    assert len([k for k in lab.s3.keys(f"{base}/telemetry/") if k.endswith(".log")]) == 8  # none of the refused
