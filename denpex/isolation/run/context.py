"""What every step of a run shares: the run's own facts (``RunContext``), built once, and the
dependencies its steps use (``Tools``), passed in; nothing is global.

A step takes the context instead of the plan, its hash, the operation and the approver one by one,
so the approval ``check_approval`` accepted travels whole from the entry point to the audit records.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from denpex.evidence.store import EvidenceStore
from denpex.isolation.adapter import ClusterAdapter
from denpex.isolation.approval import Approval
from denpex.isolation.audit import AuditEntry, AuditKind, AuditLog
from denpex.isolation.breaker import CircuitBreaker
from denpex.isolation.facts import NodeFacts
from denpex.isolation.plan import IsolationPlan, NodeAction, Operation, utc_now
from denpex.isolation.policy import IsolationPolicy
from denpex.isolation.run.report import NodeDecision, RunMode

__all__ = ["RunContext", "Tools", "Pending", "jobs_note"]


@dataclass(frozen=True)
class RunContext:
    """One run of one plan: what it does, under which approval, in which mode."""

    plan: IsolationPlan
    digest: str
    """``plan.content_hash()``, computed once."""
    operation: Operation
    approved: Approval | None
    """The approval ``check_approval`` accepted; None in a dry run."""
    mode: RunMode

    @classmethod
    def start(cls, plan: IsolationPlan, *, operation: Operation, approved: Approval | None,
              mode: RunMode) -> RunContext:
        return cls(plan=plan, digest=plan.content_hash(), operation=operation, approved=approved, mode=mode)

    @property
    def approver(self) -> str | None:
        return self.approved.approver if self.approved is not None else None

    def entry(self, kind: AuditKind, **fields: object) -> AuditEntry:
        """An audit record of this run, neither a node's nor the job's (a breaker trip, a refusal)."""
        return AuditEntry.model_validate({
            "kind": kind, "incident_id": self.plan.incident_id, "plan_hash": self.digest,
            "operation": self.operation, "approver": self.approver, **fields,
        })

    def node_entry(self, kind: AuditKind, action: NodeAction, *, operation: Operation | None = None,
                   **fields: object) -> AuditEntry:
        """A node's audit record; ``operation`` defaults to the run's (a recovered intent keeps its own)."""
        operation = operation or self.operation
        what = action.action.value if operation is Operation.ISOLATE else action.rollback.value
        return AuditEntry.model_validate({
            "kind": kind, "incident_id": self.plan.incident_id, "plan_hash": self.digest,
            "operation": operation, "approver": self.approver, "node": action.node, "action": what,
            **fields,
        })

    def job_entry(self, kind: AuditKind, **fields: object) -> AuditEntry:
        """An audit record of the hung job's requeue."""
        return AuditEntry.model_validate({
            "kind": kind, "incident_id": self.plan.incident_id, "plan_hash": self.digest,
            "operation": Operation.REQUEUE, "approver": self.approver, "node": None, "action": "requeue",
            **fields,
        })


@dataclass(frozen=True)
class Tools:
    """The dependencies of a run's steps, against one cluster under the operator's ``policy``.

    ``cluster`` names the cluster for the per-cluster rate limit and its stored copy of the audit
    log in ``audit_store``; ``store`` (the evidence store) gets the incident's copy.
    """

    adapter: ClusterAdapter
    audit: AuditLog
    breaker: CircuitBreaker
    policy: IsolationPolicy
    cluster: str
    store: EvidenceStore | None = None
    audit_store: EvidenceStore | None = None
    clock: Callable[[], datetime] = utc_now
    sleep: Callable[[float], None] = time.sleep
    verify_timeout_s: float = 20.0
    poll_s: float = 0.2
    max_sends: int = 3

    def unmet(self, run: RunContext, action: NodeAction, operation: Operation, facts: NodeFacts) -> list[str]:
        """The post-checks of ``operation`` on ``action``'s node that ``facts`` do not meet."""
        return self.adapter.unmet_checks(action, operation, facts, reason_prefix=self.policy.reason_prefix,
                                         incident_id=run.plan.incident_id)


@dataclass(frozen=True)
class Pending:
    """One node's decision on live facts, before anything is sent."""

    action: NodeAction
    facts: NodeFacts
    decision: NodeDecision
    message: str = ""


def jobs_note(facts: NodeFacts, operation: Operation) -> str:
    """What runs on the node, for the audit record: ``"no job is running on gpu-node-002"``."""
    if not facts.running_jobs:
        return f"no job is running on {facts.name}"
    note = f"{len(facts.running_jobs)} job(s) running on {facts.name}: {', '.join(facts.running_jobs)}"
    if operation is Operation.ISOLATE:
        note += "; they keep running to completion, no new work is placed there"
    return note
