"""Write why a plan was not carried out (or was withdrawn) to the audit log, and extend its copy.

A rejection, a pause that timed out, a refused answer and a recovered job each leave one
``decision`` record, so the audit log answers "why was this node not drained?" as well as
"why was it drained?". The record then goes into the cluster's stored copy like an execution's,
so cutting the log back to before a rejection is caught by the cluster's next action.
"""

from __future__ import annotations

from datetime import datetime

from denpex.evidence.store import EvidenceStore
from denpex.isolation.audit import AuditEntry, AuditKind, AuditLog, AuditRecord
from denpex.isolation.audit_store import update_stored_copy
from denpex.isolation.plan import IsolationPlan, Operation

__all__ = ["record_decision"]


def record_decision(audit: AuditLog, plan: IsolationPlan, *, operation: Operation, outcome: str,
                    reason: str, approver: str | None, at: datetime, store: EvidenceStore | None = None,
                    cluster: str | None = None) -> AuditRecord:
    """Append one decision record for ``plan`` (no node is named, since none was touched), then,
    with ``store``, extend ``cluster``'s copy there (default: the plan's cluster).

    The record is in the log before the copy is tried: StoreError (the store is away) or
    AuditChainError (the log does not extend the copy) from the copy leave it there.
    """
    entry = AuditEntry(kind=AuditKind.DECISION, incident_id=plan.incident_id, plan_hash=plan.content_hash(),
                       operation=operation, approver=approver or None, action=outcome,
                       message=reason[:2000])
    record = audit.append(entry, at=at)
    if store is not None:
        update_stored_copy(audit, store, cluster or plan.cluster or "(unnamed)")
    return record
