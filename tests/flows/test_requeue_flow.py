"""Issue 20 item 4 through the flows: while the hung job still runs on the drained node, the
isolation's report says so and tells the UI operator the UI way, the ``requeue-hung-job``
deployment, which pauses for its own approval and restarts the job without the node. (With no job
on the node there is no such note: ``test_triage_flow.test_alert_event_to_drain_on_approval``.)"""

from __future__ import annotations

import json
import time
from typing import Any
from uuid import UUID

import pytest

from conftest import FIXTURES, upload
from denpex.isolation.slurm_parse import parse_show_job
from flow_driver import (
    CULPRIT_NODE,
    FlowRig,
    alert,
    evidence_prefix,
    manifest_with_gpus,
    report_of,
    resume,
    saved_plan,
    start_manual,
    wait_for,
    xid79_log,
)
from testkit.services.slurm import SlurmLab

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SCENARIO = FIXTURES / "withheld_one"


def hung_job_on(lab: SlurmLab, node: str) -> str:
    """A job that runs on ``node`` (the training job that hung there); its id once RUNNING."""
    return lab.submit_sleep(node)


def answer(run_id: UUID, rig: FlowRig, incident: str, **fields: Any) -> None:
    plan = saved_plan(rig.state_dir, incident)
    resume(run_id, {"decision": "approve", "plan_hash": plan.content_hash(), "nodes": [a.node for a in plan.actions],
                    "comment": "", **fields}, state_dir=rig.state_dir)


def test_the_hung_job_note_leads_to_the_requeue_deployment(flow_rig: FlowRig, lab: SlurmLab) -> None:
    from prefect.deployments import run_deployment

    incident = "inc-hung-job"
    job = hung_job_on(lab, CULPRIT_NODE)
    # The manifest names the job (its id wins over the alert's): here the Slurm job that hung.
    manifest = {**json.loads(manifest_with_gpus(SCENARIO)), "job_id": job}
    evidence = upload(flow_rig.s3_endpoint, evidence_prefix(incident, job_id=job), SCENARIO,
                      extra={"manifest.json": json.dumps(manifest).encode(), "kernel.log": xid79_log()})
    run_id = start_manual(alert(incident, evidence, job_id=job))
    assert wait_for(run_id, {"PAUSED"}) == "PAUSED"
    answer(run_id, flow_rig, incident, approver="alice")
    assert wait_for(run_id, {"COMPLETED"}) == "COMPLETED"
    report = report_of(flow_rig.state_dir, incident, run_id)
    assert report["outcome"] == "executed", report["reason"]
    [note] = [n for n in report["execution"]["notes"] if "never ends" in n]
    assert f"job {job} still runs on {CULPRIT_NODE}" in note
    assert f"start the requeue-hung-job deployment for incident {incident} in the Prefect UI" in note
    assert "--" not in note
    assert lab.state_of(CULPRIT_NODE) in ("MIXED+DRAIN", "ALLOCATED+DRAIN")  # draining, for good

    run = run_deployment("denpex-requeue-hung-job/requeue-hung-job",
                         parameters={"cluster": "lab", "incident_id": incident}, timeout=0)
    assert wait_for(run.id, {"PAUSED"}) == "PAUSED"
    answer(run.id, flow_rig, incident, approver="bob", comment="restart it elsewhere")
    assert wait_for(run.id, {"COMPLETED"}) == "COMPLETED"
    shown = parse_show_job(lab.run(["scontrol", "-o", "show", "job", job]).stdout)
    assert shown is not None and CULPRIT_NODE in shown.excluded and CULPRIT_NODE not in shown.active_on
    deadline = time.monotonic() + 60
    while lab.state_of(CULPRIT_NODE) != "IDLE+DRAIN" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert lab.state_of(CULPRIT_NODE) == "IDLE+DRAIN"  # drained now, no longer draining
