"""Issue 18, item 2 on Kubernetes: a rank that died without a dump, and that nobody placed, gets its
host from the job's pods; the drain (cordon and taint) needs that node's own hardware signal.

The incident flow runs on the real Prefect engine (the session's harness, in this process); the
Kubernetes API is the loopback fake, read and patched through the official client. The evidence
is the real Gloo ``sigkill`` run (rank 1 SIGKILLed mid-step, ranks 0, 2, 3 dumped), with rank 1
removed from the manifest: nothing says where it ran, as when it died before registering. The
job's Indexed Job pods say: completion index 1 ran on gpu-node-002, its pod Failed, and the Job
made a new pod for it on gpu-node-011 after the incident, which is not where the rank died.
"""

from __future__ import annotations

import json
import shutil
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from conftest import write_runbooks
from denpex.ingest.layout import incident_prefix
from denpex.isolation.k8s_layout import COMPLETION_INDEX
from denpex.isolation.kubernetes import TAINT_KEY
from flow_driver import enroll_approvers, find_run, resume, saved_plan, use_page, wait_for
from testkit.services.approval_page import approval_page
from testkit.fakes.k8s_api import FakeApiServer, make_node, make_pod

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
SIGKILL = ROOT / "tests" / "fixtures" / "gloo" / "sigkill"
CLUSTER = "k8s-dead.lab"
JOB = "train-42"
DEAD_NODE = "gpu-node-002"
ALERT_TIME = datetime(2026, 11, 29, 20, 30, 22, tzinfo=UTC)  # six seconds after the dumps


@pytest.fixture
def state(prefect_harness: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The operator's state and runbooks for this process's flow runs, decided on a real approval
    page (``denpex serve-approvals``) over that state."""
    runbooks = tmp_path / "runbooks"
    write_runbooks(runbooks)
    monkeypatch.setenv("DENPEX_STATE_DIR", str(tmp_path / "state"))
    enroll_approvers(tmp_path / "state")
    monkeypatch.setenv("DENPEX_RUNBOOKS_DIR", str(runbooks))
    monkeypatch.setenv("DENPEX_EVIDENCE_ROOT", str(tmp_path / "evidence"))  # where _evidence lays incidents out
    from blocks import DenpexRunbook

    DenpexRunbook(name="hang-triage").save("default", overwrite=True)
    with approval_page(tmp_path / "state", prefect_harness, log=tmp_path / "page.log") as page:
        use_page(tmp_path / "state", page.url)
        monkeypatch.setenv("DENPEX_APPROVAL_PAGE_URL", page.url)
        yield tmp_path / "state"


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    from blocks import DenpexKubernetesTarget
    from blocks.targets import block_name_for

    made = (ALERT_TIME - timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    remade = (ALERT_TIME + timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    with FakeApiServer() as server:
        for i in range(1, 17):
            server.add_node(make_node(f"gpu-node-{i:03d}"))
        labels = {"batch.kubernetes.io/job-name": JOB}
        server.pods += [make_pod("train", f"{JOB}-{i}-x", f"gpu-node-00{i + 1}", owner="Job", created=made,
                                 phase="Failed" if i == 1 else "Running", labels={**labels, COMPLETION_INDEX: str(i)})
                        for i in range(4)]
        server.pods.append(make_pod("train", f"{JOB}-1-y", "gpu-node-011", owner="Job", created=remade,
                                    labels={**labels, COMPLETION_INDEX: "1"}))
        DenpexKubernetesTarget(cluster_name=CLUSTER, host=server.url, token=SecretStr("test-token")).save(
            block_name_for(CLUSTER), overwrite=True)
        try:
            yield server
        finally:
            DenpexKubernetesTarget.delete(block_name_for(CLUSTER))


def _evidence(tmp_path: Path, incident: str, *, xid_on: str | None) -> str:
    folder = tmp_path / "evidence" / incident_prefix("acme", CLUSTER, JOB, incident)  # the ingest layout
    shutil.copytree(SIGKILL, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    del manifest["ranks"]["1"]  # the dead rank never said where it ran
    manifest["job_id"] = JOB
    (folder / "manifest.json").write_text(json.dumps(manifest))
    if xid_on:
        (folder / "kernel.log").write_text(
            f"2026-11-29T20:30:10+0000 {xid_on} kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=17733, "
            "GPU has fallen off the bus.\n")
    return str(folder)


def _run(state: Path, incident: str, evidence: str, *, approve: bool) -> dict[str, Any]:
    from flows.triage import triage

    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = triage(tenant="acme", cluster=CLUSTER, job_id=JOB, incident_id=incident,
                                   alert_time=ALERT_TIME, evidence=evidence, world_size=4, reported_by_rank=0,
                                   alert_id=f"am-{incident}")
        except BaseException as exc:  # noqa: BLE001 (reported to the test below)
            out["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    run_id = find_run(incident)
    if wait_for(run_id, {"PAUSED", "COMPLETED", "FAILED"}) == "PAUSED":
        assert approve, "the flow asked for approval where it should have proposed nothing"
        plan = saved_plan(state, incident)
        out["plan"] = plan
        resume(run_id, {"decision": "approve", "plan_hash": plan.content_hash(),
                        "nodes": [a.node for a in plan.actions], "approver": "bob", "comment": "derived, confirmed"},
               state_dir=state)
    worker.join(timeout=240)
    if "error" in out:
        raise out["error"]
    return out


def test_the_dead_ranks_pod_places_it_and_its_nodes_own_xid_confirms_the_cordon(
        state: Path, api: FakeApiServer, tmp_path: Path) -> None:
    incident = f"k8s-{uuid.uuid4().hex[:8]}"
    out = _run(state, incident, _evidence(tmp_path, incident, xid_on=DEAD_NODE), approve=True)
    [action] = out["plan"].actions
    assert (action.node, action.action.value) == (DEAD_NODE, "cordon_taint")
    assert action.evidence[0] == f"host {DEAD_NODE} derived from the scheduler's job record, confirmed by its own signal"
    report = out["result"]
    assert report["outcome"] == "executed", report["reason"]
    assert report["approval"]["channel"] == "approval-page" and report["approval"]["approver"] == "bob"
    [candidate] = report["candidates"]
    assert (candidate["rank"], candidate["host"]) == (1, DEAD_NODE)
    assert any("derived from the scheduler's job record" in r for r in candidate["reasons"])
    assert any(f"Kubernetes job {JOB}'s pods" in n for n in report["notes"]), report["notes"]
    assert any(t["key"] == TAINT_KEY for t in api.nodes[DEAD_NODE]["spec"].get("taints", []))
    assert not api.nodes["gpu-node-011"]["spec"].get("taints")  # the pod made after the incident


def test_a_derived_host_without_its_own_signal_is_not_cordoned(
        state: Path, api: FakeApiServer, tmp_path: Path) -> None:
    incident = f"k8s-{uuid.uuid4().hex[:8]}"
    out = _run(state, incident, _evidence(tmp_path, incident, xid_on=None), approve=False)
    report = out["result"]
    assert report["plan"]["recommend_isolation"] is False
    assert any("derived from the scheduler's job record" in b for b in report["plan"]["blocked"]), report["plan"]
    assert not [r for r in api.requests if r[0] in {"PATCH", "POST", "DELETE"}]
