"""The incident's final report: the triage JSON contract plus the plan and what became of it.

``make demo`` prints ``report: PATH``; PATH holds this object::

    {"verdict": "localized", "world_size": 4, ..., "plan": {...},     # denpex triage --format json
     "incident": {"incident_id": "inc-7", "cluster": "lab", "flow_run_id": "..."},
     "outcome": "executed", "reason": "approved by alice for gpu-node-003",
     "plan_hash": "...", "approval": {...}, "execution": {...}}
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict

from denpex.isolation.approval import Approval
from denpex.isolation.run.report import ExecutionReport
from denpex.report import TriageReport

__all__ = ["IncidentStage", "IncidentRef", "IncidentOutcome"]


class IncidentStage(StrEnum):
    """How an incident run ended."""

    NO_ACTION = "no_action"
    """Triage proposed no isolation; nothing was asked and nothing done."""
    REJECTED = "rejected"
    """A person rejected the plan; the cluster was not touched."""
    TIMED_OUT = "timed_out"
    """Nobody answered within the runbook's approval timeout; the cluster was not touched."""
    REFUSED = "refused"
    """The answer was not a valid approval of the plan shown; the cluster was not touched."""
    WITHDRAWN = "withdrawn"
    """The job recovered before the plan ran; the plan was withdrawn, nothing was isolated."""
    EXECUTED = "executed"
    """The approved plan ran; ``execution`` says what each node became."""
    FAILED = "failed"
    """The approved plan ran and a node did not reach the wanted state, or execution was refused."""


class IncidentRef(BaseModel):
    """Which incident this is (the alert event's payload, less the evidence location)."""

    model_config = ConfigDict(frozen=True)

    tenant: str
    cluster: str
    job_id: str
    incident_id: str
    alert_id: str
    flow_run_id: str | None = None


class IncidentOutcome(BaseModel):
    """What the flow returns and writes: triage, plan, decision, execution."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    incident: IncidentRef
    report: TriageReport
    outcome: IncidentStage
    reason: str
    plan_hash: str | None = None
    approval: Approval | None = None
    execution: ExecutionReport | None = None

    def contract_json(self) -> dict[str, Any]:
        """The triage JSON contract at the top level, the rest beside it."""
        data: dict[str, Any] = self.report.model_dump(mode="json")
        data.update({
            "incident": self.incident.model_dump(mode="json"),
            "outcome": self.outcome.value,
            "reason": self.reason,
            "plan_hash": self.plan_hash,
            "approval": self.approval.model_dump(mode="json") if self.approval else None,
            "execution": self.execution.model_dump(mode="json") if self.execution else None,
        })
        return data
