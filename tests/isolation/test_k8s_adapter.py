"""Kubernetes isolation through the official client against a loopback fake API server."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from denpex.isolation.approval import Approval
from denpex.isolation.audit import AuditLog, Outcome, verify_audit_log
from denpex.isolation.config import KubernetesSettings
from denpex.isolation.errors import RemoteAuthError
from denpex.isolation.run import ExecutionReport, NodeDecision, RunMode
from denpex.isolation.run import execute as execute_plan
from denpex.isolation.kubernetes import (
    ANNOTATION_AT,
    ANNOTATION_BY,
    ANNOTATION_INCIDENT,
    ANNOTATION_REASON,
    TAINT_KEY,
    KubernetesAdapter,
)
from denpex.isolation.plan import Gate, IsolationPlan, Operation, utc_now
from denpex.isolation.planner import plan_isolation
from denpex.isolation.policy import (
    ActionKind,
    EvictionRule,
    IsolationPolicy,
    RemediationSteps,
    SafetyLimits,
    SchedulerSteps,
    Scheduler,
)
from denpex.isolation.ssh import Backoff
from isolation.triage_cases import killed_process, signal
from isolation.trust import APPROVERS_FILE, key_file, operator_for, signed
from testkit.fakes.k8s_api import FakeApiServer, make_node, make_pdb, make_pod

NODE = "gpu-node-002"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
OUR_TAINT = {"key": TAINT_KEY, "value": "inc-k8s", "effect": "NoSchedule"}
EVICTING = IsolationPolicy(remediation=RemediationSteps(kubernetes=SchedulerSteps(
    check=RemediationSteps().kubernetes.check, act=ActionKind.CORDON_TAINT_EVICT,
    verify=RemediationSteps().kubernetes.verify, rollback=RemediationSteps().kubernetes.rollback)))


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        for i in range(1, 17):
            server.add_node(make_node(f"gpu-node-{i:03d}", labels={"denpex.io/partition": "a100"},
                                      taints=[dict(GPU_TAINT)]))
        server.pods += [
            make_pod("train", "trainer-1", NODE, labels={"app": "trainer"}),
            make_pod("kube-system", "dcgm-exporter-x", NODE, daemonset=True),
        ]
        yield server


def settings(api: FakeApiServer, token: str = "test-token") -> KubernetesSettings:
    return KubernetesSettings(host=api.url, token=token, request_timeout_s=5, eviction_timeout_s=1.0,
                              backoff=Backoff(attempts=4, initial_s=0.02, max_s=0.05))


@pytest.fixture
def adapter(api: FakeApiServer) -> Iterator[KubernetesAdapter]:
    with KubernetesAdapter.connect(settings(api), opt_out_label="denpex.io/opt-out") as connected:
        yield connected


CLUSTER = "k8s-test"
"""A bare host and token cannot say the cluster's name; the operator's settings give it."""


class K8sRun:
    """One test's operator (state in its own folder) running plans through ``denpex.isolation.run.execute``."""

    def __init__(self, adapter: KubernetesAdapter, state_dir: Path) -> None:
        self.adapter = adapter
        self.state_dir = state_dir
        self.audit = AuditLog(state_dir / "audit.jsonl")

    def run(self, plan: IsolationPlan, *, mode: RunMode = RunMode.DRY_RUN, operation: Operation = Operation.ISOLATE,
            approval: Approval | None = None, policy: IsolationPolicy | None = None) -> ExecutionReport:
        if approval is None and mode is RunMode.EXECUTE:
            approval = signed(plan, operation=operation)
        operator = operator_for(self.state_dir, policy or plan.policy, cluster=None if self.adapter.cluster_name() else CLUSTER,
                                verify_timeout_s=2, poll_s=0.05)
        return execute_plan(plan, approval, operator=operator, adapter=self.adapter, mode=mode,
                            operation=operation)


@pytest.fixture
def executor(adapter: KubernetesAdapter, tmp_path: Path) -> K8sRun:
    return K8sRun(adapter, tmp_path / "state")


def make_plan(adapter: KubernetesAdapter | None, *, policy: IsolationPolicy = IsolationPolicy(),
              node: str = NODE, incident_id: str = "inc-k8s", cluster: str | None = None) -> IsolationPlan:
    now = utc_now()
    result = killed_process(hardware=[signal(79, host=node, age=timedelta(minutes=1), as_of=now)], host=node, as_of=now)
    facts = adapter.cluster_facts() if adapter else None
    where = cluster or (adapter.cluster_name() if adapter else None) or CLUSTER
    return plan_isolation(result, None, policy, facts, Scheduler.KUBERNETES, incident_id, now, cluster=where)


def execute(executor: K8sRun, plan: IsolationPlan, operation: Operation = Operation.ISOLATE) -> ExecutionReport:
    return executor.run(plan, mode=RunMode.EXECUTE, operation=operation)


def test_cordon_taint_annotate_then_uncordon(api: FakeApiServer, adapter: KubernetesAdapter,
                                             executor: K8sRun) -> None:
    plan = make_plan(adapter)
    assert plan.contract_view()["actions"] == [{"node": NODE, "action": "cordon_taint"}]
    assert plan.actions[0].running_jobs == ("train/trainer-1", "kube-system/dcgm-exporter-x")

    report = execute(executor, plan)
    [outcome] = report.nodes
    assert outcome.outcome is Outcome.APPLIED and outcome.state_after == "Ready,SchedulingDisabled"
    node = api.nodes[NODE]
    assert node["spec"]["unschedulable"] is True
    assert node["spec"]["taints"] == [GPU_TAINT, OUR_TAINT]  # someone else's taint is kept
    annotations = node["metadata"]["annotations"]
    assert annotations[ANNOTATION_REASON] == plan.actions[0].reason
    assert annotations[ANNOTATION_INCIDENT] == "inc-k8s" and annotations[ANNOTATION_BY] == "denpex"
    assert annotations[ANNOTATION_AT].endswith("Z")
    assert api.patches(NODE) == ["application/strategic-merge-patch+json"]
    assert [p["metadata"]["name"] for p in api.pods] == ["trainer-1", "dcgm-exporter-x"]  # no eviction asked

    again = execute(executor, plan)
    assert again.nodes[0].decision is NodeDecision.ALREADY_DONE and len(api.patches(NODE)) == 1

    back = execute(executor, plan, Operation.ROLLBACK)
    assert back.nodes[0].outcome is Outcome.APPLIED
    node = api.nodes[NODE]
    assert node["spec"]["unschedulable"] is False and node["spec"]["taints"] == [GPU_TAINT]
    assert not any(k.startswith("denpex.io/") for k in node["metadata"]["annotations"])
    assert api.patches(NODE)[-1] == "application/json-patch+json"
    assert verify_audit_log(executor.audit.path).ok


def test_eviction_honours_pod_disruption_budgets(api: FakeApiServer, adapter: KubernetesAdapter,
                                                 executor: K8sRun) -> None:
    api.pods += [make_pod("train", "loader-1", NODE, labels={"app": "loader"}),
                 make_pod("serve", "cache-1", NODE, labels={"app": "cache"})]
    api.pdbs += [make_pdb("train", "trainer", {"app": "trainer"}, 0),   # never allows: kept
                 make_pdb("serve", "cache", {"app": "cache"}, 0)]       # allows after a while: retried
    api.pdb_refusals["cache"] = 2

    plan = make_plan(adapter, policy=EVICTING)
    report = execute(executor, plan)
    [outcome] = report.nodes
    # The node is cordoned, but a pod the plan means to evict is still there: not done.
    assert outcome.outcome is Outcome.FAILED
    assert "evicted train/loader-1, serve/cache-1" in outcome.output
    assert "PodDisruptionBudget kept train/trainer-1" in outcome.output
    assert "1 evictable pod(s) remain on gpu-node-002: train/trainer-1" in outcome.message
    remaining = sorted(f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in api.pods)
    assert remaining == ["kube-system/dcgm-exporter-x", "train/trainer-1"]  # DaemonSet pods are left
    cache_posts = [path for method, path, _ in api.requests if method == "POST" and "cache-1" in path]
    assert len(cache_posts) == 3  # 429, 429, retried with backoff, then evicted

    # The budget allows it later; the re-run evicts what is left instead of saying "already done".
    api.pdbs[0]["status"]["disruptionsAllowed"] = 1
    again = execute(executor, plan)
    assert again.nodes[0].decision is NodeDecision.ACT and again.nodes[0].outcome is Outcome.APPLIED
    assert [p["metadata"]["name"] for p in api.pods] == ["dcgm-exporter-x"]


def test_a_drain_settles_each_pod_follows_kubectl_rules_and_post_checks(
    api: FakeApiServer, adapter: KubernetesAdapter, executor: K8sRun
) -> None:
    """Issue 8 item 4: one failed eviction does not stop the rest nor count the node as done."""
    api.pods += [make_pod("train", "flaky-1", NODE, labels={"app": "flaky"}),
                 make_pod("train", "after-1", NODE, labels={"app": "after"}),
                 make_pod("adhoc", "bare-1", NODE, owner=None),            # nothing recreates it
                 make_pod("train", "scratch-1", NODE, empty_dir=True),     # eviction deletes its data
                 make_pod("kube-system", "static-1", NODE, mirror=True)]   # the kubelet's
    api.fail_evictions["flaky-1"] = 1
    plan = make_plan(adapter, policy=EVICTING)
    first = execute(executor, plan)
    [outcome] = first.nodes
    assert outcome.outcome is Outcome.FAILED
    assert "evicted train/trainer-1, train/after-1" in outcome.output  # the loop went on after the 500
    assert "eviction failed for train/flaky-1" in outcome.output
    assert "adhoc/bare-1 (not managed by a controller" in outcome.output
    assert "train/scratch-1 (has emptyDir data" in outcome.output
    assert "evictable pod(s) remain on gpu-node-002: train/flaky-1" in outcome.message
    names = sorted(p["metadata"]["name"] for p in api.pods)
    assert names == ["bare-1", "dcgm-exporter-x", "flaky-1", "scratch-1", "static-1"]

    again = execute(executor, plan)
    assert again.nodes[0].decision is NodeDecision.ACT and again.nodes[0].outcome is Outcome.APPLIED
    assert sorted(p["metadata"]["name"] for p in api.pods) == ["bare-1", "dcgm-exporter-x", "scratch-1", "static-1"]
    done = execute(executor, plan)
    assert done.nodes[0].decision is NodeDecision.ALREADY_DONE


def test_the_runbook_may_allow_what_kubectl_drain_needs_flags_for(
    api: FakeApiServer, tmp_path: Path
) -> None:
    allowing = EVICTING.model_copy(update={"remediation": EVICTING.remediation.model_copy(
        update={"eviction": EvictionRule(evict_unmanaged=True, delete_emptydir_data=True)})})
    api.pods += [make_pod("adhoc", "bare-1", NODE, owner=None), make_pod("train", "scratch-1", NODE, empty_dir=True)]
    with KubernetesAdapter.connect(settings(api), opt_out_label="denpex.io/opt-out",
                                   eviction=allowing.remediation.eviction) as adapter:
        report = K8sRun(adapter, tmp_path).run(make_plan(adapter, policy=allowing), mode=RunMode.EXECUTE)
    assert report.nodes[0].outcome is Outcome.APPLIED
    assert [p["metadata"]["name"] for p in api.pods] == ["dcgm-exporter-x"]


def test_foreign_cordon_and_opt_out_label_are_left_alone(api: FakeApiServer, adapter: KubernetesAdapter,
                                                         executor: K8sRun) -> None:
    offline = make_plan(None)
    api.nodes[NODE]["spec"]["unschedulable"] = True  # `kubectl cordon` by a person: no annotation
    planned = make_plan(adapter)
    assert planned.actions == () and planned.blocked[0].gate is Gate.FOREIGN_REASON
    assert execute(executor, offline).nodes[0].decision is NodeDecision.BLOCKED
    assert execute(executor, offline, Operation.ROLLBACK).nodes[0].decision is NodeDecision.BLOCKED
    assert api.nodes[NODE]["spec"]["unschedulable"] is True and api.patches(NODE) == []

    other = "gpu-node-005"
    api.nodes[other]["metadata"]["labels"]["denpex.io/opt-out"] = "true"
    assert make_plan(adapter, node=other).blocked[0].gate is Gate.OPT_OUT


def test_manual_uncordon_cancels_the_automated_isolation(api: FakeApiServer, adapter: KubernetesAdapter,
                                                         executor: K8sRun) -> None:
    plan = make_plan(adapter)
    assert execute(executor, plan).nodes[0].outcome is Outcome.APPLIED
    api.nodes[NODE]["spec"]["unschedulable"] = False  # a person uncordons, annotations stay
    again = execute(executor, plan)
    assert again.nodes[0].decision is NodeDecision.BLOCKED
    assert "manual uncordon cancels" in again.nodes[0].message
    assert api.nodes[NODE]["spec"]["unschedulable"] is False


def test_rollback_after_a_manual_uncordon_removes_our_marks_so_the_node_can_be_isolated_again(
    api: FakeApiServer, adapter: KubernetesAdapter, executor: K8sRun
) -> None:
    """Issue 8 item 5: the person's uncordon is not the whole undo; our taint must go too."""
    plan = make_plan(adapter)
    assert execute(executor, plan).nodes[0].outcome is Outcome.APPLIED
    other_incident = {"key": TAINT_KEY, "value": "inc-other", "effect": "NoSchedule"}
    api.nodes[NODE]["spec"]["taints"].append(other_incident)
    api.nodes[NODE]["spec"]["unschedulable"] = False  # a person uncordons; taint and annotations stay

    back = execute(executor, plan, Operation.ROLLBACK)
    [outcome] = back.nodes
    assert outcome.decision is NodeDecision.ACT and outcome.outcome is Outcome.APPLIED
    node = api.nodes[NODE]
    assert node["spec"]["taints"] == [GPU_TAINT, other_incident]  # another incident's taint stays
    assert not any(k.startswith("denpex.io/") for k in node["metadata"]["annotations"])
    again = execute(executor, make_plan(adapter, incident_id="inc-k8s-2"))
    assert again.nodes[0].outcome is Outcome.APPLIED, again.nodes[0].message


def test_ambiguous_server_error_is_resolved_by_reading_not_by_repeating(
    api: FakeApiServer, adapter: KubernetesAdapter, executor: K8sRun
) -> None:
    api.fail_next_patches = 1  # the PATCH is applied, then answered with 500
    report = execute(executor, make_plan(adapter))
    [outcome] = report.nodes
    assert outcome.outcome is Outcome.APPLIED and "not sent again" in outcome.message
    assert len(api.patches(NODE)) == 1


def test_a_lost_cordon_answer_still_evicts(api: FakeApiServer, adapter: KubernetesAdapter,
                                          executor: K8sRun) -> None:
    api.fail_next_patches = 1  # the cordon PATCH is applied, then answered with 500
    report = execute(executor, make_plan(adapter, policy=EVICTING))
    [outcome] = report.nodes
    assert outcome.outcome is Outcome.APPLIED
    assert "answer to the cordon was lost" in outcome.output and "evicted train/trainer-1" in outcome.output
    assert len(api.patches(NODE)) == 1  # the cordon was not sent twice
    assert [p["metadata"]["name"] for p in api.pods] == ["dcgm-exporter-x"]


def test_concurrent_change_is_reread_not_overwritten(api: FakeApiServer, adapter: KubernetesAdapter,
                                                     executor: K8sRun) -> None:
    racing = {"key": "maintenance", "value": "bios", "effect": "NoSchedule"}
    api.concurrent_writes.append(racing)
    report = execute(executor, make_plan(adapter))
    assert report.nodes[0].outcome is Outcome.APPLIED
    assert len(api.patches(NODE)) == 2  # 409 Conflict, re-read, patched again
    assert api.nodes[NODE]["spec"]["taints"] == [GPU_TAINT, racing, OUR_TAINT]


def test_wrong_token_is_refused_and_nothing_changes(api: FakeApiServer) -> None:
    with KubernetesAdapter.connect(settings(api, token="stolen"), opt_out_label="denpex.io/opt-out") as bad:
        with pytest.raises(RemoteAuthError, match="refused our credentials"):
            bad.cluster_facts()
    assert all(method == "GET" for method, _, _ in api.requests)


def test_the_longest_incident_id_is_a_taint_value_the_api_server_accepts(
    api: FakeApiServer, adapter: KubernetesAdapter, executor: K8sRun
) -> None:
    # The fake refuses taint values that are not label values (422), as the API server does.
    incident = "job.7_" + "x" * 56 + "9"
    assert len(incident) == 63
    report = execute(executor, make_plan(adapter, incident_id=incident))
    assert report.nodes[0].outcome is Outcome.APPLIED, report.nodes[0].message
    assert {"key": TAINT_KEY, "value": incident, "effect": "NoSchedule"} in api.nodes[NODE]["spec"]["taints"]
    assert api.nodes[NODE]["metadata"]["annotations"][ANNOTATION_INCIDENT] == incident


def test_unknown_node_and_dry_run(api: FakeApiServer, adapter: KubernetesAdapter, executor: K8sRun) -> None:
    assert not adapter.node_facts("gpu-node-999").exists
    assert make_plan(adapter, node="gpu-node-999").blocked[0].gate is Gate.UNKNOWN_NODE
    dry = executor.run(make_plan(adapter), mode=RunMode.DRY_RUN)
    assert dry.nodes[0].decision is NodeDecision.ACT and "strategic-merge" in dry.nodes[0].command
    assert api.patches(NODE) == [] and not executor.audit.path.exists()
    assert not (executor.state_dir / "audit.key").exists()  # a dry run writes nothing at all


def test_cli_isolates_on_kubernetes_from_environment_settings(api: FakeApiServer, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from denpex.cli import app
    from denpex.isolation.plan import save_plan

    plan_path = tmp_path / "plan.json"
    save_plan(make_plan(None), plan_path)
    env = {"DENPEX_KUBE_HOST": api.url, "DENPEX_KUBE_TOKEN": "test-token",
           "DENPEX_STATE_DIR": str(tmp_path / "state"), "DENPEX_TRUSTED_APPROVERS": str(APPROVERS_FILE),
           "DENPEX_CLUSTER": CLUSTER, "DENPEX_EVIDENCE_STORE": str(tmp_path / "store")}
    runner = CliRunner()
    assert runner.invoke(app, ["approve", str(plan_path), "--approver", "alice", "--key", key_file("alice")]).exit_code == 0
    result = runner.invoke(app, ["isolate", str(plan_path), "--execute"], env=env)
    assert result.exit_code == 0, result.output
    assert "cordon_taint" not in result.stderr and "-> applied" in result.stdout
    assert api.nodes[NODE]["spec"]["unschedulable"] is True
    assert (tmp_path / "store" / "audit" / "inc-k8s" / "audit.jsonl").exists()
    refused = runner.invoke(app, ["isolate", str(plan_path), "--dry-run"], env={**env, "DENPEX_KUBE_TOKEN": "x"})
    assert refused.exit_code == 3 and "refused our credentials" in refused.stderr


def test_the_hung_jobs_pods_on_the_isolated_node_are_deleted_as_their_own_action(
    api: FakeApiServer, adapter: KubernetesAdapter, executor: K8sRun
) -> None:
    """Issue 8 item 9 on Kubernetes: the job's pods on the cordoned node are deleted (their controller
    reschedules them), approved, audited and verified on their own."""
    api.pods += [make_pod("train", "job-7-worker-1", NODE, labels={"batch.kubernetes.io/job-name": "job-7"}),
                 make_pod("train", "job-7-worker-2", "gpu-node-003", labels={"batch.kubernetes.io/job-name": "job-7"})]
    now = utc_now()
    result = killed_process(hardware=[signal(79, host=NODE, age=timedelta(minutes=1), as_of=now)], host=NODE, as_of=now)
    plan = plan_isolation(result, None, IsolationPolicy(), adapter.cluster_facts(), Scheduler.KUBERNETES, "inc-k8s",
                          now, cluster=CLUSTER, job_id="job-7")
    assert plan.hung_job is not None and "keep running on the cordoned node" in plan.hung_job.message
    assert execute(executor, plan).nodes[0].outcome is Outcome.APPLIED
    assert any(p["metadata"]["name"] == "job-7-worker-1" for p in api.pods)  # cordon keeps running pods

    report = execute(executor, plan, Operation.REQUEUE)
    [outcome] = report.nodes
    assert outcome.outcome is Outcome.APPLIED and "deleted train/job-7-worker-1" in outcome.output
    names = sorted(p["metadata"]["name"] for p in api.pods)
    assert names == ["dcgm-exporter-x", "job-7-worker-2", "trainer-1"]  # only the job's pod on that node
    records = [r for r in executor.audit.records() if r.operation is Operation.REQUEUE]
    assert [r.kind.value for r in records] == ["intent", "result"]
    assert execute(executor, plan, Operation.REQUEUE).nodes[0].decision is NodeDecision.ALREADY_DONE


def test_a_drain_is_done_only_once_its_evicted_pods_are_gone(api: FakeApiServer, adapter: KubernetesAdapter,
                                                             executor: K8sRun) -> None:
    """kubectl drain waits for the evicted pods to terminate; so does the post-check, within the
    operator's verify timeout (2 s here)."""
    api.pods += [make_pod("train", "slow-1", NODE, labels={"app": "slow"}),
                 make_pod("train", "stuck-1", "gpu-node-003", labels={"app": "stuck"})]
    api.termination_grace_s.update({"trainer-1": 0.5, "slow-1": 0.8, "stuck-1": 30})
    roomy = EVICTING.model_copy(update={"limits": SafetyLimits(max_isolated_fraction=0.5)})
    plan = make_plan(adapter, policy=roomy)
    [outcome] = execute(executor, plan).nodes
    assert outcome.outcome is Outcome.APPLIED, outcome.message
    assert [p["metadata"]["name"] for p in api.pods if p["spec"]["nodeName"] == NODE] == ["dcgm-exporter-x"]

    stuck = make_plan(adapter, policy=roomy, node="gpu-node-003", incident_id="inc-k8s-2")
    [outcome] = execute(executor, stuck).nodes
    assert outcome.outcome is Outcome.FAILED
    assert "1 pod(s) still terminating on gpu-node-003: train/stuck-1" in outcome.message


def test_the_hourly_rate_limit_counts_every_isolation_sent_not_only_verified_ones(
    api: FakeApiServer, adapter: KubernetesAdapter, executor: K8sRun
) -> None:
    """A cordon whose evictions a PodDisruptionBudget holds up fails its post-check, yet the node is
    cordoned: it is an isolation, and a storm of such incidents must hit the per-cluster limit."""
    api.pdbs.append(make_pdb("train", "trainer", {"app": "trainer"}, 0))
    hourly = EVICTING.model_copy(update={"limits": SafetyLimits(max_isolated_fraction=0.5,
                                                                max_isolations_per_cluster_per_hour=1)})
    first = make_plan(adapter, policy=hourly)
    [outcome] = execute(executor, first).nodes
    assert outcome.outcome is Outcome.FAILED and api.nodes[NODE]["spec"]["unschedulable"] is True

    storm = make_plan(adapter, policy=hourly, node="gpu-node-003", incident_id="inc-k8s-2")
    report = execute(executor, storm)
    assert report.nodes[0].decision is NodeDecision.BLOCKED and report.breaker_tripped
    assert "1 isolation(s) on this cluster in the last hour plus 1 now" in report.blocked[0]
    assert not api.nodes["gpu-node-003"]["spec"].get("unschedulable")

    # Finishing the first incident's own drain is not a new isolation: not blocked, not counted twice.
    breaker = operator_for(executor.state_dir).breaker()
    breaker.reset(by="oncall", at=utc_now())
    api.pdbs[0]["status"]["disruptionsAllowed"] = 1
    [again] = execute(executor, first).nodes
    assert again.decision is NodeDecision.ACT and again.outcome is Outcome.APPLIED
    assert [(m.node, m.incident_id) for m in breaker.state().isolations] == [(NODE, "inc-k8s")]


def test_a_rollback_plan_whose_reasons_are_not_this_incidents_is_refused(
    api: FakeApiServer, adapter: KubernetesAdapter, executor: K8sRun
) -> None:
    """Rollbacks act on a reason's incident tag (taint value, annotations): a plan edited to name
    another incident there would clear the cordon yet leave this incident's taint behind."""
    from denpex.isolation.errors import PolicyMismatchError

    plan = make_plan(adapter)
    assert execute(executor, plan).nodes[0].outcome is Outcome.APPLIED
    [action] = plan.actions
    edited = plan.model_copy(update={"actions": (action.model_copy(
        update={"reason": action.reason.replace("denpex:inc-k8s", "denpex:inc-k8s-other")}),)})
    with pytest.raises(PolicyMismatchError, match="reason does not start with 'denpex:inc-k8s'"):
        execute(executor, edited, Operation.ROLLBACK)
    assert api.nodes[NODE]["spec"]["unschedulable"] is True and OUR_TAINT in api.nodes[NODE]["spec"]["taints"]


def test_a_hung_job_name_shared_by_two_namespaces_deletes_nothing(api: FakeApiServer, adapter: KubernetesAdapter,
                                                                  executor: K8sRun) -> None:
    """Job names are per namespace: another tenant's job of the same name on that node is not ours
    to restart. Denpex does not guess; it deletes nothing and says why."""
    from denpex.isolation.errors import CommandFailedError

    label = {"batch.kubernetes.io/job-name": "job-7"}
    api.pods += [make_pod("team-a", "job-7-worker-1", NODE, labels=label),
                 make_pod("team-b", "job-7-worker-1", NODE, labels=label)]
    now = utc_now()
    result = killed_process(hardware=[signal(79, host=NODE, age=timedelta(minutes=1), as_of=now)], host=NODE, as_of=now)
    plan = plan_isolation(result, None, IsolationPolicy(), adapter.cluster_facts(), Scheduler.KUBERNETES, "inc-k8s",
                          now, cluster=CLUSTER, job_id="job-7")
    assert execute(executor, plan).nodes[0].outcome is Outcome.APPLIED
    with pytest.raises(CommandFailedError, match="in more than one namespace .team-a, team-b."):
        execute(executor, plan, Operation.REQUEUE)
    assert sorted(p["metadata"]["namespace"] for p in api.pods if p["metadata"]["name"] == "job-7-worker-1") \
        == ["team-a", "team-b"]
    assert not [r for r in executor.audit.records() if r.operation is Operation.REQUEUE]
