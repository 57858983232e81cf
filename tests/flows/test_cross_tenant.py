"""Two tenants, two clusters, one target block: the incident flow on the real Prefect engine (the
session's test harness, in this process) and the Kubernetes fake API (issue 16, findings 1, 13).

Tenant b cannot register tenant a's cluster under any spelling. An incident of tenant b naming
a's cluster finds a's target block (blocks are looked up by the cluster's name), and the flow
refuses it because the operator's registry gives the cluster to a: b's approver would approve
anything b is shown, and a's API server must receive nothing.
"""

from __future__ import annotations

import shutil
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import SecretStr

from conftest import FIXTURES, write_runbooks
from denpex.ingest.errors import RegistryError
from denpex.ingest.layout import incident_prefix
from denpex.ingest.plans import PlanTier
from denpex.ingest.registry import Registry
from denpex.isolation.plan import save_plan
from flow_driver import (ALERT_TIME, CULPRIT_NODE, enroll_approvers, find_run, manifest_with_gpus, resume, saved_plan,
                         wait_for, xid79_log)
from testkit.fakes.k8s_api import FakeApiServer, make_node

# Sized to what it starts: the harness server (shared by the session) and one in-process flow run.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

A_CLUSTER = "xt-a.prod"
B_CLUSTER = "xt-b.lab"
SCENARIO = FIXTURES / "withheld_one"


@pytest.fixture
def state(prefect_harness: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The operator's state directory and runbooks (alice approves for a, bob for b), for this process."""
    runbooks = tmp_path / "runbooks"
    write_runbooks(runbooks)
    body = yaml.safe_load((runbooks / "hang-triage.yaml").read_text())
    body["approval"]["approvers"] = []
    body["approval"]["scoped"] = [{"tenant": "a", "names": ["alice"]}, {"tenant": "b", "names": ["bob"]}]
    (runbooks / "hang-triage.yaml").write_text(yaml.safe_dump(body))
    monkeypatch.setenv("DENPEX_STATE_DIR", str(tmp_path / "state"))
    enroll_approvers(tmp_path / "state", ("alice", "bob"))
    monkeypatch.setenv("DENPEX_RUNBOOKS_DIR", str(runbooks))
    monkeypatch.setenv("DENPEX_EVIDENCE_ROOT", str(tmp_path / "evidence"))  # where _evidence lays incidents out
    from blocks import DenpexRunbook

    DenpexRunbook(name="hang-triage").save("default", overwrite=True)
    return tmp_path / "state"


@pytest.fixture
def a_cluster_api() -> Iterator[FakeApiServer]:
    """Tenant a's Kubernetes API server, with a target block that reaches it."""
    from blocks import DenpexKubernetesTarget
    from blocks.targets import block_name_for

    with FakeApiServer() as server:
        for i in range(1, 17):
            server.add_node(make_node(f"gpu-node-{i:03d}"))
        DenpexKubernetesTarget(cluster_name=A_CLUSTER, host=server.url, token=SecretStr("test-token")).save(
            block_name_for(A_CLUSTER), overwrite=True)
        try:
            yield server
        finally:
            DenpexKubernetesTarget.delete(block_name_for(A_CLUSTER))


def _evidence(tmp_path: Path, tenant: str, incident: str, cluster: str = A_CLUSTER) -> str:
    """The incident's folder as the ingest service lays it out (the flow triages no other)."""
    folder = tmp_path / "evidence" / incident_prefix(tenant, cluster, "gloo-withheld_one", incident)
    shutil.copytree(SCENARIO, folder)
    (folder / "manifest.json").write_bytes(manifest_with_gpus(SCENARIO))
    (folder / "kernel.log").write_bytes(xid79_log())
    return str(folder)


def _run_as_attacker(state: Path, **parameters: Any) -> dict[str, Any]:
    """Run the flow in a thread; if it pauses for approval, tenant b's approver approves everything."""
    from flows.triage import triage

    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = triage(**parameters)
        except BaseException as exc:  # noqa: BLE001 (reported to the test below)
            out["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    run_id = find_run(parameters["incident_id"])
    if wait_for(run_id, {"PAUSED", "COMPLETED", "FAILED"}) == "PAUSED":
        plan = saved_plan(state, parameters["incident_id"])
        resume(run_id, {"decision": "approve", "plan_hash": plan.content_hash(),
                        "nodes": [a.node for a in plan.actions], "approver": "bob", "comment": "mine"},
               state_dir=state)
    worker.join(timeout=240)
    if "error" in out:
        raise out["error"]
    result: dict[str, Any] = out["result"]
    return result


def _two_tenants(state: Path) -> Registry:
    registry = Registry(state)
    registry.add_tenant("a", PlanTier.DATA_CENTER)
    registry.add_tenant("b", PlanTier.DATA_CENTER)
    registry.create_key("a", A_CLUSTER)
    registry.create_key("b", B_CLUSTER)
    return registry


@pytest.mark.parametrize("spelling", [A_CLUSTER, "XT_A.Prod", "xt-a-prod"])
def test_tenant_b_cannot_register_tenant_a_cluster(tmp_path: Path, spelling: str) -> None:
    registry = _two_tenants(tmp_path / "state")
    with pytest.raises(RegistryError, match="registered to tenant 'a'"):
        registry.create_key("b", spelling)
    with pytest.raises(RegistryError, match="registered to tenant 'a'"):
        registry.create_token("b", spelling)


def test_tenant_b_cannot_drain_tenant_a_cluster_through_a_target(state: Path, a_cluster_api: FakeApiServer,
                                                                 tmp_path: Path) -> None:
    _two_tenants(state)
    incident = f"xt-{uuid.uuid4().hex[:8]}"
    result = _run_as_attacker(state, tenant="b", cluster=A_CLUSTER, job_id="gloo-withheld_one", incident_id=incident,
                              alert_time=ALERT_TIME, evidence=_evidence(tmp_path, "b", incident), world_size=4,
                              reported_by_rank=0,
                              alert_id=f"am-{incident}")

    assert not [r for r in a_cluster_api.requests if r[0] in {"PATCH", "POST", "DELETE"}], a_cluster_api.requests
    assert not a_cluster_api.nodes[CULPRIT_NODE]["spec"].get("taints")
    assert result["outcome"] == "refused"
    assert result["reason"] == (f"cluster {A_CLUSTER!r} belongs to tenant 'a' in the operator's registry, not to "
                                "the incident's tenant 'b'")
    assert not list((state / "plans").glob(f"**/{incident}.json"))  # nothing was put up for approval


def test_a_target_block_carrying_its_token_is_refused_where_the_worker_keeps_its_own(
        state: Path, a_cluster_api: FakeApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 30, the red team: Prefect gave the target block's credential to a client holding the
    API's auth string, which then acted on the cluster without Denpex. Where the worker keeps
    credentials of its own (DENPEX_CLUSTER_SECRETS), a block still carrying one is refused before
    anything connects; the run still triages and says why."""
    from blocks.targets import block_name_for
    from denpex.ingest.database import Database
    from denpex.ingest.incidents import IncidentBook, IncidentKey

    _two_tenants(state)
    secrets = tmp_path / "secrets"
    secrets.mkdir(mode=0o700)
    token = secrets / f"{block_name_for(A_CLUSTER)}.kube-token"
    token.write_text("the-workers-own")
    token.chmod(0o600)
    monkeypatch.setenv("DENPEX_CLUSTER_SECRETS", str(secrets))
    incident = f"xt-{uuid.uuid4().hex[:8]}"
    IncidentBook(Database(state)).claim_run(IncidentKey("a", A_CLUSTER, incident), "gloo-withheld_one", world_size=4,
                                            alert_time=ALERT_TIME.isoformat(), reported_by_rank=0)
    result = _run_as_attacker(state, tenant="a", cluster=A_CLUSTER, job_id="gloo-withheld_one", incident_id=incident,
                              alert_time=ALERT_TIME, evidence=_evidence(tmp_path, "a", incident), world_size=4,
                              reported_by_rank=0, alert_id=f"am-{incident}")
    assert result["verdict"] == "localized" and result["outcome"] == "refused", result["reason"]
    assert "carries its API token, which Prefect gives to any API client" in result["reason"]
    assert not a_cluster_api.requests, a_cluster_api.requests  # nothing connected
    assert not list((state / "plans").glob(f"**/{incident}.json"))


def test_a_run_cannot_triage_another_tenants_uploads_as_its_own_incident(state: Path, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Tenant b's upload (its own cluster, its own job) shown to tenant a's approver as a's incident:
    the run fails on its parameters before it reads a byte; with no ingest store set, no run reads."""
    from flows.triage import triage

    _two_tenants(state)
    incident = f"xt-{uuid.uuid4().hex[:8]}"
    theirs = _evidence(tmp_path, "b", incident, cluster=B_CLUSTER)
    for roots in (str(tmp_path / "evidence"), ""):  # bound to the store, and with no store set at all
        monkeypatch.setenv("DENPEX_EVIDENCE_ROOT", roots)
        why = f"evidence '{theirs}' is not incident {incident}'s folder" if roots else "DENPEX_EVIDENCE_ROOT is not set"
        with pytest.raises(ValueError, match=why):
            triage(tenant="a", cluster=A_CLUSTER, job_id="gloo-withheld_one", incident_id=incident,
                   alert_time=ALERT_TIME, evidence=theirs, world_size=4, alert_id=f"am-{incident}")
    assert not (state / "plans").exists() and not (state / "reports").exists()


def _a_plan(incident: str, cluster: str = A_CLUSTER, tenant: str | None = None) -> Any:
    """A real plan (Kubernetes, one node) for ``incident`` on ``cluster``."""
    from denpex.isolation.plan import utc_now
    from denpex.isolation.planner import plan_isolation
    from denpex.isolation.policy import IsolationPolicy, Scheduler
    from isolation.triage_cases import killed_process

    now = utc_now()
    return plan_isolation(killed_process(as_of=now), None, IsolationPolicy(), None, Scheduler.KUBERNETES, incident,
                          now, cluster=cluster, tenant=tenant)


def _planted_plan(path: Path) -> None:
    """A real plan where a climbing incident id leads, outside the state directory."""
    save_plan(_a_plan("x"), path)


def test_a_run_whose_parameters_climb_out_of_the_state_directory_does_nothing(state: Path, tmp_path: Path) -> None:
    from flows.return_to_service import return_to_service
    from flows.triage import triage

    (state / "plans").mkdir(parents=True)  # as the triage flow leaves it
    _planted_plan(tmp_path / "x.json")  # state/plans/../../x.json
    # FlowParameterError, a ValueError: the run fails before reading or writing anything.
    with pytest.raises(ValueError, match=r"incident_id '\.\./\.\./x' must match"):
        return_to_service(cluster=A_CLUSTER, incident_id="../../x")
    with pytest.raises(ValueError, match=r"incident_id '\.\./\.\./x' must match.*evidence '/a/\.\./b' climbs"):
        triage(tenant="b", cluster=A_CLUSTER, job_id="j", incident_id="../../x", alert_time=ALERT_TIME,
               evidence="/a/../b")
    assert not list(tmp_path.glob("x-*.json"))  # no report beside it (state/reports/../../x-RUN.json)
    # The run's name is made of the untrusted parameters, bounded and sanitized.
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            name=FlowRunFilterName(any_=[f"{A_CLUSTER}/.._.._x"])))
    assert runs and all(r.state is not None and r.state.is_failed() for r in runs)


def test_the_alerts_facts_come_from_the_ingest_services_record(state: Path, tmp_path: Path) -> None:
    """Issue 30 section 3: ``alert_time``, ``world_size`` and ``job_id`` were the API caller's. A run
    started with a later alert time (every rank stale), a smaller world (a rank never missed) or
    another job triages the incident as the ingest service recorded it, or does nothing."""
    from datetime import timedelta

    from denpex.ingest.database import Database
    from denpex.ingest.incidents import IncidentBook, IncidentKey
    from denpex.workflow.flow_parameters import FlowParameterError
    from flows.triage import triage

    _two_tenants(state)
    incident = f"xt-{uuid.uuid4().hex[:8]}"
    IncidentBook(Database(state)).claim_run(IncidentKey("a", A_CLUSTER, incident), "gloo-withheld_one", world_size=4,
                                            alert_time=ALERT_TIME.isoformat(), reported_by_rank=0)
    evidence = _evidence(tmp_path, "a", incident)
    # No target block for the cluster: triage and report only.
    result = triage(tenant="a", cluster=A_CLUSTER, job_id="gloo-withheld_one", incident_id=incident,
                    alert_time=ALERT_TIME + timedelta(hours=3), evidence=evidence, world_size=3,
                    alert_id=f"am-{incident}")
    assert (result["world_size"], result["as_of"]) == (4, "2026-11-29T20:29:50Z")
    assert result["verdict"] == "localized" and [c["rank"] for c in result["candidates"]] == [2]
    # Another job's folder of the same incident id, and an incident the service never heard of.
    for job, other in (("someone-elses-job", incident), ("gloo-withheld_one", "xt-never-heard-of")):
        folder = tmp_path / "evidence" / incident_prefix("a", A_CLUSTER, job, other)
        if not folder.exists():
            shutil.copytree(evidence, folder)
        why = "belongs to job 'gloo-withheld_one'" if other == incident else "the ingest service has no incident"
        with pytest.raises(FlowParameterError, match=why):
            triage(tenant="a", cluster=A_CLUSTER, job_id=job, incident_id=other, alert_time=ALERT_TIME,
                   evidence=str(folder), world_size=4, alert_id=f"am-{other}")


def test_plans_are_kept_per_tenant_cluster_and_incident(state: Path) -> None:
    """Issue 30 section 3: tenant b opened an incident with the same id on its own cluster,
    overwrote ``plans/<incident>.json``, and broke tenant a's return to service. Plans are kept per
    tenant, cluster and incident; the follow-up flows take the tenant from the cluster's registered
    owner; a plan saved before the change is read only when it is this cluster's and owner's."""
    from denpex.isolation.errors import PlanError
    from denpex.state_paths import legacy_plan_file, plan_file
    from denpex.workflow.saved_plans import load_saved_plan
    from flows.return_to_service import return_to_service
    from flows.triage import _save_plan

    _two_tenants(state)
    theirs, ours = _a_plan("inc-same", B_CLUSTER, "b"), _a_plan("inc-same", A_CLUSTER, "a")
    _save_plan(ours)
    _save_plan(theirs)  # b's incident of the same id, saved after a's
    assert load_saved_plan(state, "a", A_CLUSTER, "inc-same") == ours
    assert load_saved_plan(state, "b", B_CLUSTER, "inc-same") == theirs
    # Return to service finds a's plan by the registry's owner of a's cluster: with no plan of a's
    # for an incident only b has, it refuses before it pauses, whatever b saved.
    _save_plan(_a_plan("inc-only-b", B_CLUSTER, "b"))
    with pytest.raises(PlanError, match="no plan is saved for incident inc-only-b of tenant a on cluster 'xt-a.prod'"):
        return_to_service(cluster=A_CLUSTER, incident_id="inc-only-b")
    # plans/<incident>.json from before: used for its own cluster and owner (and copied to the keyed
    # place), refused for anyone else's.
    save_plan(_a_plan("inc-old", A_CLUSTER, "a"), legacy_plan_file(state, "inc-old"))
    assert load_saved_plan(state, "a", A_CLUSTER, "inc-old").cluster == A_CLUSTER
    assert plan_file(state, "a", A_CLUSTER, "inc-old").exists()
    save_plan(_a_plan("inc-overwritten", B_CLUSTER, "b"), legacy_plan_file(state, "inc-overwritten"))
    with pytest.raises(PlanError, match="is a plan for tenant b on cluster 'xt-b.lab', not for a on 'xt-a.prod'"):
        load_saved_plan(state, "a", A_CLUSTER, "inc-overwritten")
