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

The deciding lives beside it (``isolate``, ``rollback``), and so does the hung job's restart
(``requeue``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from denpex.isolation.adapter import ActionOutput
from denpex.isolation.approval import Approval
from denpex.isolation.audit import AuditKind, Outcome
from denpex.isolation.audit_store import check_extends_stored_copy, copy_audit_log, update_stored_copy
from denpex.isolation.errors import (
    ApprovalError,
    AuditChainError,
    AuditError,
    OutcomeUnknownError,
    RemoteError,
    StoreError,
)
from denpex.isolation.facts import NodeFacts
from denpex.isolation.hung_job_note import hung_job_notes
from denpex.isolation.plan import IsolationPlan, NodeAction, Operation
from denpex.isolation.run.context import Pending, RunContext, Tools
from denpex.isolation.run.isolate import decide_isolate, decide_isolate_node
from denpex.isolation.run.report import ExecutionReport, NodeDecision, NodeOutcome, RunMode
from denpex.isolation.run.requeue import requeue
from denpex.isolation.run.rollback import decide_rollback, decide_rollback_node

__all__ = ["Executor"]


@dataclass(frozen=True)
class Executor(Tools):
    """Runs plans against one cluster under the operator's ``policy`` (the fields are ``Tools``').

    It does not judge approvals: ``denpex.isolation.run.execute`` does, and is the one entry point
    for the CLI and the flow; it hands over the approval it accepted, whole.
    """

    def run(self, plan: IsolationPlan, *, mode: RunMode = RunMode.DRY_RUN,
            operation: Operation = Operation.ISOLATE, approved: Approval | None = None) -> ExecutionReport:
        """Dry-run or execute ``plan`` on the nodes ``approved`` names (a dry run: all of its nodes).

        EXECUTE needs the approval ``check_approval`` accepted (ApprovalError without one), verifies
        the audit chain, and that it extends the cluster's stored copy, before acting:
        AuditChainError; BusyError while another run holds the lock.
        """
        if mode is RunMode.DRY_RUN:
            approved = None
        elif approved is None:
            raise ApprovalError(f"plan {plan.content_hash()[:12]} cannot be executed without a checked "
                                "approval; nothing was done")
        run = RunContext.start(plan, operation=operation, approved=approved, mode=mode)
        actions = [a for a in plan.actions if approved is None or a.node in approved.nodes]
        work = self._requeue if operation is Operation.REQUEUE else self._run
        if mode is RunMode.DRY_RUN:
            return work(run, actions)
        with self.audit.run_lock():
            self.audit.verify()
            self._check_stored_copy(run)
            return work(run, actions)

    def _check_stored_copy(self, run: RunContext) -> None:
        """Refuse a log cut back, removed or replaced since the cluster's copy was stored, and say so
        in the log. The refusal is not copied: the stored copy stays the witness of what was cut."""
        if self.audit_store is None:
            return
        try:
            check_extends_stored_copy(self.audit, self.audit_store, self.cluster)
        except AuditChainError as exc:
            try:
                self.audit.append(run.entry(AuditKind.DECISION, action="refused", message=str(exc)[:2000]),
                                  at=self.clock())
            except AuditError:
                pass  # the refusal stands without its record; the raised error says why
            raise

    def _report(self, run: RunContext, **fields: object) -> ExecutionReport:
        return ExecutionReport.model_validate({
            "mode": run.mode, "operation": run.operation, "incident_id": run.plan.incident_id,
            "plan_hash": run.digest, "approver": run.approver, "nodes": [], **fields,
        })

    def _run(self, run: RunContext, actions: list[NodeAction]) -> ExecutionReport:
        recovered: list[str] = []
        if run.mode is RunMode.EXECUTE:
            recovered = self._recover(run)
        try:
            if run.operation is Operation.ISOLATE:
                pending, blocked, trip = decide_isolate(self, run, actions)
            else:
                pending, blocked, trip = decide_rollback(self, run, actions), [], None
        except RemoteError as exc:
            raise type(exc)(f"{exc}. The run stopped while reading the cluster, before changing any "
                            "node") from exc
        report = self._report(run, blocked=blocked, recovered=recovered)
        if run.mode is RunMode.DRY_RUN:
            report.nodes = [self._outcome(run, p) for p in pending]
            self._note_hung_job(run, report)
            return report
        if trip:
            self._trip(run, trip)
            report.breaker_tripped = True
        acted = False
        try:
            for index, item in enumerate(pending):
                if item.decision is NodeDecision.ACT and acted:
                    # The facts were read before the nodes ahead of this one were acted on and
                    # verified; a person may have drained it meanwhile. Read it again, right
                    # before the intent, so their drain is never overwritten or undone.
                    item = self._decide(run, item.action, self.adapter.node_facts(item.action.node))
                if item.decision is NodeDecision.ACT:
                    acted = True
                    report.nodes.append(self._act(run, item))
                else:
                    report.nodes.append(self._skip(run, item))
        except RemoteError as exc:
            raise self._interrupted(exc, run, report, pending[index:]) from exc
        finally:
            self._copy_audit(run, report)
        self._note_hung_job(run, report)
        return report

    def _requeue(self, run: RunContext, actions: list[NodeAction]) -> ExecutionReport:
        """The hung job's restart; executed, its records are copied like an isolation's."""
        report = self._report(run)
        if run.mode is RunMode.DRY_RUN:
            return requeue(self, run, actions, report)
        try:
            return requeue(self, run, actions, report)
        finally:
            self._copy_audit(run, report)

    def _decide(self, run: RunContext, action: NodeAction, facts: NodeFacts) -> Pending:
        if run.operation is Operation.ISOLATE:
            return decide_isolate_node(self, run, action, facts)
        return decide_rollback_node(self, run, action, facts)

    def _note_hung_job(self, run: RunContext, report: ExecutionReport) -> None:
        """The hung-job note, only when the facts read for this run show the job on an isolated node."""
        if run.operation is Operation.ISOLATE:
            plan = run.plan
            report.notes += hung_job_notes(plan.hung_job, [(n.node, n.state_after, n.running_jobs)
                                                           for n in report.nodes],
                                           scheduler=plan.scheduler, plan_hash=report.plan_hash,
                                           incident_id=plan.incident_id)

    def _copy_audit(self, run: RunContext, report: ExecutionReport) -> None:
        """Extend the cluster's copy, then the incident's. A failed copy is a warning, not a failed
        run: the records are in the log, and the next action checks it against the older copy."""
        if self.audit_store is not None:
            try:
                report.audit_copy = update_stored_copy(self.audit, self.audit_store, self.cluster)
            except (StoreError, AuditChainError) as exc:
                report.warnings.append(str(exc))
        if self.store is not None:
            try:
                copy_audit_log(self.audit, self.store, run.plan.incident_id)
            except (StoreError, AuditChainError) as exc:
                report.warnings.append(str(exc))

    def _interrupted(self, exc: RemoteError, run: RunContext, report: ExecutionReport,
                     rest: list[Pending]) -> RemoteError:
        """The same error, saying what the run had already done: "nothing happened" is not safe to assume."""
        first = run.plan.actions[0]
        verb = first.rollback.value if run.operation is Operation.ROLLBACK else first.action.value
        done = [f"{n.node} {n.outcome.value if n.outcome else n.decision.value}" for n in report.nodes]
        parts = [f"before this error: {', '.join(done) if done else 'no node was changed'}"]
        open_intents = {r.node for r in self.audit.pending_intents(run.digest, run.operation)}
        current, *unreached = [p.action.node for p in rest]
        if current in open_intents:
            parts.append(f"{verb} {current} was sent or about to be (the next run settles it from the "
                         "node's state)")
        else:
            unreached.insert(0, current)
        if unreached:
            parts.append(f"not reached: {', '.join(unreached)}")
        return type(exc)(f"{exc}. {'; '.join(parts)}. Every step is in the audit log {self.audit.path}")

    # -- acting --------------------------------------------------------------------------
    def _act(self, run: RunContext, item: Pending) -> NodeOutcome:
        action, operation = item.action, run.operation
        command = self.adapter.command_for(action, operation)
        intent = self.audit.append(
            run.node_entry(AuditKind.INTENT, action, command=command, state=item.facts.state,
                           running_jobs=item.facts.running_jobs, message=item.message),
            at=self.clock(),
        )
        if operation is Operation.ISOLATE:
            # Counted once sent, not once verified: a cordon whose evictions are held up, or a
            # drain whose answer was lost, still isolates the node, and the hourly limit is there
            # for a storm of exactly such half-finished isolations.
            self.breaker.record_isolation(cluster=self.cluster, node=action.node,
                                          incident_id=run.plan.incident_id, at=self.clock())
        output, notes = self._send_once(run, action)
        final = self.adapter.node_facts(action.node)
        unmet = self.unmet(run, action, operation, final)
        # Bounded by both the poll count and the clock: an injected sleep (tests) must not spin
        # for the whole timeout, and a slow node_facts must not stretch it either.
        deadline = time.monotonic() + self.verify_timeout_s
        polls = max(1, math.ceil(self.verify_timeout_s / self.poll_s))
        while unmet and polls > 0 and time.monotonic() < deadline:
            polls -= 1
            self.sleep(self.poll_s)
            final = self.adapter.node_facts(action.node)
            unmet = self.unmet(run, action, operation, final)
        outcome = Outcome.FAILED if unmet else Outcome.APPLIED
        if unmet:
            notes.append("post-checks not met: " + "; ".join(unmet))
        if output is not None and output.rc != 0 and not unmet:
            notes.append(f"rc {output.rc} but the state shows the {operation.value} took effect")
        message = " ".join([item.message, *notes]).strip()
        self.audit.append(
            run.node_entry(AuditKind.RESULT, action, command=command, rc=output.rc if output else None,
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

    def _send_once(self, run: RunContext, action: NodeAction) -> tuple[ActionOutput | None, list[str]]:
        """Send the changing call; after a drop, read the state before deciding to send again."""
        notes: list[str] = []
        for send in range(1, self.max_sends + 1):
            try:
                return self.adapter.apply(action, run.operation), notes
            except OutcomeUnknownError as exc:
                facts = self.adapter.node_facts(action.node)
                if not self.unmet(run, action, run.operation, facts):
                    notes.append(f"the connection dropped after send {send} ({exc}); the node's "
                                 "state shows it took effect, so it was not sent again")
                    return None, notes
                notes.append(f"the connection dropped on send {send} ({exc}) and the node does not "
                             "show the change; sending again")
                self.sleep(min(self.poll_s * 2**send, 5.0))
        notes.append(f"gave up after {self.max_sends} dropped sends")
        return None, notes

    def _skip(self, run: RunContext, item: Pending) -> NodeOutcome:
        outcome = Outcome.ALREADY_DONE if item.decision is NodeDecision.ALREADY_DONE else Outcome.BLOCKED
        command = self.adapter.command_for(item.action, run.operation)
        self.audit.append(
            run.node_entry(AuditKind.SKIP, item.action, command=command, outcome=outcome,
                           state=item.facts.state, running_jobs=item.facts.running_jobs, message=item.message),
            at=self.clock(),
        )
        return self._outcome(run, item, outcome, command=command)

    def _recover(self, run: RunContext) -> list[str]:
        """Resolve intents left without a result by reading each node's real state.

        Intents of both operations are settled: an isolation cut short and then rolled back
        would otherwise be judged later against the rolled-back state, and recorded as never
        having taken effect.
        """
        messages = []
        dangling = [i for op in Operation for i in self.audit.pending_intents(run.digest, op)]
        for intent in sorted(dangling, key=lambda record: record.seq):
            action = run.plan.action_for(intent.node) if intent.node else None
            if action is None:
                continue
            facts = self.adapter.node_facts(action.node)
            done = not self.unmet(run, action, intent.operation, facts)
            outcome = Outcome.RECOVERED_APPLIED if done else Outcome.RECOVERED_NOT_APPLIED
            message = (f"an earlier run stopped between intent seq {intent.seq} and its result; "
                       f"{action.node} shows {facts.state}, so the {intent.operation.value} "
                       f"{'took effect' if done else 'did not take effect'}; nothing was repeated blindly")
            self.audit.append(
                run.node_entry(AuditKind.RESULT, action, operation=intent.operation, command=intent.command,
                               outcome=outcome, intent_seq=intent.seq, state=facts.state,
                               running_jobs=facts.running_jobs, message=message),
                at=self.clock(),
            )
            messages.append(message)
        return messages

    def _trip(self, run: RunContext, reason: str) -> None:
        state = self.breaker.trip(reason=reason, incident_id=run.plan.incident_id, at=self.clock())
        self.audit.append(run.entry(AuditKind.BREAKER, message=f"circuit breaker tripped: {state.trip_reason}"),
                          at=self.clock())

    def _outcome(self, run: RunContext, item: Pending, outcome: Outcome | None = None, *,
                 command: str | None = None) -> NodeOutcome:
        return NodeOutcome(
            node=item.action.node, decision=item.decision,
            command=command if command is not None else self.adapter.command_for(item.action, run.operation),
            outcome=outcome,
            state_before=item.facts.state, state_after=item.facts.state,
            running_jobs=item.facts.running_jobs, message=item.message,
        )
