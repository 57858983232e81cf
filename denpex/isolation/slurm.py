"""Slurm adapter: ``scontrol`` and ``squeue`` on a controller or login node.

Commands are argv lists; the runner quotes them (``shlex.join``) for the remote shell. Quirks
handled here (Slurm 22.05, see the real-services notes):
- ``Node X not found`` comes on stdout with rc 1: that is a fact (``exists=False``), not an error;
- DRAIN never kills jobs: a busy node shows ``MIXED+DRAIN``/``ALLOCATED+DRAIN`` and its jobs run on;
- RESUME on a node that is not drained fails (rc 1), so it is only sent to a node we drained;
- RESUME on a node without slurmd removes the drain but still returns rc 1, and a resumed node
  shows ``IDLE+NOT_RESPONDING`` for a few seconds: success is read from the state, not the rc.
"""

from __future__ import annotations

import shlex

from denpex.isolation.adapter import ActionOutput
from denpex.isolation.errors import CommandFailedError
from denpex.isolation.facts import ClusterFacts, NodeFacts, ReasonOwner, owned_reason_prefix
from denpex.isolation.plan import NodeAction, Operation, utc_now
from denpex.isolation.policy import Scheduler
from denpex.isolation.slurm_parse import (
    node_not_found,
    parse_cluster_name,
    parse_job_ids,
    parse_jobs_by_node,
    parse_show_node,
    to_node_facts,
)
from denpex.isolation.ssh import CommandResult, CommandRunner

__all__ = ["SlurmAdapter", "drain_argv", "resume_argv"]


def drain_argv(action: NodeAction) -> list[str]:
    """``["scontrol", "update", "NodeName=gpu-node-002", "State=DRAIN", "Reason=denpex:inc-1 ..."]``."""
    return ["scontrol", "update", f"NodeName={action.node}", "State=DRAIN", f"Reason={action.reason}"]


def resume_argv(action: NodeAction) -> list[str]:
    return ["scontrol", "update", f"NodeName={action.node}", "State=RESUME"]


class SlurmAdapter:
    """Reads and changes Slurm node state through a ``CommandRunner`` (normally ``SshRunner``)."""

    scheduler = Scheduler.SLURM

    def __init__(self, runner: CommandRunner, *, opt_out_feature: str = "denpex_opt_out") -> None:
        self.runner = runner
        self.opt_out_feature = opt_out_feature

    def cluster_name(self) -> str | None:
        return parse_cluster_name(self._read(["scontrol", "show", "config"]).stdout)

    def cluster_facts(self) -> ClusterFacts:
        shown = self._read(["scontrol", "-o", "show", "node"])
        jobs = parse_jobs_by_node(
            self._read(["squeue", "-h", "-t", "RUNNING,COMPLETING", "-o", "%i %N"]).stdout
        )
        nodes = {
            n.name: to_node_facts(n, jobs.get(n.name, ()), self.opt_out_feature)
            for n in parse_show_node(shown.stdout)
        }
        return ClusterFacts(nodes=nodes, collected_at=utc_now())

    def node_facts(self, node: str) -> NodeFacts:
        shown = self.runner.run(["scontrol", "-o", "show", "node", node])
        if shown.rc != 0 and node_not_found(shown.output):
            return NodeFacts(name=node, exists=False)
        _require_ok(shown)
        matches = [n for n in parse_show_node(shown.stdout) if n.name == node]
        if len(matches) != 1:
            raise CommandFailedError(
                f"{shown.command}: expected one record for {node}, got {len(matches)}; output: "
                f"{shown.output[:300]!r}"
            )
        jobs = parse_job_ids(self._read(["squeue", "-h", "-w", node, "-o", "%i"]).stdout)
        return to_node_facts(matches[0], jobs, self.opt_out_feature)

    def command_for(self, action: NodeAction, operation: Operation) -> str:
        return shlex.join(self._argv(action, operation))

    def apply(self, action: NodeAction, operation: Operation) -> ActionOutput:
        result = self.runner.run(self._argv(action, operation), changes_state=True)
        return ActionOutput(command=result.command, rc=result.rc, output=result.output)

    def unmet_checks(self, action: NodeAction, operation: Operation, facts: NodeFacts, *,
                     reason_prefix: str, incident_id: str) -> list[str]:
        owner = facts.owner(reason_prefix, incident_id)
        if operation is Operation.ROLLBACK:
            return [f"{facts.name} still shows {facts.state}"] if facts.isolated else []
        unmet = []
        if not facts.exists:
            unmet.append(f"{facts.name} is not known to Slurm")
        elif "DRAIN" not in facts.state.split("+"):
            unmet.append(f"{facts.name} shows {facts.state or 'no state'}, not DRAIN")
        if facts.exists and owner is not ReasonOwner.THIS_INCIDENT:
            unmet.append(f"{facts.name} reason is {facts.reason!r}, not "
                         f"{owned_reason_prefix(reason_prefix, incident_id)}")
        return unmet

    @staticmethod
    def _argv(action: NodeAction, operation: Operation) -> list[str]:
        return drain_argv(action) if operation is Operation.ISOLATE else resume_argv(action)

    def _read(self, argv: list[str]) -> CommandResult:
        return _require_ok(self.runner.run(argv))


def _require_ok(result: CommandResult) -> CommandResult:
    if result.rc != 0:
        raise CommandFailedError(f"{result.command} failed with rc {result.rc}: {result.output[:500]}")
    return result
