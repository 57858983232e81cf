"""An alert through the service starts the real incident flow (``flows/triage.py``, deployment
``denpex-triage/on-alert`` served by ``python -m flows.serve``) on a real Prefect server.

Every rank's dump of the real Gloo ``withheld_one`` incident is uploaded first, then one signed
alert and its repeats arrive: exactly one triage run exists for the incident, with the alert's
parameters, and it triages the evidence the service stored (it finishes, or pauses for approval).

On the suite's flow rig (its ingest service, served flows, S3 and Prefect server), not on a server
of its own: the rig serves `on-alert` with the alert trigger, as `denpex serve` does, and no probe
deployment listens there.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest

from conftest import RigIngest
from flow_driver import FlowRig, resume, wait_for
from testkit.incident_folder import wait_for_manifest

# Sized to what it runs: a triage run on the shared rig, waited for up to 240 s.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "gloo" / "withheld_one"


def test_alert_through_the_service_starts_one_real_triage_run(flow_rig: FlowRig, rig_ingest: RigIngest,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DENPEX_S3_ENDPOINT_URL", flow_rig.s3_endpoint)  # to read the stored manifest back
    incident, job = "inc-" + uuid.uuid4().hex[:8], "job-" + uuid.uuid4().hex[:6]
    manifest = json.loads((FIXTURE / "manifest.json").read_text())
    client = rig_ingest.client(rig_ingest.key())
    for rank in range(4):
        ident = {**manifest["ranks"][str(rank)], "job_id": job, "incident_id": incident, "rank": rank,
                 "world_size": 4, "process_groups": manifest["process_groups"]}
        assert client.upload(ident, (FIXTURE / f"rank_{rank}.pkl").read_bytes(), f"rank_{rank}.pkl").status_code == 201
    evidence = f"s3://evidence/{rig_ingest.prefix}/acme/lab/{job}/{incident}"
    wait_for_manifest(evidence, {0, 1, 2, 3})
    receipts = [client.alert({"job_id": job, "incident_id": incident, "rank": 3, "world_size": 4}).json()
                for _ in range(3)]
    assert [r["alerts"][0]["run_started"] for r in receipts] == [True, False, False]
    alert_id = receipts[0]["alerts"][0]["alert_id"]
    runs = _runs(alert_id, settled={"COMPLETED", "PAUSED", "FAILED", "CRASHED"}, log=flow_rig.serve_log)
    assert len(runs) == 1, runs
    [run] = runs
    assert run.parameters["incident_id"] == incident and run.parameters["world_size"] == 4
    assert run.parameters["evidence"] == evidence
    assert run.state is not None and run.state.type.value in ("COMPLETED", "PAUSED"), (
        run.state, flow_rig.serve_log.read_text()[-3000:])
    view = client.incident(incident).json()
    assert view["flow_run"]["flow_run_id"] == str(run.id) and view["flow_run"]["state"] == run.state.type.value
    print(f"real triage run {run.name}: {run.state.type.value} ({run.state.name})")
    if run.state.type.value == "PAUSED":  # answered, so that the rig holds no paused run after the test
        resume(run.id, {"decision": "reject", "approver": "carol", "comment": "a test's run, not to be executed"},
               state_dir=flow_rig.state_dir)
        assert wait_for(run.id, {"COMPLETED"}) == "COMPLETED"


def _runs(alert_id: str, *, settled: set[str], log: Path) -> list:  # type: ignore[type-arg]
    """The runs started for ``alert_id`` once every one of them settled."""
    from prefect import get_client
    from prefect.client.schemas.sorting import FlowRunSort

    def listed() -> list:  # type: ignore[type-arg]
        with get_client(sync_client=True) as client:
            return [r for r in client.read_flow_runs(limit=200, sort=FlowRunSort.EXPECTED_START_TIME_DESC)
                    if r.parameters.get("alert_id") == alert_id]

    deadline = time.monotonic() + 240
    runs: list = []  # type: ignore[type-arg]
    while time.monotonic() < deadline:
        runs = listed()
        if runs and all(r.state is not None and r.state.type.value in settled for r in runs):
            time.sleep(2)  # a wrongly started second run would show up by now
            return listed()
        time.sleep(1)
    raise AssertionError(f"no settled triage run for {alert_id} in 240 s: {runs}\n{log.read_text()[-3000:]}")
