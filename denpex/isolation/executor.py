"""Carry out an approved plan: re-check on live facts, act once per node, verify, audit.

Stages of one run (each audited in EXECUTE mode)::

    approval check -> run lock -> the log verifies and extends the cluster's stored copy ->
    recover dangling intents -> read facts -> gates again (node, blast radius) -> per node: read
    it again -> intent -> one changing call -> read state until the post-checks pass -> result
    -> extend the cluster's stored copy (and the incident's copy in the evidence store)

The run lock (one executing run per audit log) keeps a second run from taking the first one's
fresh intent for a crash's leftover and sending the command again. Each node is read again right
before its intent, because acting on the nodes ahead of it takes time in which a person may drain
it; what is left is the moment between that read and the send, which ``scontrol`` cannot close.

DRY_RUN performs every read and every gate and stops before the first write: no command that
changes a node, no audit record, no breaker trip.

Idempotence: a node already in the wanted state under this incident is skipped, so a second run
is a no-op. When the connection drops after a changing call was sent, the node's state is read
and the call is only repeated when the state shows it did not take effect.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from denpex.evidence.store import EvidenceStore
from denpex.isolation.adapter import ActionOutput, ClusterAdapter
from denpex.isolation.audit import AuditEntry, AuditKind, AuditLog, Outcome
from denpex.isolation.audit_store import check_extends_stored_copy, copy_audit_log, update_stored_copy
from denpex.isolation.breaker import CircuitBreaker
from denpex.isolation.errors import AuditChainError, AuditError, OutcomeUnknownError, RemoteError, StoreError
from denpex.isolation.facts import ClusterFacts, NodeFacts, ReasonOwner
from denpex.isolation.gates import blast_radius_gate, node_gate
from denpex.isolation.hung_job_note import hung_job_notes
from denpex.isolation.plan import HungJob, IsolationPlan, NodeAction, Operation, utc_now
from denpex.isolation.policy import IsolationPolicy

__all__ = ["RunMode", "NodeDecision", "NodeOutcome", "ExecutionReport", "Executor"]


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


@dataclass(frozen=True)
class _Pending:
    action: NodeAction
    facts: NodeFacts
    decision: NodeDecision
    message: str = ""


@dataclass
class Executor:
    """Runs plans against one cluster under the operator's ``policy``. Dependencies are passed in;
    nothing is global.

    It does not judge approvals: ``denpex.isolation.execute.execute_approved`` does, and is the one
    entry point for the CLI and the flow. ``cluster`` names the cluster for the per-cluster rate
    limit and its stored copy of the audit log in ``audit_store``; ``store`` (the evidence store)
    gets the incident's copy.
    """

    adapter: ClusterAdapter
    audit: AuditLog
    breaker: CircuitBreaker
    policy: IsolationPolicy
    cluster: str
    store: EvidenceStore | None = None
    audit_store: EvidenceStore | None = None
    clock: Callable[[], datetime] = utc_now
    sleep: Callable[[float], None] = time.sleep
    verify_timeout_s: float = 20.0
    poll_s: float = 0.2
    max_sends: int = 3

    def run(
        self,
        plan: IsolationPlan,
        *,
        mode: RunMode = RunMode.DRY_RUN,
        operation: Operation = Operation.ISOLATE,
        approver: str | None = None,
        nodes: Collection[str] | None = None,
    ) -> ExecutionReport:
        """Dry-run or execute ``plan`` on ``nodes`` (default: all of its nodes), already approved by
        ``approver``. EXECUTE verifies the audit chain, and that it extends the cluster's stored
        copy, before acting: AuditChainError; BusyError while another run holds the lock."""
        actions = [a for a in plan.actions if nodes is None or a.node in nodes]
        work = self._requeue if operation is Operation.REQUEUE else self._run
        if mode is RunMode.DRY_RUN:
            return work(plan, actions, mode, operation, None)
        with self.audit.run_lock():
            self.audit.verify()
            self._check_stored_copy(plan, operation, approver)
            return work(plan, actions, mode, operation, approver)

    def _check_stored_copy(self, plan: IsolationPlan, operation: Operation, approver: str | None) -> None:
        """Refuse a log cut back, removed or replaced since the cluster's copy was stored, and say so
        in the log. The refusal is not copied: the stored copy stays the witness of what was cut."""
        if self.audit_store is None:
            return
        try:
            check_extends_stored_copy(self.audit, self.audit_store, self.cluster)
        except AuditChainError as exc:
            entry = AuditEntry(kind=AuditKind.DECISION, incident_id=plan.incident_id,
                               plan_hash=plan.content_hash(), operation=operation, approver=approver,
                               action="refused", message=str(exc)[:2000])
            try:
                self.audit.append(entry, at=self.clock())
            except AuditError:
                pass  # the refusal stands without its record; the raised error says why
            raise

    def _run(self, plan: IsolationPlan, actions: list[NodeAction], mode: RunMode, operation: Operation,
             approver: str | None) -> ExecutionReport:
        digest = plan.content_hash()
        recovered: list[str] = []
        if mode is RunMode.EXECUTE:
            recovered = self._recover(plan, digest, approver)
        try:
            if operation is Operation.ISOLATE:
                pending, blocked, trip = self._decide_isolate(plan, actions)
            else:
                pending, blocked, trip = self._decide_rollback(plan, actions), [], None
        except RemoteError as exc:
            raise type(exc)(f"{exc}. The run stopped while reading the cluster, before changing any "
                            "node") from exc
        report = ExecutionReport(
            mode=mode, operation=operation, incident_id=plan.incident_id, plan_hash=digest,
            approver=approver, nodes=[], blocked=blocked, recovered=recovered,
        )
        if mode is RunMode.DRY_RUN:
            report.nodes = [self._outcome(p, operation) for p in pending]
            self._note_hung_job(plan, operation, report)
            return report
        if trip:
            self._trip(plan, digest, operation, approver, trip)
            report.breaker_tripped = True
        acted = False
        try:
            for index, item in enumerate(pending):
                if item.decision is NodeDecision.ACT and acted:
                    # The facts were read before the nodes ahead of this one were acted on and
                    # verified; a person may have drained it meanwhile. Read it again, right
                    # before the intent, so their drain is never overwritten or undone.
                    item = self._decide(plan, operation, item.action, self.adapter.node_facts(item.action.node))
                if item.decision is NodeDecision.ACT:
                    acted = True
                    report.nodes.append(self._act(plan, digest, operation, approver, item))
                else:
                    report.nodes.append(self._skip(plan, digest, operation, approver, item))
        except RemoteError as exc:
            raise self._interrupted(exc, plan, digest, operation, report, pending[index:]) from exc
        finally:
            self._copy_audit(plan, report)
        self._note_hung_job(plan, operation, report)
        return report

    def _note_hung_job(self, plan: IsolationPlan, operation: Operation, report: ExecutionReport) -> None:
        """The hung-job note, only when the facts read for this run show the job on an isolated node."""
        if operation is Operation.ISOLATE:
            report.notes += hung_job_notes(plan.hung_job, [(n.node, n.state_after, n.running_jobs)
                                                           for n in report.nodes],
                                           scheduler=plan.scheduler, plan_hash=report.plan_hash,
                                           incident_id=plan.incident_id)

    def _copy_audit(self, plan: IsolationPlan, report: ExecutionReport) -> None:
        """Extend the cluster's copy, then the incident's. A failed copy is a warning, not a failed
        run: the records are in the log, and the next action checks it against the older copy."""
        if self.audit_store is not None:
            try:
                report.audit_copy = update_stored_copy(self.audit, self.audit_store, self.cluster)
            except (StoreError, AuditChainError) as exc:
                report.warnings.append(str(exc))
        if self.store is not None:
            try:
                copy_audit_log(self.audit, self.store, plan.incident_id)
            except (StoreError, AuditChainError) as exc:
                report.warnings.append(str(exc))

    def _requeue(self, plan: IsolationPlan, actions: list[NodeAction], mode: RunMode, operation: Operation,
                 approver: str | None) -> ExecutionReport:
        """Restart the hung job away from the isolated nodes: intent, the steps its state still
        needs, read until it shows the change, result. A second run finds it done and skips.
        Executed, its records are copied to the evidence store like an isolation's."""
        digest = plan.content_hash()
        report = ExecutionReport(mode=mode, operation=operation, incident_id=plan.incident_id,
                                 plan_hash=digest, approver=approver, nodes=[])
        if mode is RunMode.DRY_RUN:
            return self._restart_job(plan, digest, actions, mode, approver, report)
        try:
            return self._restart_job(plan, digest, actions, mode, approver, report)
        finally:
            self._copy_audit(plan, report)

    def _restart_job(self, plan: IsolationPlan, digest: str, actions: list[NodeAction], mode: RunMode,
                     approver: str | None, report: ExecutionReport) -> ExecutionReport:
        job = plan.hung_job
        if job is None:
            report.blocked.append("the plan offers no hung-job action (no job id, or no node isolated)")
            return report
        job = job.model_copy(update={"exclude_nodes": tuple(n for n in job.exclude_nodes
                                                             if n in {a.node for a in actions})})
        if not job.exclude_nodes:
            report.blocked.append("none of the hung job's nodes is approved")
            return report
        if mode is RunMode.EXECUTE:
            report.recovered = self._recover_requeue(plan, digest, approver, job)
        command = self.adapter.hung_job_command(job)
        what = f"job {job.job_id}"
        unmet = self.adapter.hung_job_unmet(job)
        decision = NodeDecision.ACT if unmet else NodeDecision.ALREADY_DONE
        if mode is RunMode.DRY_RUN or not unmet:
            note = "; ".join(unmet) or f"{what} no longer runs on {', '.join(job.exclude_nodes)} and excludes them"
            outcome = None if mode is RunMode.DRY_RUN else Outcome.ALREADY_DONE
            if outcome is not None:
                self.audit.append(self._job_entry(plan, digest, approver, AuditKind.SKIP, command=command,
                                                  outcome=outcome, message=note), at=self.clock())
            report.nodes.append(NodeOutcome(node=what, decision=decision, command=command, outcome=outcome,
                                            message=note))
            return report
        intent = self.audit.append(self._job_entry(plan, digest, approver, AuditKind.INTENT, command=command,
                                                   message="; ".join(unmet)), at=self.clock())
        output: ActionOutput | None = None
        notes: list[str] = []
        try:
            output = self.adapter.restart_hung_job(job)
        except OutcomeUnknownError as exc:
            notes.append(f"the answer was lost ({exc}); judged from the job's state")
        deadline = time.monotonic() + self.verify_timeout_s
        unmet = self.adapter.hung_job_unmet(job)
        while unmet and time.monotonic() < deadline:
            self.sleep(self.poll_s)
            unmet = self.adapter.hung_job_unmet(job)
        outcome = Outcome.FAILED if unmet else Outcome.APPLIED
        if unmet:
            notes.append("post-checks not met: " + "; ".join(unmet))
        message = " ".join(notes)
        self.audit.append(self._job_entry(plan, digest, approver, AuditKind.RESULT, command=command,
                                          rc=output.rc if output else None,
                                          output=output.output if output else None, outcome=outcome,
                                          intent_seq=intent.seq, message=message), at=self.clock())
        report.nodes.append(NodeOutcome(node=what, decision=NodeDecision.ACT, command=command, outcome=outcome,
                                        rc=output.rc if output else None,
                                        output=output.output if output else "", message=message))
        return report

    def _recover_requeue(self, plan: IsolationPlan, digest: str, approver: str | None, job: HungJob) -> list[str]:
        """Give each requeue intent left without a result (a run died between its steps) the result
        the job's state shows; the steps still needed are then taken as usual, never blindly."""
        messages = []
        for intent in self.audit.pending_intents(digest, Operation.REQUEUE):
            unmet = self.adapter.hung_job_unmet(job)
            outcome = Outcome.RECOVERED_NOT_APPLIED if unmet else Outcome.RECOVERED_APPLIED
            shows = f"still needs: {'; '.join(unmet)}" if unmet else "shows the restart completed"
            message = (f"an earlier run stopped between intent seq {intent.seq} and its result; job "
                       f"{job.job_id} {shows}; nothing was repeated blindly")
            self.audit.append(self._job_entry(plan, digest, approver, AuditKind.RESULT, command=intent.command,
                                              outcome=outcome, intent_seq=intent.seq, message=message),
                              at=self.clock())
            messages.append(message)
        return messages

    @staticmethod
    def _job_entry(plan: IsolationPlan, digest: str, approver: str | None, kind: AuditKind,
                   **fields: object) -> AuditEntry:
        return AuditEntry.model_validate({
            "kind": kind, "incident_id": plan.incident_id, "plan_hash": digest,
            "operation": Operation.REQUEUE, "approver": approver, "node": None, "action": "requeue",
            **fields,
        })

    def _interrupted(self, exc: RemoteError, plan: IsolationPlan, digest: str, operation: Operation,
                     report: ExecutionReport, rest: list[_Pending]) -> RemoteError:
        """The same error, saying what the run had already done: "nothing happened" is not safe to assume."""
        first = plan.actions[0]
        verb = first.rollback.value if operation is Operation.ROLLBACK else first.action.value
        done = [f"{n.node} {n.outcome.value if n.outcome else n.decision.value}" for n in report.nodes]
        parts = [f"before this error: {', '.join(done) if done else 'no node was changed'}"]
        open_intents = {r.node for r in self.audit.pending_intents(digest, operation)}
        current, *unreached = [p.action.node for p in rest]
        if current in open_intents:
            parts.append(f"{verb} {current} was sent or about to be (the next run settles it from the "
                         "node's state)")
        else:
            unreached.insert(0, current)
        if unreached:
            parts.append(f"not reached: {', '.join(unreached)}")
        return type(exc)(f"{exc}. {'; '.join(parts)}. Every step is in the audit log {self.audit.path}")

    # -- deciding on live facts ----------------------------------------------------------
    def _decide_isolate(self, plan: IsolationPlan,
                        actions: list[NodeAction]) -> tuple[list[_Pending], list[str], str | None]:
        policy = self.policy
        cluster = self.adapter.cluster_facts()
        pending = [self._decide(plan, Operation.ISOLATE, action, self.adapter.node_facts(action.node))
                   for action in actions]
        to_act = [p.action.node for p in pending if p.decision is NodeDecision.ACT]
        current = {**cluster.nodes, **{p.action.node: p.facts for p in pending}}
        ours = [name for name, facts in current.items()
                if facts.owner(policy.reason_prefix, plan.incident_id) is ReasonOwner.THIS_INCIDENT]
        breaker = self.breaker.state()
        # This incident finishing its own earlier attempt on a node is not a new isolation.
        recent = [m.node for m in breaker.isolations_since(self.cluster, self.clock() - timedelta(hours=1))
                  if not (m.incident_id == plan.incident_id and m.node in to_act)]
        radius = blast_radius_gate(to_act, cluster, policy.limits, breaker, incident_nodes=ours,
                                   recent_on_cluster=recent)
        if not radius.blocked:
            return pending, [], plan.breaker_trip
        message = radius.blocked[0].message
        pending = [
            _Pending(p.action, p.facts, NodeDecision.BLOCKED, message) if p.decision is NodeDecision.ACT else p
            for p in pending
        ]
        return pending, [message], radius.trip_reason or plan.breaker_trip

    def _decide_rollback(self, plan: IsolationPlan, actions: list[NodeAction]) -> list[_Pending]:
        return [self._decide(plan, Operation.ROLLBACK, action, self.adapter.node_facts(action.node))
                for action in actions]

    def _decide(self, plan: IsolationPlan, operation: Operation, action: NodeAction,
                facts: NodeFacts) -> _Pending:
        """One node's decision on its own facts (the blast radius is judged over all nodes)."""
        if operation is Operation.ISOLATE:
            view = ClusterFacts(nodes={action.node: facts})
            block = node_gate(action.node, view, self.policy.limits, self.policy.reason_prefix, plan.incident_id)
            if block is not None:
                return _Pending(action, facts, NodeDecision.BLOCKED, block.message)
            if not self._unmet(plan, action, operation, facts):
                return _Pending(action, facts, NodeDecision.ALREADY_DONE,
                                f"{action.node} already shows {facts.state} under this incident")
            return _Pending(action, facts, NodeDecision.ACT, _jobs_note(facts, operation))
        owner = facts.owner(self.policy.reason_prefix, plan.incident_id)
        if not facts.exists:
            return _Pending(action, facts, NodeDecision.BLOCKED, f"{action.node} is not known to the scheduler")
        if owner is ReasonOwner.THIS_INCIDENT and facts.down:
            # RESUME clears DOWN as well as DRAIN: a node that went down after our drain would be
            # handed back to the scheduler with a fault Denpex never judged.
            return _Pending(action, facts, NodeDecision.BLOCKED,
                            f"{action.node} went down after Denpex isolated it ({facts.state}); resuming it "
                            "would also clear a DOWN that Denpex never set, so a person must look")
        if owner is ReasonOwner.THIS_INCIDENT:
            return _Pending(action, facts, NodeDecision.ACT, _jobs_note(facts, operation))
        if owner is ReasonOwner.NONE and self._unmet(plan, action, operation, facts):
            # A person uncordoned the node; our taint and marks remain and would keep it from
            # ever being isolated again. Removing only those is the rest of the undo.
            return _Pending(action, facts, NodeDecision.ACT,
                            f"{action.node} is schedulable again, but Denpex's marks remain: removing them")
        if owner is ReasonOwner.NONE:
            return _Pending(action, facts, NodeDecision.ALREADY_DONE,
                            f"{action.node} is not isolated ({facts.state}); nothing to undo")
        return _Pending(
            action, facts, NodeDecision.BLOCKED,
            f"{action.node} is now isolated by someone else (reason {facts.reason!r}); "
            "Denpex never undoes an isolation it does not own",
        )

    # -- acting --------------------------------------------------------------------------
    def _act(self, plan: IsolationPlan, digest: str, operation: Operation, approver: str | None,
             item: _Pending) -> NodeOutcome:
        action = item.action
        command = self.adapter.command_for(action, operation)
        intent = self.audit.append(
            self._entry(plan, digest, operation, approver, AuditKind.INTENT, action,
                        command=command, state=item.facts.state,
                        running_jobs=item.facts.running_jobs, message=item.message),
            at=self.clock(),
        )
        if operation is Operation.ISOLATE:
            # Counted once sent, not once verified: a cordon whose evictions are held up, or a
            # drain whose answer was lost, still isolates the node, and the hourly limit is there
            # for a storm of exactly such half-finished isolations.
            self.breaker.record_isolation(cluster=self.cluster, node=action.node,
                                          incident_id=plan.incident_id, at=self.clock())
        output, notes = self._send_once(plan, action, operation)
        final = self.adapter.node_facts(action.node)
        unmet = self._unmet(plan, action, operation, final)
        # Bounded by both the poll count and the clock: an injected sleep (tests) must not spin
        # for the whole timeout, and a slow node_facts must not stretch it either.
        deadline = time.monotonic() + self.verify_timeout_s
        polls = max(1, math.ceil(self.verify_timeout_s / self.poll_s))
        while unmet and polls > 0 and time.monotonic() < deadline:
            polls -= 1
            self.sleep(self.poll_s)
            final = self.adapter.node_facts(action.node)
            unmet = self._unmet(plan, action, operation, final)
        outcome = Outcome.FAILED if unmet else Outcome.APPLIED
        if unmet:
            notes.append("post-checks not met: " + "; ".join(unmet))
        if output is not None and output.rc != 0 and not unmet:
            notes.append(f"rc {output.rc} but the state shows the {operation.value} took effect")
        message = " ".join([item.message, *notes]).strip()
        self.audit.append(
            self._entry(plan, digest, operation, approver, AuditKind.RESULT, action,
                        command=command, rc=output.rc if output else None,
                        output=output.output if output else None, outcome=outcome,
                        intent_seq=intent.seq, state=final.state,
                        running_jobs=final.running_jobs, message=message),
            at=self.clock(),
        )
        return NodeOutcome(
            node=action.node, decision=NodeDecision.ACT, command=command, outcome=outcome,
            rc=output.rc if output else None, output=output.output if output else "",
            state_before=item.facts.state, state_after=final.state,
            running_jobs=final.running_jobs, message=message,
        )

    def _send_once(self, plan: IsolationPlan, action: NodeAction,
                   operation: Operation) -> tuple[ActionOutput | None, list[str]]:
        """Send the changing call; after a drop, read the state before deciding to send again."""
        notes: list[str] = []
        for send in range(1, self.max_sends + 1):
            try:
                return self.adapter.apply(action, operation), notes
            except OutcomeUnknownError as exc:
                facts = self.adapter.node_facts(action.node)
                if not self._unmet(plan, action, operation, facts):
                    notes.append(f"the connection dropped after send {send} ({exc}); the node's "
                                 "state shows it took effect, so it was not sent again")
                    return None, notes
                notes.append(f"the connection dropped on send {send} ({exc}) and the node does not "
                             "show the change; sending again")
                self.sleep(min(self.poll_s * 2**send, 5.0))
        notes.append(f"gave up after {self.max_sends} dropped sends")
        return None, notes

    def _skip(self, plan: IsolationPlan, digest: str, operation: Operation, approver: str | None,
              item: _Pending) -> NodeOutcome:
        outcome = Outcome.ALREADY_DONE if item.decision is NodeDecision.ALREADY_DONE else Outcome.BLOCKED
        command = self.adapter.command_for(item.action, operation)
        self.audit.append(
            self._entry(plan, digest, operation, approver, AuditKind.SKIP, item.action,
                        command=command, outcome=outcome, state=item.facts.state,
                        running_jobs=item.facts.running_jobs, message=item.message),
            at=self.clock(),
        )
        return self._outcome(item, operation, outcome)

    def _recover(self, plan: IsolationPlan, digest: str, approver: str | None) -> list[str]:
        """Resolve intents left without a result by reading each node's real state.

        Intents of both operations are settled: an isolation cut short and then rolled back
        would otherwise be judged later against the rolled-back state, and recorded as never
        having taken effect.
        """
        messages = []
        dangling = [i for op in Operation for i in self.audit.pending_intents(digest, op)]
        for intent in sorted(dangling, key=lambda record: record.seq):
            action = plan.action_for(intent.node) if intent.node else None
            if action is None:
                continue
            facts = self.adapter.node_facts(action.node)
            done = not self._unmet(plan, action, intent.operation, facts)
            outcome = Outcome.RECOVERED_APPLIED if done else Outcome.RECOVERED_NOT_APPLIED
            message = (f"an earlier run stopped between intent seq {intent.seq} and its result; "
                       f"{action.node} shows {facts.state}, so the {intent.operation.value} "
                       f"{'took effect' if done else 'did not take effect'}; nothing was repeated blindly")
            self.audit.append(
                self._entry(plan, digest, intent.operation, approver, AuditKind.RESULT, action,
                            command=intent.command, outcome=outcome, intent_seq=intent.seq,
                            state=facts.state, running_jobs=facts.running_jobs, message=message),
                at=self.clock(),
            )
            messages.append(message)
        return messages

    def _trip(self, plan: IsolationPlan, digest: str, operation: Operation, approver: str | None,
              reason: str) -> None:
        state = self.breaker.trip(reason=reason, incident_id=plan.incident_id, at=self.clock())
        self.audit.append(
            AuditEntry(kind=AuditKind.BREAKER, incident_id=plan.incident_id, plan_hash=digest,
                       operation=operation, approver=approver,
                       message=f"circuit breaker tripped: {state.trip_reason}"),
            at=self.clock(),
        )

    # -- helpers -------------------------------------------------------------------------
    def _unmet(self, plan: IsolationPlan, action: NodeAction, operation: Operation,
               facts: NodeFacts) -> list[str]:
        return self.adapter.unmet_checks(action, operation, facts,
                                         reason_prefix=self.policy.reason_prefix,
                                         incident_id=plan.incident_id)

    def _outcome(self, item: _Pending, operation: Operation, outcome: Outcome | None = None) -> NodeOutcome:
        return NodeOutcome(
            node=item.action.node, decision=item.decision,
            command=self.adapter.command_for(item.action, operation), outcome=outcome,
            state_before=item.facts.state, state_after=item.facts.state,
            running_jobs=item.facts.running_jobs, message=item.message,
        )

    @staticmethod
    def _entry(plan: IsolationPlan, digest: str, operation: Operation, approver: str | None,
               kind: AuditKind, action: NodeAction, **fields: object) -> AuditEntry:
        what = action.action.value if operation is Operation.ISOLATE else action.rollback.value
        return AuditEntry.model_validate({
            "kind": kind, "incident_id": plan.incident_id, "plan_hash": digest,
            "operation": operation, "approver": approver, "node": action.node, "action": what,
            **fields,
        })


def _jobs_note(facts: NodeFacts, operation: Operation) -> str:
    if not facts.running_jobs:
        return f"no job is running on {facts.name}"
    note = f"{len(facts.running_jobs)} job(s) running on {facts.name}: {', '.join(facts.running_jobs)}"
    if operation is Operation.ISOLATE:
        note += "; they keep running to completion, no new work is placed there"
    return note
