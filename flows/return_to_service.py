"""Return to service: undo an incident's isolation (Slurm RESUME / uncordon), approved the same way.

The plan is the one the triage flow saved for the incident; a rollback needs its own approval
(operation ``rollback``), and the executor only undoes isolations this incident owns.
"""

# No `from __future__ import annotations`: see flows/triage.py.

from typing import Any

from prefect import flow

from denpex.isolation.plan import IsolationPlan, Operation
from flows.follow_up import approve_then_run
from tasks.options import NOT_PERSISTED

__all__ = ["return_to_service"]


@flow(name="denpex-return-to-service", **NOT_PERSISTED)
def return_to_service(cluster: str, incident_id: str) -> dict[str, Any]:
    """Pause for approval of the rollback, then resume the incident's nodes."""

    def describe(plan: IsolationPlan) -> str:
        nodes = ", ".join(a.node for a in plan.actions)
        return (f"# Return to service: incident {incident_id} on {cluster}\n\n"
                f"Undo `{plan.actions[0].rollback.value if plan.actions else 'nothing'}` on **{nodes}** "
                f"(only where this incident's isolation is still in place).\n\nPlan hash `{plan.content_hash()}`\n")

    return approve_then_run(cluster, incident_id, Operation.ROLLBACK, describe)
