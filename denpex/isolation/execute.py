"""``execute_approved``: the one way a plan is carried out, by the CLI and by the Prefect flow.

Everything is judged again at execution time, against the operator's configuration, never the
plan's own word:

1. the plan's policy snapshot equals the operator's (a rollback: the same reason prefix);
2. to isolate, the verdict names a culprit and every action has supporting evidence and the
   operator's steps;
3. the cluster the adapter reaches is the plan's and the approval's;
4. the approval authenticates (a trusted signature, or an accepted channel and a listed
   approver) and binds this plan hash, operation, incident, cluster and nodes, and is current;
5. under the machine-wide run lock, the keyed audit chain verifies and extends the cluster's copy
   in the operator's audit store (``denpex.isolation.audit_store``);
6. the gates run on live facts (node, blast radius, breaker, per-cluster rate limit); then act.

Refusals raise ``RefusedError`` subclasses (never retried); ``errors.is_transient`` tells the
faults worth retrying.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime

from denpex.analysis.models import Verdict
from denpex.evidence.errors import EvidenceError
from denpex.evidence.store import EvidenceStore, open_store
from denpex.isolation.adapter import ClusterAdapter
from denpex.isolation.approval import Approval, check_approval
from denpex.isolation.audit import AuditLog
from denpex.isolation.errors import ApprovalError, ConfigError, PolicyMismatchError, RemoteError
from denpex.isolation.executor import ExecutionReport, Executor, RunMode
from denpex.isolation.facts import owned_reason_prefix
from denpex.isolation.operator import OperatorConfig
from denpex.isolation.plan import IsolationPlan, Operation, utc_now
from denpex.isolation.policy import IsolationPolicy
from denpex.tenancy import ClusterOwnership, OwnershipState, TenancyDecision, execution_tenant, read_ownership

__all__ = ["VERDICTS_WITH_CULPRIT", "execute_approved", "check_plan_policy", "reached_cluster"]

VERDICTS_WITH_CULPRIT = frozenset({Verdict.LOCALIZED.value, Verdict.INCOMPLETE.value})
"""Verdicts that can name a culprit; ``no_hang`` and ``ambiguous`` never isolate a node."""


def execute_approved(
    plan: IsolationPlan,
    approval: Approval | None,
    *,
    operator: OperatorConfig,
    adapter: ClusterAdapter,
    mode: RunMode = RunMode.EXECUTE,
    operation: Operation | None = None,
    clock: Callable[[], datetime] = utc_now,
    sleep: Callable[[float], None] = time.sleep,
    store: EvidenceStore | None = None,
    audit_store: EvidenceStore | None = None,
) -> ExecutionReport:
    """Dry-run or execute ``plan`` under ``approval`` on the cluster ``adapter`` reaches.

    ``operation`` defaults to the approval's (ISOLATE in a dry run without one). ``store``
    defaults to the operator's evidence store, ``audit_store`` to the operator's audit store.
    Raises ApprovalError, PolicyMismatchError or AuditChainError (refusals: nothing was done),
    ConfigError, BusyError, or RemoteError subclasses from the cluster.
    """
    operation = operation or (approval.operation if approval is not None else Operation.ISOLATE)
    check_plan_policy(plan, operator.policy, operation)
    cluster = reached_cluster(adapter, operator)
    if plan.cluster is not None and cluster != plan.cluster:
        raise ApprovalError(f"execution refused: the plan was made for cluster {plan.cluster!r}, but the "
                            f"settings reach {cluster or 'a cluster that does not say its name'!r}; "
                            "nothing was done")
    tenancy = _tenancy(plan, operator, cluster)
    approver, nodes = None, None
    if mode is RunMode.EXECUTE:
        approved = check_approval(plan, approval, now=clock(), operation=operation,
                                  rule=operator.policy.approval, trusted=operator.trusted,
                                  cluster=cluster, tenant=tenancy.tenant)
        approver, nodes = approved.approver, approved.nodes
    if store is None and operator.evidence_store:
        store = open_store(operator.evidence_store)
    if audit_store is None:
        try:
            audit_store = open_store(operator.audit_store_uri)
        except EvidenceError as exc:
            raise ConfigError(f"the audit store {operator.audit_store_uri!r} cannot be used: {exc}; set "
                              "`audit_store:` (or DENPEX_AUDIT_STORE) to a folder or s3://bucket/prefix") from exc
    # A dry run writes nothing, not even the audit key: it never appends to the log.
    audit = operator.audit_log() if mode is RunMode.EXECUTE else AuditLog(operator.audit_path)
    executor = Executor(
        adapter=adapter, audit=audit, breaker=operator.breaker(), policy=operator.policy,
        cluster=cluster or "(unnamed)", store=store, audit_store=audit_store, clock=clock, sleep=sleep,
        verify_timeout_s=operator.verify_timeout_s, poll_s=operator.poll_s,
    )
    report = executor.run(plan, mode=mode, operation=operation, approver=approver, nodes=nodes)
    if tenancy.tenant is None:
        report.notes.append(tenancy.reason)
    return report


def _tenancy(plan: IsolationPlan, operator: OperatorConfig, cluster: str | None) -> TenancyDecision:
    """Whose approvers apply: the registry's owner of the reached cluster, never the plan's word.

    A plan naming another tenant is refused here, before anything is read from the cluster's nodes.
    """
    # A cluster that does not say its name has no owner to look up; the approval check refuses it.
    ownership = (read_ownership(operator.state_dir, cluster) if cluster
                 else ClusterOwnership("(unnamed)", OwnershipState.UNREGISTERED))
    decision = execution_tenant(ownership, plan.tenant)
    if not decision.allowed:
        raise ApprovalError(f"execution refused: {decision.reason}; nothing was done")
    return decision


def reached_cluster(adapter: ClusterAdapter, operator: OperatorConfig) -> str | None:
    """The name of the cluster the settings reach: the adapter's word, else the operator's setting."""
    try:
        said = adapter.cluster_name()
    except RemoteError as exc:
        raise type(exc)(f"{exc}. The run stopped while reading the cluster's name, before changing any "
                        "node") from exc
    if said and operator.cluster and said != operator.cluster:
        raise ApprovalError(f"execution refused: the settings name cluster {operator.cluster!r} but it "
                            f"calls itself {said!r}; nothing was done")
    return said or operator.cluster


def check_plan_policy(plan: IsolationPlan, policy: IsolationPolicy, operation: Operation) -> None:
    """Raise PolicyMismatchError listing every way ``plan`` departs from the operator's ``policy``
    or does not support its actions.

    A rollback only undoes what this incident owns, so only the reason prefix must agree: undoing
    an isolation stays possible after the runbook changed.
    """
    problems: list[str] = []
    if operation is Operation.ROLLBACK:
        if plan.policy.reason_prefix != policy.reason_prefix:
            problems.append(f"the plan's reason prefix {plan.policy.reason_prefix!r} is not the operator's "
                            f"{policy.reason_prefix!r}")
        # The undo acts on the reason's incident tag (Kubernetes taint value and annotations).
        problems += _reason_problems(plan, policy)
    else:
        problems += _isolate_problems(plan, policy)
    if problems:
        raise PolicyMismatchError("execution refused: " + "; ".join(problems) + "; nothing was done")


def _isolate_problems(plan: IsolationPlan, policy: IsolationPolicy) -> list[str]:
    problems = []
    if plan.policy != policy:
        differs = sorted(k for k in type(policy).model_fields if getattr(plan.policy, k) != getattr(policy, k))
        problems.append(f"the plan's policy differs from the operator's runbook ({', '.join(differs)}); "
                        "policy comes from the operator's configuration, never from the plan: triage "
                        "again with the operator's runbook")
    if plan.actions and plan.verdict not in VERDICTS_WITH_CULPRIT:
        problems.append(f"the plan's verdict {plan.verdict!r} names no culprit, yet it has actions")
    steps = policy.remediation.for_scheduler(plan.scheduler)
    for action in plan.actions:
        if not action.evidence and policy.evidence.hardware_signal_required_for:
            problems.append(f"{action.node} has no supporting evidence")
        if (action.action, action.rollback) != (steps.act, steps.rollback) \
                or action.pre_checks != steps.check or action.post_checks != steps.verify:
            problems.append(f"{action.node}'s steps are not the runbook's ({steps.act.value}, "
                            f"rollback {steps.rollback.value})")
    return problems + _reason_problems(plan, policy)


def _reason_problems(plan: IsolationPlan, policy: IsolationPolicy) -> list[str]:
    owned = owned_reason_prefix(policy.reason_prefix, plan.incident_id)
    return [f"{action.node}'s reason does not start with {owned!r}" for action in plan.actions
            if not (action.reason == owned or action.reason.startswith(owned + " "))]
