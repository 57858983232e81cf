"""A cluster belongs to one tenant (the ingest registry in the state directory), and execution
scopes approvers by that owner, never by the plan's tenant field (issue 16, findings 1 and 2).

The CLI path runs for real: `denpex approve` signs, `denpex isolate --execute` acts on the
Kubernetes fake API through the official client.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from denpex.cli import app
from denpex.ingest.errors import RegistryError
from denpex.ingest.plans import PlanTier
from denpex.ingest.registry import Registry
from denpex.isolation.plan import IsolationPlan, load_plan, save_plan, utc_now
from denpex.isolation.planner import plan_isolation
from denpex.isolation.policy import ApprovalRule, ApproverScope, IsolationPolicy, Scheduler
from denpex.state_paths import INGEST_DATABASE
from isolation.triage_cases import killed_process, signal
from isolation.trust import APPROVERS_FILE, key_file, write_runbook
from testkit.fakes.k8s_api import FakeApiServer, make_node

runner = CliRunner()

A_CLUSTER = "gpu.prod"
B_CLUSTER = "b-lab"
NODE = "gpu-node-002"
POLICY = IsolationPolicy(approval=ApprovalRule(scoped=(ApproverScope(tenant="a", names=frozenset({"alice"})),
                                                       ApproverScope(tenant="b", names=frozenset({"bob"})))))
"""Nobody approves everywhere: alice approves for tenant a, bob for tenant b."""


def two_tenants(state: Path) -> Registry:
    registry = Registry(state)
    registry.add_tenant("a", PlanTier.DATA_CENTER)
    registry.add_tenant("b", PlanTier.DATA_CENTER)
    registry.create_key("a", A_CLUSTER)
    registry.create_key("b", B_CLUSTER)
    return registry


# -- registering ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [A_CLUSTER, "GPU_Prod", "gpu-prod", "Gpu.Prod"], ids=str)
@pytest.mark.parametrize("how", ["key", "token", "cluster"])
def test_another_tenant_cannot_register_a_taken_or_colliding_name(tmp_path: Path, name: str, how: str) -> None:
    registry = two_tenants(tmp_path)
    register = getattr(registry, {"key": "create_key", "token": "create_token", "cluster": "add_cluster"}[how])
    with pytest.raises(RegistryError, match="registered to tenant 'a'; a cluster belongs to one tenant"):
        register("b", name)
    assert [(c.cluster, c.tenant) for c in registry.clusters()] == [("b-lab", "b"), ("gpu.prod", "a")]


def test_the_cli_refuses_a_colliding_name_and_lists_owners(tmp_path: Path) -> None:
    two_tenants(tmp_path)
    env = {"DENPEX_STATE_DIR": str(tmp_path)}
    refused = runner.invoke(app, ["keys", "create", "--tenant", "b", "--cluster", "GPU_Prod"], env=env)
    assert refused.exit_code == 2
    assert ("cluster 'GPU_Prod' makes the same block name 'gpu-prod' as cluster 'gpu.prod', which is registered "
            "to tenant 'a'") in refused.stderr
    taken = runner.invoke(app, ["clusters", "add", A_CLUSTER, "--tenant", "b"], env=env)
    assert taken.exit_code == 2 and "cluster 'gpu.prod' is registered to tenant 'a'" in taken.stderr
    listed = runner.invoke(app, ["clusters", "list"], env=env)
    assert listed.exit_code == 0 and '"cluster":"gpu.prod","block_name":"gpu-prod","tenant":"a"' in listed.stdout


def test_the_owner_keeps_one_spelling_and_more_keys_are_fine(tmp_path: Path) -> None:
    registry = two_tenants(tmp_path)
    registry.create_key("a", A_CLUSTER)
    registry.create_token("a", A_CLUSTER)
    with pytest.raises(RegistryError, match="already registered to tenant 'a'; use the name 'gpu.prod'"):
        registry.create_key("a", "GPU_Prod")


def _old_registry(state: Path, claims: list[tuple[str, str]]) -> None:
    """A registry from before cluster ownership: keys with free cluster strings, no clusters table."""
    registry = Registry(state)
    for tenant, _ in claims:
        registry.add_tenant(tenant, PlanTier.DATA_CENTER)
    db = sqlite3.connect(state / INGEST_DATABASE)
    with db:
        db.execute("DROP TABLE clusters")
        for n, (tenant, cluster) in enumerate(claims):
            db.execute("INSERT INTO keys (key_id, tenant, cluster, secret_encrypted, created_at) "
                       "VALUES (?, ?, ?, x'00', 0)", (f"dk_old{n}", tenant, cluster))
    db.close()


def test_an_old_registry_is_migrated_and_a_shared_cluster_is_contested(tmp_path: Path) -> None:
    from denpex.tenancy import OwnershipState, execution_tenant, read_ownership

    _old_registry(tmp_path, [("a", "gpu.prod"), ("b", "GPU_Prod"), ("a", "a-only")])
    # Before the service or a command opens it, the owner is unknown, never "nobody".
    assert read_ownership(tmp_path, "a-only").state is OwnershipState.UNMIGRATED
    registry = Registry(tmp_path)
    assert read_ownership(tmp_path, "a-only").tenant == "a"
    contested = read_ownership(tmp_path, "gpu.prod")
    assert contested.state is OwnershipState.CONTESTED
    assert contested.detail == "names 'GPU_Prod', 'gpu.prod' used by tenants 'a', 'b'"
    refusal = execution_tenant(contested, None)
    assert not refusal.allowed and "revoke the other tenants' keys and tokens" in refusal.reason
    with pytest.raises(RegistryError, match="contested"):
        registry.create_key("a", "gpu.prod")
    # The operator revokes the other tenant's key; the next open claims the cluster for a.
    registry.revoke_key("dk_old1")
    Registry(tmp_path)
    assert read_ownership(tmp_path, "gpu.prod").tenant == "a"


def test_no_registry_means_no_tenant_scoping(tmp_path: Path) -> None:
    from denpex.tenancy import OwnershipState, execution_tenant, read_ownership

    ownership = read_ownership(tmp_path, "lab")
    assert ownership.state is OwnershipState.UNREGISTERED
    assert execution_tenant(ownership, "whoever").tenant is None
    assert "no tenant scoping applied" in execution_tenant(ownership, None).reason
    assert not (tmp_path / INGEST_DATABASE).exists()  # reading wrote nothing


def test_a_target_block_serves_only_its_exact_cluster_and_its_owner(tmp_path: Path) -> None:
    from denpex.tenancy import judge_target, read_ownership

    two_tenants(tmp_path)
    owned = read_ownership(tmp_path, A_CLUSTER)
    assert judge_target(owned, tenant="a", block_cluster=A_CLUSTER).tenant == "a"
    foreign = judge_target(owned, tenant="b", block_cluster=A_CLUSTER)
    assert not foreign.allowed
    assert foreign.reason == ("cluster 'gpu.prod' belongs to tenant 'a' in the operator's registry, not to the "
                              "incident's tenant 'b'")
    other_spelling = judge_target(read_ownership(tmp_path, "GPU_Prod"), tenant="a", block_cluster=A_CLUSTER)
    assert not other_spelling.allowed and "not the incident's 'GPU_Prod'" in other_spelling.reason


# -- executing on the CLI path --------------------------------------------------------------------

@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        for i in range(1, 17):
            server.add_node(make_node(f"gpu-node-{i:03d}"))
        yield server


def _plan(path: Path, cluster: str, tenant: str | None, policy: IsolationPolicy = POLICY) -> Path:
    now = utc_now()
    result = killed_process(hardware=[signal(79, host=NODE, age=timedelta(minutes=1), as_of=now)], host=NODE,
                            as_of=now)
    plan = plan_isolation(result, None, policy, None, Scheduler.KUBERNETES, "inc-xt", now, cluster=cluster,
                          tenant=tenant)
    save_plan(plan, path)
    return path


def _edit_tenant(path: Path, tenant: str | None) -> IsolationPlan:
    plan = load_plan(path).model_copy(update={"tenant": tenant})
    save_plan(plan, path)
    return plan


def _isolate(api: FakeApiServer, tmp_path: Path, plan: Path, cluster: str, approver: str,
             policy: IsolationPolicy = POLICY) -> Result:
    env = {"DENPEX_KUBE_HOST": api.url, "DENPEX_KUBE_TOKEN": "test-token", "DENPEX_STATE_DIR": str(tmp_path / "state"),
           "DENPEX_TRUSTED_APPROVERS": str(APPROVERS_FILE), "DENPEX_CLUSTER": cluster,
           "DENPEX_RUNBOOK": str(write_runbook(tmp_path / "runbook.yaml", policy))}
    approved = runner.invoke(app, ["approve", str(plan), "--approver", approver, "--key", key_file(approver)])
    assert approved.exit_code == 0, approved.output
    return runner.invoke(app, ["isolate", str(plan), "--execute"], env=env)


@pytest.mark.parametrize("tenant, why", [
    (None, "'bob' is not an allowed approver here (alice)"),
    ("b", "cluster 'gpu.prod' belongs to tenant 'a' in the operator's registry, not to the plan's tenant 'b'"),
], ids=["nulled", "changed"])
def test_another_tenants_approver_cannot_approve_by_editing_the_plans_tenant(
        api: FakeApiServer, tmp_path: Path, tenant: str | None, why: str) -> None:
    two_tenants(tmp_path / "state")
    plan = _plan(tmp_path / "plan.json", A_CLUSTER, "a")
    _edit_tenant(plan, tenant)  # bob (tenant b's approver, trusted key) edits the plan, then signs it
    result = _isolate(api, tmp_path, plan, A_CLUSTER, "bob")
    assert result.exit_code == 2, result.output
    assert "execution refused" in result.stderr and why in result.stderr
    assert not [r for r in api.requests if r[0] == "PATCH"]
    assert not api.nodes[NODE]["spec"].get("unschedulable")


def test_the_owners_approver_isolates_a_tenantless_cli_plan(api: FakeApiServer, tmp_path: Path) -> None:
    two_tenants(tmp_path / "state")
    result = _isolate(api, tmp_path, _plan(tmp_path / "plan.json", A_CLUSTER, None), A_CLUSTER, "alice")
    assert result.exit_code == 0, result.output
    assert api.nodes[NODE]["spec"]["unschedulable"] is True
    assert "no tenant scoping applied" not in result.stdout


def test_an_unregistered_cluster_works_as_before_and_says_no_scoping_applied(api: FakeApiServer,
                                                                              tmp_path: Path) -> None:
    """Where the runbook lists approvers for every tenant, a cluster nobody registered
    (single-tenant use) is approved as before, and the note says no tenant scoping applied."""
    everywhere = IsolationPolicy(approval=ApprovalRule(approvers=frozenset({"alice"})))
    result = _isolate(api, tmp_path, _plan(tmp_path / "plan.json", "solo", None, everywhere), "solo", "alice",
                      everywhere)
    assert result.exit_code == 0, result.output
    assert ("note: cluster 'solo' has no registered owner in the ingest registry: no tenant scoping applied"
            in result.stdout)


@pytest.mark.parametrize("approver, why", [
    ("bob", "'bob' approves only where the runbook scopes them, not for tenant '(none)' on cluster 'gpu-prod'"),
    ("alice", "the runbook scopes approvers by tenant, and cluster 'gpu-prod' has no registered owner"),
], ids=["scoped-elsewhere", "any-trusted-key"])
def test_scoped_approvers_hold_without_a_registry(api: FakeApiServer, tmp_path: Path, approver: str,
                                                  why: str) -> None:
    """Issue 30 section 3: with no ingest registry in the state directory, bob (scoped to acme's
    gpu-dev) signed acme's gpu-prod plan with ``tenant: null`` and ``isolate --execute`` cordoned
    the node. The scope holds whatever the registry holds: with no registered owner, no tenant's
    approvers can be told, and no other trusted key (alice's) stands in for them (fail closed)."""
    scoped = IsolationPolicy(approval=ApprovalRule(scoped=(
        ApproverScope(tenant="acme", cluster="gpu-prod", names=frozenset({"dave"})),
        ApproverScope(tenant="acme", cluster="gpu-dev", names=frozenset({"bob"})))))
    plan = _plan(tmp_path / "plan.json", "gpu-prod", None, scoped)
    result = _isolate(api, tmp_path, plan, "gpu-prod", approver, scoped)
    assert result.exit_code == 2, result.output
    assert "execution refused" in result.stderr and why in result.stderr
    assert not [r for r in api.requests if r[0] == "PATCH"]
    assert not api.nodes[NODE]["spec"].get("unschedulable")
