"""Slurm adapter: ``scontrol`` and ``squeue`` on a controller or login node.

Commands are argv lists; the runner quotes them (``shlex.join``) for the remote shell. Quirks
handled here (Slurm 22.05, see the real-services notes):
- ``Node X not found`` comes on stdout with rc 1: that is a fact (``exists=False``), not an error;
- DRAIN never kills jobs: a busy node shows ``MIXED+DRAIN``/``ALLOCATED+DRAIN`` and its jobs run on;
- RESUME on a node that is not drained fails (rc 1), so it is only sent to a node we drained;
- RESUME on a node without slurmd removes the drain but still returns rc 1, and a resumed node
  shows ``IDLE+NOT_RESPONDING`` for a few seconds: success is read from the state, not the rc;
- while slurmctld cannot be reached (restart, fail-over, a busy controller) the clients fail with
  rc 1: reads, and changes that never reached it, are run again with the SSH backoff; a change
  that may have reached it raises ``OutcomeUnknownError`` so the node is read before any resend.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable

from denpex.isolation.adapter import ActionOutput
from denpex.isolation.errors import CommandFailedError, OutcomeUnknownError, TransientRemoteError
from denpex.isolation.facts import ClusterFacts, NodeFacts, ReasonOwner, owned_reason_prefix
from denpex.isolation.plan import HungJob, NodeAction, Operation, utc_now
from denpex.isolation.policy import Scheduler
from denpex.isolation.slurm_parse import (
    ControllerFault,
    SlurmJob,
    controller_fault,
    job_not_found,
    node_not_found,
    parse_show_job,
    parse_cluster_name,
    parse_job_ids,
    parse_jobs_by_node,
    parse_show_node,
    to_node_facts,
)
from denpex.isolation.slurm_layout import SlurmJobLayout, parse_job_layout
from denpex.isolation.ssh import Backoff, CommandResult, CommandRunner

__all__ = ["SlurmAdapter", "drain_argv", "resume_argv"]


def drain_argv(action: NodeAction) -> list[str]:
    """``["scontrol", "update", "NodeName=gpu-node-002", "State=DRAIN", "Reason=denpex:inc-1 ..."]``."""
    return ["scontrol", "update", f"NodeName={action.node}", "State=DRAIN", f"Reason={action.reason}"]


def resume_argv(action: NodeAction) -> list[str]:
    return ["scontrol", "update", f"NodeName={action.node}", "State=RESUME"]


class SlurmAdapter:
    """Reads and changes Slurm node state through a ``CommandRunner`` (normally ``SshRunner``)."""

    scheduler = Scheduler.SLURM

    def __init__(self, runner: CommandRunner, *, opt_out_feature: str = "denpex_opt_out",
                 backoff: Backoff = Backoff(), sleep: Callable[[float], None] = time.sleep,
                 actor: str | None = None) -> None:
        self.runner = runner
        self.actor = actor
        """The user Slurm records for our drains (the SSH user); a drain by another user is not ours."""
        self.opt_out_feature = opt_out_feature
        self.backoff = backoff
        """Waits between attempts while slurmctld cannot be reached (normally the SSH settings')."""
        self._sleep = sleep

    def cluster_name(self) -> str | None:
        return parse_cluster_name(self._read(["scontrol", "show", "config"]).stdout)

    def cluster_facts(self) -> ClusterFacts:
        shown = self._read(["scontrol", "-o", "show", "node"])
        jobs = parse_jobs_by_node(
            self._read(["squeue", "-h", "-t", "RUNNING,COMPLETING", "-o", "%i %N"]).stdout
        )
        nodes = {
            n.name: to_node_facts(n, jobs.get(n.name, ()), self.opt_out_feature, self.actor)
            for n in parse_show_node(shown.stdout)
        }
        return ClusterFacts(nodes=nodes, collected_at=utc_now())

    def node_facts(self, node: str) -> NodeFacts:
        shown = self._run(["scontrol", "-o", "show", "node", node])
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
        return to_node_facts(matches[0], jobs, self.opt_out_feature, self.actor)

    def command_for(self, action: NodeAction, operation: Operation) -> str:
        return shlex.join(self._argv(action, operation))

    def apply(self, action: NodeAction, operation: Operation) -> ActionOutput:
        result = self._run(self._argv(action, operation), changes_state=True)
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

    # -- the hung job ---------------------------------------------------------------------
    def hung_job_command(self, job: HungJob) -> str:
        hold, update, release = _requeue_argvs(job, ())
        return "; ".join(shlex.join(argv) for argv in (hold, update, release))

    def hung_job_unmet(self, job: HungJob) -> list[str]:
        found = self._job(job.job_id)
        if found is None:
            return []
        unmet = []
        still = sorted(set(found.active_on) & set(job.exclude_nodes))
        if still:
            unmet.append(f"job {job.job_id} still {found.state.lower()} on {', '.join(still)}")
        missing = sorted(set(job.exclude_nodes) - set(found.excluded))
        if missing:
            unmet.append(f"job {job.job_id} does not exclude {', '.join(missing)} (ExcNodeList "
                         f"{','.join(found.excluded) or 'empty'})")
        if found.held:
            unmet.append(f"job {job.job_id} is held ({found.reason})")
        return unmet

    def restart_hung_job(self, job: HungJob) -> ActionOutput:
        """``scontrol requeuehold`` (a running job's ExcNodeList cannot change), ``update
        ExcNodeList``, ``release``: each only when the job's state still needs it."""
        current = self._job(job.job_id)
        if current is None:
            return ActionOutput(command=self.hung_job_command(job), rc=0,
                                output=f"job {job.job_id} is no longer known to Slurm; nothing to requeue")
        outputs = []
        for argv in _requeue_steps(job, current):
            result = _require_ok(self._run(argv, changes_state=True))
            outputs.append(f"{result.command}: rc {result.rc}{' ' + result.output.strip() if result.output.strip() else ''}")
        return ActionOutput(command=self.hung_job_command(job), rc=0,
                            output="; ".join(outputs) or f"job {job.job_id}: nothing left to do")

    def job_layout(self, job_id: str) -> SlurmJobLayout | None:
        """The job's nodes and task count (``scontrol -o show job -d``); None when Slurm has no such job."""
        shown = self._run(["scontrol", "-o", "show", "job", "-d", job_id])
        if shown.rc != 0 and job_not_found(shown.output):
            return None
        _require_ok(shown)
        return parse_job_layout(shown.stdout)

    def _job(self, job_id: str) -> SlurmJob | None:
        shown = self._run(["scontrol", "-o", "show", "job", job_id])
        if shown.rc != 0 and job_not_found(shown.output):
            return None
        _require_ok(shown)
        return parse_show_job(shown.stdout)

    @staticmethod
    def _argv(action: NodeAction, operation: Operation) -> list[str]:
        return drain_argv(action) if operation is Operation.ISOLATE else resume_argv(action)

    def _read(self, argv: list[str]) -> CommandResult:
        return _require_ok(self._run(argv))

    def _run(self, argv: list[str], *, changes_state: bool = False) -> CommandResult:
        """Run ``argv``, again with backoff while slurmctld cannot be reached.

        A change is only sent again when it never reached slurmctld; when it may have, this
        raises ``OutcomeUnknownError`` and the executor reads the node before any resend.
        """
        delays = iter(self.backoff.delays())
        while True:
            result = self.runner.run(argv, changes_state=changes_state)
            fault = controller_fault(result.stderr) if result.rc != 0 else None
            if fault is None:
                return result
            said = result.stderr.strip().splitlines()[-1]
            if changes_state and fault is ControllerFault.UNANSWERED:
                raise OutcomeUnknownError(
                    f"{result.command}: slurmctld did not answer ({said}); the update may or may not "
                    "have been applied; read the node's state before sending it again"
                )
            delay = next(delays, None)
            if delay is None:
                raise TransientRemoteError(
                    f"{result.command}: slurmctld could not be reached after {self.backoff.attempts} "
                    f"attempts ({said}); check `scontrol ping` on the controller, then run again"
                )
            self._sleep(delay)


def _requeue_argvs(job: HungJob, already_excluded: tuple[str, ...]) -> tuple[list[str], list[str], list[str]]:
    excluded = sorted(set(job.exclude_nodes) | set(already_excluded))
    return (["scontrol", "requeuehold", job.job_id],
            ["scontrol", "update", f"JobId={job.job_id}", f"ExcNodeList={','.join(excluded)}"],
            ["scontrol", "release", job.job_id])


def _requeue_steps(job: HungJob, current: SlurmJob) -> list[list[str]]:
    """The steps the job's state still needs, in order.

    The requeue holds the job, so that nothing starts it again before its ExcNodeList is set (a
    running job's ExcNodeList cannot change); the release lets it be scheduled elsewhere.
    """
    hold, update, release = _requeue_argvs(job, current.excluded)
    steps = []
    held = current.held
    if set(current.active_on) & set(job.exclude_nodes):
        steps.append(hold)
        held = True
    if set(job.exclude_nodes) - set(current.excluded):
        steps.append(update)
    if held:
        steps.append(release)
    return steps


def _require_ok(result: CommandResult) -> CommandResult:
    if result.rc != 0:
        raise CommandFailedError(f"{result.command} failed with rc {result.rc}: {result.output[:500]}")
    return result
