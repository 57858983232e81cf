"""An execution report as people read it (``denpex isolate``'s text), and what it left undone.

    render_execution(report)      -> "ISOLATE dry_run for incident inc-7, plan 3f9a1c0b2d4e\\n  gpu-node-002: act\\n..."
    unfinished_summary(plan, report) -> None when every node is (a dry run: would be) as wanted, else
                                        "would not isolate every planned node: gpu-node-002"
"""

from __future__ import annotations

from denpex.isolation.run.report import ExecutionReport, NodeDecision, RunMode
from denpex.isolation.plan import IsolationPlan, Operation

__all__ = ["render_execution", "unfinished_summary"]


def render_execution(report: ExecutionReport) -> str:
    """Plain text, one block per node, most important line first."""
    verb = "WOULD" if report.mode is RunMode.DRY_RUN else "DID"
    lines = [f"{report.operation.value.upper()} {report.mode.value} for incident {report.incident_id}, "
             f"plan {report.plan_hash[:12]}" + (f", approved by {report.approver}" if report.approver else "")]
    lines += [f"  recovered: {m}" for m in report.recovered]
    lines += [f"  blocked: {b}" for b in report.blocked]
    if report.breaker_tripped:
        lines.append("  the circuit breaker is now TRIPPED; reset it with `denpex breaker reset --by NAME`")
    for node in report.nodes:
        head = f"  {node.node}: {node.decision.value}"
        if node.outcome is not None:
            head += f" -> {node.outcome.value}"
        lines.append(head)
        if node.decision is NodeDecision.ACT:
            lines.append(f"      {verb} run: {node.command}")
        lines.append(f"      state: {node.state_before}" + (
            f" -> {node.state_after}" if node.state_after != node.state_before else ""))
        if node.running_jobs:
            lines.append(f"      still running: {', '.join(node.running_jobs)}")
        if node.message:
            lines.append(f"      {node.message}")
    if not report.nodes:
        lines.append("  no node to act on")
    if report.audit_copy:
        lines.append(f"  audit log copied to {report.audit_copy}")
    lines += [f"  warning: {w}" for w in report.warnings]
    lines += [f"  note: {n}" for n in report.notes]
    return "\n".join(lines) + "\n"


def unfinished_summary(plan: IsolationPlan, report: ExecutionReport) -> str | None:
    """One line naming what is not in the wanted state after ``report``; None when everything is."""
    if report.operation is Operation.ISOLATE and not plan.actions:
        return "the plan isolates no node: " + ("; ".join(b.message for b in plan.blocked) or "it has no action")
    if report.operation is Operation.REQUEUE and not report.nodes:
        return "no hung job was restarted: " + "; ".join(report.blocked)
    if not report.unfinished:
        return None
    verb = "would not" if report.mode is RunMode.DRY_RUN else "did not"
    what = {Operation.ISOLATE: "isolate", Operation.ROLLBACK: "roll back",
            Operation.REQUEUE: "restart the hung job on"}[report.operation]
    return f"{verb} {what} every planned node: {', '.join(report.unfinished)}"
