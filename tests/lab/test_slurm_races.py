"""The world moves while a run acts: a second run, a person draining a node, an incident growing.

Each case injects the other actor at an exact instant (``Hooked``: right before a given command
goes out over the real SSH connection) and checks what the real Slurm shows afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from denpex.isolation.audit import AuditKind, Outcome
from denpex.isolation.errors import BusyError
from denpex.isolation.run.report import NodeDecision
from denpex.isolation.plan import Gate, Operation
from denpex.isolation.policy import IsolationPolicy, SafetyLimits
from denpex.isolation.ssh import CommandRunner, SshSettings
from isolation.trust import signed
from lab.rig import Hooked, drained, reason_of, rig_for, xid79, xid79_on
from testkit.services.slurm import SlurmLab

pytestmark = pytest.mark.slow

ROOMY = IsolationPolicy(limits=SafetyLimits(max_isolated_fraction=0.5))
"""Room for a few drains out of 16 nodes, so the share limit does not hide what is tested."""


def sends(verb: str, node: str | None = None) -> Callable[[Sequence[str]], bool]:
    """Picks the changing command ``State=<verb>`` (for ``node``, when given)."""

    def pick(argv: Sequence[str]) -> bool:
        return f"State={verb}" in argv and (node is None or f"NodeName={node}" in argv)
    return pick


def test_a_second_run_while_one_is_acting_is_refused_and_nothing_is_sent_twice(
    lab: SlurmLab, ssh_settings: SshSettings, tmp_path: Path
) -> None:
    node = "gpu-node-011"
    sent_before = lab.update_rpc_count(node)
    second: dict[str, object] = {}

    def start_second_run() -> None:
        # Someone starts the same approved plan again while the first run has written its
        # intent and is about to send the drain.
        with rig_for(lab, ssh_settings, tmp_path) as other:
            try:
                second["report"] = other.execute(plan, approval=approval)
            except BusyError as exc:
                second["error"] = exc

    def wrap(runner: CommandRunner) -> CommandRunner:
        return Hooked(runner, sends("DRAIN"), start_second_run)

    with rig_for(lab, ssh_settings, tmp_path, wrap=wrap) as rig:
        plan = rig.plan(xid79(node))
        approval = signed(plan)
        report = rig.execute(plan, approval=approval)

    assert lab.update_rpc_count(node) - sent_before == 1, [(r.kind, r.outcome, r.intent_seq) for r in rig.audit.records()]
    assert "report" not in second, second
    assert "another run" in str(second["error"]) and str(rig.audit.path) in str(second["error"])
    assert report.nodes[0].outcome is Outcome.APPLIED
    assert lab.update_rpc_count(node) - sent_before == 1
    records = rig.audit.records()
    assert [(r.kind, r.intent_seq) for r in records] == [(AuditKind.INTENT, None), (AuditKind.RESULT, 1)]


@pytest.mark.parametrize("operation", [Operation.ISOLATE, Operation.ROLLBACK], ids=["drain", "resume"])
def test_a_drain_a_person_places_during_the_run_is_never_overwritten_or_undone(
    lab: SlurmLab, ssh_settings: SshSettings, tmp_path: Path, operation: Operation
) -> None:
    first, second = "gpu-node-012", "gpu-node-013"
    verb = "DRAIN" if operation is Operation.ISOLATE else "RESUME"

    def person_drains_second() -> None:
        lab.run(["scontrol", "update", f"NodeName={second}", "State=DRAIN", "Reason=bad DIMM, ticket 881"])

    def wrap(runner: CommandRunner) -> CommandRunner:
        return Hooked(runner, sends(verb, first), person_drains_second)

    with rig_for(lab, ssh_settings, tmp_path / "setup") as setup:
        plan = setup.plan(xid79_on([first, second]), policy=ROOMY)
        assert [a.node for a in plan.actions] == [first, second]
        if operation is Operation.ROLLBACK:
            assert all(n.outcome is Outcome.APPLIED for n in setup.execute(plan).nodes)
    with rig_for(lab, ssh_settings, tmp_path, wrap=wrap) as rig:
        report = rig.execute(plan, operation=operation)

    by_node = {n.node: n for n in report.nodes}
    assert by_node[first].outcome is Outcome.APPLIED
    assert (by_node[second].decision, by_node[second].outcome) == (NodeDecision.BLOCKED, Outcome.BLOCKED)
    assert "bad DIMM, ticket 881" in by_node[second].message
    assert drained(lab, second) and reason_of(lab, second).startswith("bad DIMM, ticket 881 [root@")


def test_a_later_plan_of_the_same_incident_cannot_exceed_the_per_incident_limit(
    lab: SlurmLab, ssh_settings: SshSettings, tmp_path: Path
) -> None:
    first, second = "gpu-node-014", "gpu-node-015"
    one_per_incident = IsolationPolicy(limits=SafetyLimits(max_nodes_per_incident=1, max_isolated_fraction=0.5))
    with rig_for(lab, ssh_settings, tmp_path) as rig:
        assert rig.execute(rig.plan(xid79(first), policy=one_per_incident)).nodes[0].outcome is Outcome.APPLIED

        # Re-triage of the same incident implicates another node.
        live = rig.plan(xid79(second), policy=one_per_incident)
        assert live.actions == () and [b.gate for b in live.blocked] == [Gate.CIRCUIT_BREAKER]
        assert f"2 nodes ({first}, {second}) is over the limit of 1 per incident" in (live.breaker_trip or "")

        offline = rig.plan(xid79(second), policy=one_per_incident, live_facts=False)
        report = rig.execute(offline)
    assert report.nodes[0].decision is NodeDecision.BLOCKED and report.breaker_tripped
    assert not drained(lab, second) and drained(lab, first)
