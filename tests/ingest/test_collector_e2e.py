"""End to end: 4 real Gloo ranks with the collector, a forced hang, signed uploads through the real
HTTP service into moto S3; and an API stopped mid-upload and restarted: the spool delivers everything.
"""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from denpex.collector import Backoff, EvidenceUploader, UploadTarget
from denpex.ingest.client import IngestClient
from denpex.ingest.incidents import IncidentBook, IncidentKey
from ingest.conftest import Lab, make_lab
from testkit.generators.gloo_scenarios import SCENARIOS, WORK_DIR, GeneratorOptions, run_scenario
from testkit.services.s3 import MotoS3

# Sized to what it starts: real Gloo ranks uploading through the API.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
SURVIVORS = {0, 2, 3}  # "sigkill": rank 1 idles and is SIGKILLed, 0, 2 and 3 wait for it and dump
OPTIONS = GeneratorOptions(long_stall=None, attempts=2)


@pytest.fixture
def plain_lab(tmp_path: Path, s3: MotoS3) -> Iterator[Lab]:
    lab = make_lab(tmp_path, s3, None, prefix=f"e2e-{uuid.uuid4().hex[:6]}")
    yield lab
    lab.api.stop(signal.SIGTERM)


def _configure_ranks(lab: Lab, monkeypatch: pytest.MonkeyPatch, job: str) -> UploadTarget:
    env = {"DENPEX_INGEST_URL": lab.url, "DENPEX_INGEST_KEY_ID": lab.key.key_id, "DENPEX_INGEST_SECRET": lab.key.secret,
           "DENPEX_TENANT": "acme", "DENPEX_CLUSTER": "c1", "DENPEX_JOB_ID": job}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    target = UploadTarget.from_env()
    assert target is not None
    return target


def _drain_leftovers(target: UploadTarget, work: Path, timeout_s: float = 60) -> int:
    """What a restarted rank does: deliver whatever its spool still holds. Returns how many were left."""
    spools = sorted((work / "spool").iterdir())
    uploaders = [EvidenceUploader(target, dump_dir=work / "collected", spool_dir=s, attach_nvml=False) for s in spools]
    left = sum(len(u.spool.pending()) for u in uploaders)
    deadline = time.monotonic() + timeout_s
    while not all(u.deliver_once() for u in uploaders):
        assert time.monotonic() < deadline, "the spool did not drain"
        time.sleep(0.5)
    assert all(not u.spool.rejected() for u in uploaders), [u.spool.rejected() for u in uploaders]
    return left


def _incident(lab: Lab, job: str) -> str:
    incident = IncidentBook(lab.registry.db).open_incident("acme", "c1", job)
    assert incident is not None, "no upload reached the service"
    return incident


def _check_arrived(lab: Lab, job: str, work: Path) -> dict:
    incident = _incident(lab, job)
    base = f"{lab.prefix}/acme/c1/{job}/{incident}"
    keys = set(lab.s3.keys(base + "/"))
    for rank in SURVIVORS:
        for ext in (".pkl", ".json"):
            name = f"rank_{rank}{ext}"
            assert f"{base}/{name}" in keys, sorted(keys)
            # Byte for byte what the rank wrote, in version 1: nothing lost, nothing duplicated.
            assert lab.s3.read(f"{base}/{name}") == (work / "collected" / name).read_bytes()
        # The rank's Python stacks at its dump came with it, where triage reads them (issue 19).
        stacks = f"collector/rank_{rank}.stacks.json"
        assert lab.s3.read(f"{base}/{stacks}") == (work / "collected" / stacks).read_bytes()
        assert f"{base}/versions/rank_{rank}/v1.stacks.json" in keys
    assert not any("rank_1" in k for k in keys)
    assert not any("/v2." in k for k in keys), sorted(keys)
    uploads = IncidentBook(lab.registry.db).uploads(IncidentKey("acme", "c1", incident))
    assert sorted((u.rank, u.encoding.value) for u in uploads) == sorted(
        (r, e) for r in SURVIVORS for e in ("json", "pickle"))
    view = IngestClient(lab.url, key_id=lab.key.key_id, secret=lab.key.secret, tenant="acme",
                        cluster="c1").incident(incident)
    assert view.status_code == 200, view.text
    return view.json()


def test_gloo_ranks_upload_through_the_service(plain_lab: Lab, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    job = f"gloo-{uuid.uuid4().hex[:6]}"
    target = _configure_ranks(plain_lab, monkeypatch, job)
    run_scenario(tmp_path / "out", SCENARIOS["sigkill"], OPTIONS)
    work = tmp_path / "out" / WORK_DIR / "sigkill"
    left = _drain_leftovers(target, work)
    view = _check_arrived(plain_lab, job, work)
    assert view["world_size"] == 4 and view["ranks_with_evidence"] == [0, 2, 3] and view["missing_ranks"] == [1]
    manifest = plain_lab.s3.manifest(f"{plain_lab.prefix}/acme/c1/{job}/{view['incident_id']}", 3)
    # Group membership from torch.distributed, as FR names the groups.
    assert {g["desc"] for g in manifest["process_groups"].values()} >= {"tp", "dp"}
    print(f"delivered by the ranks themselves: {6 - left} of 6 uploads; by the restarted spool: {left}")


def test_api_stopped_mid_upload_then_restarted(plain_lab: Lab, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The API is down while the ranks dump (everything goes to their spools); it comes back, and
    is killed again in the middle of the spools' delivery, then restarted: everything arrives once."""
    job = f"gloo-{uuid.uuid4().hex[:6]}"
    target = _configure_ranks(plain_lab, monkeypatch, job)
    run_scenario(tmp_path / "out", SCENARIOS["sigkill"], OPTIONS, on_hang=lambda: plain_lab.api.stop(signal.SIGKILL))
    work = tmp_path / "out" / WORK_DIR / "sigkill"
    uploaders = [EvidenceUploader(target, dump_dir=work / "collected", spool_dir=s, attach_nvml=False,
                                  backoff=Backoff(first_s=0.2, max_s=2.0))
                 for s in sorted((work / "spool").iterdir())]
    spooled = sum(len(u.spool.pending()) for u in uploaders)
    assert spooled == 6, f"with the API down every upload must wait in a spool, found {spooled}"
    plain_lab.api.start()
    for uploader in uploaders:
        uploader.start()  # the real delivery threads, with backoff
    try:
        deadline = time.monotonic() + 60
        while not plain_lab.s3.keys(f"{plain_lab.prefix}/acme/c1/{job}/"):
            assert time.monotonic() < deadline, "nothing was delivered after the API came back"
            time.sleep(0.01)
        plain_lab.api.stop(signal.SIGKILL)  # mid-delivery
        left_at_kill = sum(len(u.spool.pending()) for u in uploaders)
        time.sleep(1.0)
        plain_lab.api.start()
        while any(u.spool.pending() for u in uploaders):
            assert time.monotonic() < deadline + 60, "the spools did not drain after the restart"
            time.sleep(0.2)
    finally:
        for uploader in uploaders:
            uploader.stop()
    assert all(not u.spool.rejected() for u in uploaders)
    assert left_at_kill >= 1, "the API was killed after everything was delivered: not mid-upload"
    view = _check_arrived(plain_lab, job, work)
    assert view["missing_ranks"] == [1]
    print(f"spooled while the API was down: {spooled}; still pending when it was killed again: {left_at_kill}")
