"""Issue 8 item 5 on the real Slurm lab: a rollback undoes only what Denpex did."""

from __future__ import annotations

import pytest

from denpex.isolation.audit import Outcome
from denpex.isolation.executor import NodeDecision
from denpex.isolation.plan import Operation
from denpex.isolation.slurm import SlurmAdapter
from lab.rig import Rig, drained, reason_of, xid79

pytestmark = pytest.mark.slow


def test_a_node_that_went_down_after_our_drain_is_not_resumed(rig: Rig) -> None:
    node = "gpu-node-003"
    plan = rig.plan(xid79(node))
    assert rig.execute(plan).nodes[0].outcome is Outcome.APPLIED
    ours = reason_of(rig.lab, node).split(" [", 1)[0]
    # The node fails after Denpex drained it; the reason (and who set it) stays Denpex's.
    rig.lab.run(["scontrol", "update", f"NodeName={node}", "State=DOWN", f"Reason={ours}"])
    assert "DOWN" in rig.lab.state_of(node)
    sent_before = rig.lab.update_rpc_count(node)

    back = rig.execute(plan, operation=Operation.ROLLBACK)
    [outcome] = back.nodes
    assert outcome.decision is NodeDecision.BLOCKED
    assert "would also clear a DOWN that Denpex never set" in outcome.message
    assert "DOWN" in rig.lab.state_of(node) and rig.lab.update_rpc_count(node) == sent_before


def test_our_reason_text_set_by_another_user_is_not_ours(rig: Rig) -> None:
    node = "gpu-node-004"
    plan = rig.plan(xid79(node))
    assert rig.execute(plan).nodes[0].outcome is Outcome.APPLIED
    assert reason_of(rig.lab, node).endswith("]") and "[root@" in reason_of(rig.lab, node)
    # Seen by a Denpex that acts as user "denpex", the drain Slurm says root set is someone else's,
    # whatever its text: it is never resumed.
    as_denpex = SlurmAdapter(rig.adapter.runner, backoff=rig.adapter.backoff, actor="denpex")
    assert not as_denpex.node_facts(node).owner("denpex", "inc-lab").value == "this_incident"
    refused = rig.execute(plan, operation=Operation.ROLLBACK, adapter=as_denpex)
    assert refused.nodes[0].decision is NodeDecision.BLOCKED and "someone else" in refused.nodes[0].message
    assert drained(rig.lab, node)
    # The user that did drain it may undo it.
    back = rig.execute(plan, operation=Operation.ROLLBACK)
    assert back.nodes[0].outcome is Outcome.APPLIED and not drained(rig.lab, node)
