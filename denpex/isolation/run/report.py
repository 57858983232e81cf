"""What a run decided and did: ``RunMode``, ``NodeDecision``, ``NodeOutcome``, ``ExecutionReport``.

The report is a contract: ``denpex isolate --format json`` prints it and the flow keeps it, so a
field never changes meaning.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from denpex.isolation.audit import Outcome
from denpex.isolation.plan import Operation

__all__ = ["RunMode", "NodeDecision", "NodeOutcome", "ExecutionReport"]


class RunMode(StrEnum):
    """Whether a run may change anything."""

    DRY_RUN = "dry_run"
    """Read facts and run every gate; change nothing, write nothing."""
    EXECUTE = "execute"
    """Act on an approved plan."""


class NodeDecision(StrEnum):
    """What the run decided for one node after the gates ran on live facts."""

    ACT = "act"
    """The command is (or in a dry run would be) sent."""
    ALREADY_DONE = "already_done"
    """The node is already in the wanted state under this incident; nothing is sent."""
    BLOCKED = "blocked"
    """A gate refused the node; nothing is sent."""


class NodeOutcome(BaseModel):
    """One node's story in a run."""

    model_config = ConfigDict(frozen=True)

    node: str
    decision: NodeDecision
    command: str
    outcome: Outcome | None = None
    """None in a dry run."""
    rc: int | None = None
    output: str = ""
    state_before: str = ""
    state_after: str = ""
    running_jobs: tuple[str, ...] = ()
    """Jobs still running on the node (under DRAIN they run to completion)."""
    message: str = ""


class ExecutionReport(BaseModel):
    """What a run did (or, in a dry run, would do)."""

    mode: RunMode
    operation: Operation
    incident_id: str
    plan_hash: str
    approver: str | None = None
    nodes: list[NodeOutcome]
    blocked: list[str] = []
    recovered: list[str] = []
    breaker_tripped: bool = False
    audit_copy: str | None = None
    warnings: list[str] = []
    notes: list[str] = []
    """What a person should know next, e.g. the hung job that keeps a drained node busy."""

    @property
    def failed(self) -> bool:
        return any(n.outcome is Outcome.FAILED for n in self.nodes)

    @property
    def unfinished(self) -> list[str]:
        """The nodes that are not (in a dry run: would not be) in the wanted state, and why:
        ``["gpu-node-012 blocked", "gpu-node-013 failed"]``; empty when every node is."""
        return [f"{n.node} {Outcome.FAILED.value if n.outcome is Outcome.FAILED else n.decision.value}"
                for n in self.nodes if n.decision is NodeDecision.BLOCKED or n.outcome is Outcome.FAILED]
