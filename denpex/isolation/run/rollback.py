"""Deciding a rollback on live facts: undo only what this incident owns, and only while it is safe.

RESUME (Slurm) clears DOWN as well as DRAIN, and an uncordon hands the node back: a node this
incident no longer owns, or one that went down after it was isolated, is left for a person.
"""

from __future__ import annotations

from denpex.isolation.facts import NodeFacts, ReasonOwner
from denpex.isolation.plan import NodeAction, Operation
from denpex.isolation.run.context import Pending, RunContext, Tools, jobs_note
from denpex.isolation.run.report import NodeDecision

__all__ = ["decide_rollback", "decide_rollback_node"]


def decide_rollback(tools: Tools, run: RunContext, actions: list[NodeAction]) -> list[Pending]:
    """Each node's decision on its own facts; a rollback has no blast radius."""
    return [decide_rollback_node(tools, run, action, tools.adapter.node_facts(action.node)) for action in actions]


def decide_rollback_node(tools: Tools, run: RunContext, action: NodeAction, facts: NodeFacts) -> Pending:
    """Act on a node this incident isolated (or whose marks it left); skip one already handed back."""
    owner = facts.owner(tools.policy.reason_prefix, run.plan.incident_id)
    if not facts.exists:
        return Pending(action, facts, NodeDecision.BLOCKED, f"{action.node} is not known to the scheduler")
    if owner is ReasonOwner.THIS_INCIDENT and facts.down:
        # RESUME clears DOWN as well as DRAIN: a node that went down after our drain would be
        # handed back to the scheduler with a fault Denpex never judged.
        return Pending(action, facts, NodeDecision.BLOCKED,
                       f"{action.node} went down after Denpex isolated it ({facts.state}); resuming it "
                       "would also clear a DOWN that Denpex never set, so a person must look")
    if owner is ReasonOwner.THIS_INCIDENT:
        return Pending(action, facts, NodeDecision.ACT, jobs_note(facts, Operation.ROLLBACK))
    if owner is ReasonOwner.NONE and tools.unmet(run, action, Operation.ROLLBACK, facts):
        # A person uncordoned the node; our taint and marks remain and would keep it from
        # ever being isolated again. Removing only those is the rest of the undo.
        return Pending(action, facts, NodeDecision.ACT,
                       f"{action.node} is schedulable again, but Denpex's marks remain: removing them")
    if owner is ReasonOwner.NONE:
        return Pending(action, facts, NodeDecision.ALREADY_DONE,
                       f"{action.node} is not isolated ({facts.state}); nothing to undo")
    return Pending(
        action, facts, NodeDecision.BLOCKED,
        f"{action.node} is now isolated by someone else (reason {facts.reason!r}); "
        "Denpex never undoes an isolation it does not own",
    )
