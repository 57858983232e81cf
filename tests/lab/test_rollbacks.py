"""Issue 8 item 5 on the real Slurm lab: a rollback undoes only what Denpex did."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from denpex.cli import app
from denpex.isolation.audit import Outcome
from denpex.isolation.run.report import NodeDecision
from denpex.isolation.plan import Operation, save_plan
from denpex.isolation.slurm import SlurmAdapter
from denpex.isolation.ssh import SshSettings
from isolation.trust import key_file
from lab.rig import Rig, drained, reason_of, xid79
from lab.test_isolation_trust import settings_file

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


def test_the_cli_judges_ownership_by_the_configured_slurm_user(rig: Rig, ssh_settings: SshSettings,
                                                                tmp_path: Path) -> None:
    node = "gpu-node-005"
    plan_path = tmp_path / "plan.json"
    plan = rig.plan(xid79(node))
    save_plan(plan, plan_path)
    assert rig.execute(plan).nodes[0].outcome is Outcome.APPLIED  # drained as root
    runner = CliRunner()
    assert runner.invoke(app, ["approve", str(plan_path), "--approver", "bob", "--key", key_file("bob"),
                               "--operation", "rollback"]).exit_code == 0
    # Commands run through sudo would be recorded as another user than the SSH one: say which.
    as_denpex = settings_file(tmp_path / "s.yaml", ssh_settings, tmp_path / "state", slurm_user="denpex")
    refused = runner.invoke(app, ["isolate", str(plan_path), "--execute", "--rollback", "--config", str(as_denpex)])
    assert refused.exit_code == 4 and f"{node} blocked" in refused.stderr and drained(rig.lab, node)
    as_root = settings_file(tmp_path / "s.yaml", ssh_settings, tmp_path / "state", slurm_user="root")
    back = runner.invoke(app, ["isolate", str(plan_path), "--execute", "--rollback", "--config", str(as_root)])
    assert back.exit_code == 0, back.output
    assert not drained(rig.lab, node)
