"""Write why a plan was not carried out (or was withdrawn) to the audit log.

A rejection, a pause that timed out, a refused answer and a recovered job each leave one
``decision`` record, so the audit log answers "why was this node not drained?" as well as
"why was it drained?".
"""

from __future__ import annotations

from datetime import datetime

from denpex.isolation.audit import AuditEntry, AuditKind, AuditLog, AuditRecord
from denpex.isolation.plan import IsolationPlan, Operation

__all__ = ["record_decision"]


def record_decision(audit: AuditLog, plan: IsolationPlan, *, operation: Operation, outcome: str,
                    reason: str, approver: str | None, at: datetime) -> AuditRecord:
    """Append one decision record for ``plan``: no node is named, since none was touched."""
    entry = AuditEntry(kind=AuditKind.DECISION, incident_id=plan.incident_id, plan_hash=plan.content_hash(),
                       operation=operation, approver=approver or None, action=outcome,
                       message=reason[:2000])
    return audit.append(entry, at=at)
