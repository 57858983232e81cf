"""Deciding an isolation on live facts: each node's gate, then the blast radius over all of them."""

from __future__ import annotations

from datetime import timedelta

from denpex.isolation.facts import ClusterFacts, NodeFacts, ReasonOwner
from denpex.isolation.gates import blast_radius_gate, node_gate
from denpex.isolation.plan import NodeAction, Operation
from denpex.isolation.run.context import Pending, RunContext, Tools, jobs_note
from denpex.isolation.run.report import NodeDecision

__all__ = ["decide_isolate", "decide_isolate_node"]


def decide_isolate(tools: Tools, run: RunContext,
                   actions: list[NodeAction]) -> tuple[list[Pending], list[str], str | None]:
    """Each node's decision, the blast-radius refusal (if any) and the breaker's trip reason (if any)."""
    plan, policy = run.plan, tools.policy
    cluster = tools.adapter.cluster_facts()
    pending = [decide_isolate_node(tools, run, action, tools.adapter.node_facts(action.node))
               for action in actions]
    to_act = [p.action.node for p in pending if p.decision is NodeDecision.ACT]
    current = {**cluster.nodes, **{p.action.node: p.facts for p in pending}}
    ours = [name for name, facts in current.items()
            if facts.owner(policy.reason_prefix, plan.incident_id) is ReasonOwner.THIS_INCIDENT]
    breaker = tools.breaker.state()
    # This incident finishing its own earlier attempt on a node is not a new isolation.
    recent = [m.node for m in breaker.isolations_since(tools.cluster, tools.clock() - timedelta(hours=1))
              if not (m.incident_id == plan.incident_id and m.node in to_act)]
    radius = blast_radius_gate(to_act, cluster, policy.limits, breaker, incident_nodes=ours,
                               recent_on_cluster=recent)
    if not radius.blocked:
        return pending, [], plan.breaker_trip
    message = radius.blocked[0].message
    pending = [
        Pending(p.action, p.facts, NodeDecision.BLOCKED, message) if p.decision is NodeDecision.ACT else p
        for p in pending
    ]
    return pending, [message], radius.trip_reason or plan.breaker_trip


def decide_isolate_node(tools: Tools, run: RunContext, action: NodeAction, facts: NodeFacts) -> Pending:
    """One node's decision on its own facts (the blast radius is judged over all nodes)."""
    view = ClusterFacts(nodes={action.node: facts})
    block = node_gate(action.node, view, tools.policy.limits, tools.policy.reason_prefix, run.plan.incident_id)
    if block is not None:
        return Pending(action, facts, NodeDecision.BLOCKED, block.message)
    if not tools.unmet(run, action, Operation.ISOLATE, facts):
        return Pending(action, facts, NodeDecision.ALREADY_DONE,
                       f"{action.node} already shows {facts.state} under this incident")
    return Pending(action, facts, NodeDecision.ACT, jobs_note(facts, Operation.ISOLATE))
