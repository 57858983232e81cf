"""``execute``: the one way a plan is carried out, by the CLI and by the Prefect flow.

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

from denpex.evidence.errors import EvidenceError
from denpex.evidence.store import EvidenceStore, open_store
from denpex.isolation.adapter import ClusterAdapter
from denpex.isolation.approval import Approval, check_approval
from denpex.isolation.audit import AuditLog
from denpex.isolation.errors import ConfigError
from denpex.isolation.operator import OperatorConfig
from denpex.isolation.plan import IsolationPlan, Operation, utc_now
from denpex.isolation.run.checks import check_plan_cluster, check_plan_policy, reached_cluster, tenancy
from denpex.isolation.run.executor import Executor
from denpex.isolation.run.report import ExecutionReport, RunMode

__all__ = ["execute"]


def execute(
    plan: IsolationPlan,
    approval: Approval | None,
    *,
    operator: OperatorConfig,
    adapter: ClusterAdapter,
    mode: RunMode = RunMode.DRY_RUN,
    operation: Operation | None = None,
    clock: Callable[[], datetime] = utc_now,
    sleep: Callable[[float], None] = time.sleep,
    store: EvidenceStore | None = None,
    audit_store: EvidenceStore | None = None,
) -> ExecutionReport:
    """Dry-run (the default) or execute ``plan`` under ``approval`` on the cluster ``adapter`` reaches.

    ``operation`` defaults to the approval's (ISOLATE in a dry run without one). ``store``
    defaults to the operator's evidence store, ``audit_store`` to the operator's audit store.
    Raises ApprovalError, PolicyMismatchError or AuditChainError (refusals: nothing was done),
    ConfigError, BusyError, or RemoteError subclasses from the cluster.
    """
    operation = operation or (approval.operation if approval is not None else Operation.ISOLATE)
    check_plan_policy(plan, operator.policy, operation)
    cluster = reached_cluster(adapter, operator)
    check_plan_cluster(plan, cluster)
    decision = tenancy(plan, operator, cluster)
    approved = None
    if mode is RunMode.EXECUTE:
        approved = check_approval(plan, approval, now=clock(), operation=operation,
                                  rule=operator.policy.approval, trusted=operator.trusted,
                                  cluster=cluster, tenant=decision.tenant)
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
    report = executor.run(plan, mode=mode, operation=operation, approved=approved)
    if decision.tenant is None:
        report.notes.append(decision.reason)
    return report
