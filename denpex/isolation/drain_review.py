"""Isolations still standing, read from the audit log, and those overdue for review.

A node counts as isolated from its last applied ``isolate`` result until an applied ``rollback``
result for the same node. Worked example (audit records, oldest first)::

    result isolate gpu-node-002 applied   2026-11-01   -> isolated since 2026-11-01
    result isolate gpu-node-003 applied   2026-11-02
    result rollback gpu-node-003 applied  2026-11-03   -> gpu-node-003 is back in service
    overdue_isolations(now=2026-11-20, review_age=7 days) -> [gpu-node-002, 19 days]
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from pydantic import BaseModel, ConfigDict

from denpex.isolation.audit import AuditKind, AuditRecord, Outcome
from denpex.isolation.plan import Operation
from denpex.markdown_text import inline

__all__ = ["StandingIsolation", "standing_isolations", "overdue_isolations", "overdue_markdown"]

_APPLIED = {Outcome.APPLIED, Outcome.RECOVERED_APPLIED}


class StandingIsolation(BaseModel):
    """A node Denpex isolated that has not been returned to service."""

    model_config = ConfigDict(frozen=True)

    node: str
    incident_id: str
    plan_hash: str
    action: str | None
    approver: str | None
    since: datetime

    def age(self, now: datetime) -> timedelta:
        return now - self.since


def standing_isolations(records: Iterable[AuditRecord]) -> list[StandingIsolation]:
    """Nodes whose last applied result is an isolation, oldest first."""
    standing: dict[str, StandingIsolation] = {}
    for record in records:
        if record.kind is not AuditKind.RESULT or record.node is None or record.outcome not in _APPLIED:
            continue
        if record.operation is Operation.ROLLBACK:
            standing.pop(record.node, None)
        elif record.node not in standing:
            standing[record.node] = StandingIsolation(
                node=record.node, incident_id=record.incident_id, plan_hash=record.plan_hash,
                action=record.action, approver=record.approver, since=record.time)
    return sorted(standing.values(), key=lambda s: s.since)


def overdue_isolations(records: Iterable[AuditRecord], *, now: datetime,
                       review_age: timedelta) -> list[StandingIsolation]:
    """Standing isolations older than ``review_age`` at ``now``."""
    return [s for s in standing_isolations(records) if s.age(now) > review_age]


def overdue_markdown(overdue: list[StandingIsolation], *, now: datetime, review_age: timedelta) -> str:
    """A markdown table for an artifact."""
    if not overdue:
        return f"# Isolations due for review\n\nNo isolation is older than {review_age}.\n"
    rows = ["| node | action | incident | approver | since | age |", "|---|---|---|---|---|---|"]
    # Every cell read from the audit log is escaped: its fields came from plans and approvals.
    rows += [f"| {inline(s.node)} | {inline(s.action or '-')} | {inline(s.incident_id)} | "
             f"{inline(s.approver or '-')} | {s.since.isoformat()} | {s.age(now)} |" for s in overdue]
    return "\n".join(["# Isolations due for review", "",
                      f"**{len(overdue)} isolation(s) older than {review_age}**: review them "
                      "(`denpex isolate PLAN --execute --rollback` returns a node to service).", "", *rows]) + "\n"
