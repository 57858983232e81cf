"""An alert through the service starts the real incident flow (``flows/triage.py``, deployment
``denpex-triage/on-alert`` served by ``python -m flows.serve``) on a real Prefect server.

Every rank's dump of the real Gloo ``withheld_one`` incident is uploaded first, then one signed
alert and its repeats arrive: exactly one triage run exists for the incident, with the alert's
parameters, and it triages the evidence the service stored (it finishes, or pauses for approval).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from denpex.ingest.client import IngestClient
from ingest.conftest import Lab, make_lab
from testkit.services.ingest import ROOT
from testkit.services.prefect import PrefectServer, wait_for_deployments
from testkit.services.process_group import stop_process_group
from testkit.services.s3 import AWS_ENV, MotoS3

# Sized to what it starts: a Prefect server, `denpex serve` and the API; a run waited up to 240 s.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
FIXTURE = ROOT / "tests" / "fixtures" / "gloo" / "withheld_one"


@pytest.fixture(scope="module")
def flow_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PrefectServer, Path]]:
    """Its own Prefect server, so that the probe deployment of the other tests never runs here."""
    work = tmp_path_factory.mktemp("flow-engine")
    server = PrefectServer(work, ui=False)
    server.start()
    runbooks = work / "runbooks"
    runbooks.mkdir()
    body = yaml.safe_load((ROOT / "runbooks" / "hang-triage.yaml").read_text())
    body["approval"]["max_plan_age"] = "P3650D"  # the bundled dumps were recorded on 2026-11-29
    body["workflow"] = {**body.get("workflow", {}), "evidence_grace": "PT6S", "coverage_poll": "PT1S",
                        "approval_timeout": "PT60S", "approval_poll": "PT1S"}
    (runbooks / "hang-triage.yaml").write_text(yaml.safe_dump(body))
    env = {**server.env(), **AWS_ENV, "DENPEX_RUNBOOKS_DIR": str(runbooks),
           "DENPEX_STATE_DIR": str(work / "flow-state")}
    subprocess.run([sys.executable, "-c", "from blocks import DenpexRunbook; "
                    "DenpexRunbook(name='hang-triage').save('default', overwrite=True)"],
                   env=env, cwd=ROOT, check=True, capture_output=True, timeout=120)
    yield server, work
    server.stop()


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, s3: MotoS3,
        flow_engine: tuple[PrefectServer, Path]) -> Iterator[Lab]:
    from ingest.conftest import Engine

    tmp = tmp_path_factory.mktemp("flow-lab")
    lab = make_lab(tmp, s3, Engine(api_url=flow_engine[0].api_url, deployment="on-alert"),
                   prefix=f"flow-{uuid.uuid4().hex[:6]}")
    yield lab
    lab.api.stop(signal.SIGTERM)


def test_alert_through_the_service_starts_one_real_triage_run(lab: Lab,
                                                              flow_engine: tuple[PrefectServer, Path]) -> None:
    server, work = flow_engine
    api_url = server.api_url
    env = {**server.env(), **AWS_ENV, "DENPEX_RUNBOOKS_DIR": str(work / "runbooks"),
           "DENPEX_STATE_DIR": str(work / "flow-state"), "DENPEX_S3_ENDPOINT_URL": lab.s3.endpoint,
           # The service's --store: the run triages exactly the incident's folder in it.
           "DENPEX_EVIDENCE_ROOT": f"s3://{lab.s3.bucket}/{lab.prefix}"}
    log = work / "serve.log"
    with log.open("ab") as out:
        served = subprocess.Popen([sys.executable, "-m", "flows.serve", "--only", "on-alert"], cwd=ROOT, env=env,
                                  stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_deployments(api_url, ["on-alert"], served, log, 180, automations=["denpex-alert"])
        incident = "inc-" + uuid.uuid4().hex[:8]
        manifest = json.loads((FIXTURE / "manifest.json").read_text())
        client = IngestClient(lab.url, key_id=lab.key.key_id, secret=lab.key.secret, tenant="acme", cluster="c1")
        for rank in range(4):
            ident = {**manifest["ranks"][str(rank)], "job_id": "job-f", "incident_id": incident, "rank": rank,
                     "world_size": 4, "process_groups": manifest["process_groups"]}
            assert client.upload(ident, (FIXTURE / f"rank_{rank}.pkl").read_bytes(), f"rank_{rank}.pkl").status_code == 201
        lab.s3.manifest(f"{lab.prefix}/acme/c1/job-f/{incident}", 4)
        receipts = [client.alert({"job_id": "job-f", "incident_id": incident, "rank": 3, "world_size": 4}).json()
                    for _ in range(3)]
        assert [r["alerts"][0]["run_started"] for r in receipts] == [True, False, False]
        alert_id = receipts[0]["alerts"][0]["alert_id"]
        runs = _runs(api_url, alert_id, settled={"COMPLETED", "PAUSED", "FAILED", "CRASHED"}, log=log)
        assert len(runs) == 1, runs
        [run] = runs
        assert run["parameters"]["incident_id"] == incident and run["parameters"]["world_size"] == 4
        assert run["parameters"]["evidence"] == f"s3://{lab.s3.bucket}/{lab.prefix}/acme/c1/job-f/{incident}"
        assert run["state"]["type"] in ("COMPLETED", "PAUSED"), (run["state"], log.read_text()[-3000:])
        view = client.incident(incident).json()
        assert view["flow_run"]["flow_run_id"] == run["id"] and view["flow_run"]["state"] == run["state"]["type"]
        print(f"real triage run {run['name']}: {run['state']['type']} ({run['state'].get('name')})")
    finally:
        stop_process_group(served)


def _runs(api_url: str, alert_id: str, *, settled: set[str], log: Path) -> list[dict]:  # type: ignore[type-arg]
    deadline = time.monotonic() + 240
    runs: list[dict] = []  # type: ignore[type-arg]
    while time.monotonic() < deadline:
        listed = httpx.post(f"{api_url}/flow_runs/filter", json={"limit": 200}, timeout=10).json()
        runs = [r for r in listed if r.get("parameters", {}).get("alert_id") == alert_id]
        if runs and all(r["state"]["type"] in settled for r in runs):
            time.sleep(2)  # a wrongly started second run would show up by now
            return [r for r in httpx.post(f"{api_url}/flow_runs/filter", json={"limit": 200}, timeout=10).json()
                    if r.get("parameters", {}).get("alert_id") == alert_id]
        time.sleep(1)
    raise AssertionError(f"no settled triage run for {alert_id} in 240 s: {runs}\n{log.read_text()[-3000:]}")
