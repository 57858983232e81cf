"""The one interface the executor needs from a scheduler (Slurm over SSH, Kubernetes API).

An adapter reads facts and sends exactly one changing call per ``isolate``/``rollback``. It never
decides: the gates and the executor do, on the facts it returns.
"""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel, ConfigDict

from denpex.isolation.facts import ClusterFacts, NodeFacts
from denpex.isolation.plan import HungJob, NodeAction, Operation
from denpex.isolation.policy import Scheduler

__all__ = ["ActionOutput", "ClusterAdapter"]


class ActionOutput(BaseModel):
    """What one changing call returned (its command, rc and output) for the audit log."""

    model_config = ConfigDict(frozen=True)

    command: str
    rc: int
    output: str


class ClusterAdapter(Protocol):
    """Reads node facts and applies or undoes one node action."""

    scheduler: Scheduler

    def cluster_name(self) -> str | None:
        """The cluster's own name (Slurm ``ClusterName``, the Kubernetes context); None if unknown."""
        ...

    def cluster_facts(self) -> ClusterFacts:
        """Every node, for the blast-radius gate (running jobs may be left empty)."""
        ...

    def node_facts(self, node: str) -> NodeFacts:
        """One node, with its running jobs; ``exists=False`` for an unknown node."""
        ...

    def command_for(self, action: NodeAction, operation: Operation) -> str:
        """The exact command or API call that ``apply`` sends, for dry-run and the audit log."""
        ...

    def apply(self, action: NodeAction, operation: Operation) -> ActionOutput:
        """Send the one changing call. Raises ``OutcomeUnknownError`` if it may or may not have run."""
        ...

    def unmet_checks(self, action: NodeAction, operation: Operation, facts: NodeFacts, *,
                     reason_prefix: str, incident_id: str) -> list[str]:
        """Post-checks the node does not (yet) satisfy; empty when the operation is complete."""
        ...

    def hung_job_command(self, job: HungJob) -> str:
        """The exact commands or API calls ``restart_hung_job`` may send, for dry-run and the audit log."""
        ...

    def hung_job_unmet(self, job: HungJob) -> list[str]:
        """Why the hung job is not yet restarted away from its excluded nodes; empty when it is (or
        when the scheduler no longer has it)."""
        ...

    def restart_hung_job(self, job: HungJob) -> ActionOutput:
        """Requeue it with the nodes excluded (Slurm) or delete its pods there (Kubernetes), sending
        only the steps its current state still needs."""
        ...
