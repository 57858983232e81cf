"""Issue 16, findings 12 and 14 against the real ``denpex serve-api`` (a local evidence folder).

- telemetry re-sent beside an identical dump is stored (the dump answers ``stored: false``);
- a refused request leaves nothing in the store, under parallel uploads, whichever write of an
  upload fails (the store is made to refuse one name by putting a directory where it goes).
"""

from __future__ import annotations

import hashlib
import json
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from denpex.ingest.client import IngestClient, encode_multipart
from denpex.ingest.plans import PlanTier
from denpex.ingest.registry import IssuedKey, Registry
from denpex.ingest.signing import signed_headers
from testkit.services.ingest import ROOT, ApiServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
FIXTURE = ROOT / "tests" / "fixtures" / "gloo" / "withheld_one"
KERNEL_LOG = (b"2026-12-01T13:08:14+0000 gpu-node-002 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, "
              b"GPU has fallen off the bus.\n")


@dataclass
class LocalLab:
    api: ApiServer
    key: IssuedKey
    node_key: IssuedKey
    store: Path

    def client(self, key: IssuedKey | None = None) -> IngestClient:
        key = key or self.key
        return IngestClient(self.api.url, key_id=key.key_id, secret=key.secret, tenant="acme", cluster="c1")

    def files(self, job: str, incident: str) -> set[str]:
        base = self.store / "acme" / "c1" / job / incident
        return {str(p.relative_to(base)) for p in base.rglob("*") if p.is_file()} if base.exists() else set()


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalLab]:
    tmp = tmp_path_factory.mktemp("integrity")
    registry = Registry(tmp / "state")
    registry.add_tenant("acme", PlanTier.DATA_CENTER)
    key = registry.create_key("acme", "c1")
    node_key = registry.create_key("acme", "c1", host="gpu-node-002")
    api = ApiServer(tmp / "state", str(tmp / "evidence"), s3_endpoint=None, prefect_api_url=None, log_dir=tmp)
    api.start()
    yield LocalLab(api=api, key=key, node_key=node_key, store=tmp / "evidence")
    api.stop(signal.SIGTERM)


def identity(rank: int, incident: str, job: str = "job-1", **extra: Any) -> dict[str, Any]:
    return {"job_id": job, "incident_id": incident, "rank": rank, "world_size": 4,
            "dumped_at": "2026-12-01T13:09:14+00:00", **extra}


def dump(rank: int) -> bytes:
    return (FIXTURE / f"rank_{rank}.pkl").read_bytes()


def new_incident() -> str:
    return "inc-" + uuid.uuid4().hex[:10]


def expected_files(ranks: list[int]) -> set[str]:
    return {"manifest.json"} | {f"rank_{r}.pkl" for r in ranks} | {f"versions/rank_{r}/v1.pkl" for r in ranks}


def wait_for_manifest(lab: LocalLab, job: str, incident: str, ranks: int) -> None:
    path = lab.store / "acme" / "c1" / job / incident / "manifest.json"
    for _ in range(100):
        if path.exists() and len(json.loads(path.read_text())["ranks"]) >= ranks:
            return
        time.sleep(0.1)
    raise AssertionError(f"{path} never listed {ranks} ranks")


# finding 12 --------------------------------------------------------------------------------------
def test_telemetry_resent_with_an_identical_dump_is_stored(lab: LocalLab) -> None:
    incident = new_incident()
    first = lab.client().upload(identity(1, incident), dump(1), "rank_1.pkl")
    assert first.status_code == 201, first.text
    again = lab.client(lab.node_key).upload(identity(1, incident), dump(1), "rank_1.pkl", [KERNEL_LOG])
    assert again.status_code == 200 and again.json()["stored"] is False, again.text
    name = f"telemetry/trusted/gpu-node-002-{hashlib.sha256(KERNEL_LOG).hexdigest()[:12]}.log"
    base = lab.store / "acme" / "c1" / "job-1" / incident
    assert name in lab.files("job-1", incident), lab.files("job-1", incident)
    assert (base / name).read_bytes() == KERNEL_LOG
    index = json.loads((base / "telemetry.json").read_text())
    assert index["trusted"] == [{"name": name, "host": "gpu-node-002"}], index
    assert again.json() == {**first.json(), "stored": False, "telemetry_stored": 1}
    assert first.json()["telemetry_stored"] == 0
    thrice = lab.client(lab.node_key).upload(identity(1, incident), dump(1), "rank_1.pkl", [KERNEL_LOG])
    assert thrice.status_code == 200 and thrice.json()["telemetry_stored"] == 0, thrice.text


# finding 14 --------------------------------------------------------------------------------------
def _forged(lab: LocalLab, rank: int, incident: str) -> Callable[[], httpx.Response]:
    def send() -> httpx.Response:
        body, content_type = encode_multipart({"identity": json.dumps(identity(rank, incident))},
                                              [("dump", f"rank_{rank}.pkl", dump(rank))])
        headers = signed_headers(secret=b"wrong", key_id=lab.key.key_id, tenant="acme", cluster="c1",
                                 method="POST", path="/v1/evidence", body=body)
        return httpx.post(f"{lab.api.url}/v1/evidence", content=body, headers=headers | {"Content-Type": content_type},
                          timeout=60)
    return send


def test_refused_requests_under_parallel_uploads_leave_nothing(lab: LocalLab) -> None:
    incidents = [new_incident() for _ in range(4)]
    broken = new_incident()
    c = lab.client()
    for incident in [*incidents, broken]:
        assert c.upload(identity(0, incident), dump(0), "rank_0.pkl").status_code == 201
    base = lab.store / "acme" / "c1" / "job-1" / broken
    # The store refuses one name of each of these uploads, after it took the earlier ones:
    # rank 1's current dump (after its version), and the telemetry index (after the version, the
    # telemetry and the current dump of rank 0's version 2).
    (base / "rank_1.pkl").mkdir()
    (base / "telemetry.json").mkdir()
    hostile = b"cos\nsystem\n(S'true'\ntR."
    def upload(rank: int, incident: str, data: bytes, job: str = "job-1", **kw: Any) -> Callable[[], httpx.Response]:
        telemetry = kw.pop("telemetry", [])
        return lambda: c.upload(identity(rank, incident, job, **kw), data, f"rank_{rank}.pkl", telemetry)

    work: list[tuple[int, Callable[[], httpx.Response]]] = []
    for incident in incidents:
        work += [(201, upload(rank, incident, dump(rank))) for rank in (1, 2, 3)]
        work.append((409, upload(2, incident, dump(2), job="job-2")))
        work.append((401, _forged(lab, 3, incident)))
        work.append((422, upload(1, incident, hostile)))
    work.append((503, upload(1, broken, dump(1))))
    work.append((503, upload(0, broken, dump(3), dumped_at="2026-12-01T13:10:00+00:00", telemetry=[KERNEL_LOG])))
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda item: item[1](), work))

    for incident in incidents:
        wait_for_manifest(lab, "job-1", incident, 4)
        assert lab.files("job-1", incident) == expected_files([0, 1, 2, 3])
        assert lab.files("job-2", incident) == set()
    wait_for_manifest(lab, "job-1", broken, 1)
    assert lab.files("job-1", broken) == expected_files([0])
    # The refused version 2 of rank 0 had replaced the current dump: it was put back.
    assert (base / "rank_0.pkl").read_bytes() == dump(0)
    assert [a.status_code for a in answers] == [status for status, _ in work], [a.text for a in answers]
