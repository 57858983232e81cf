"""The report as the Prefect UI shows it: markdown for the verdict and plan, rows for the table.

Pure text: the flow publishes it as artifacts and as the description beside the approval form.
"""

from __future__ import annotations

from typing import Any

from denpex.isolation.plan import IsolationPlan
from denpex.report import TriageReport, render_text

__all__ = ["report_markdown", "candidate_rows", "decision_markdown"]


def report_markdown(report: TriageReport, *, incident_id: str, cluster: str, plan: IsolationPlan | None,
                    chart: str = "") -> str:
    """Verdict and reasons, the proposed actions, and (when given) the chart's markdown."""
    lines = [f"# Incident {incident_id} on {cluster}: {report.verdict.value}", ""]
    if plan is not None and plan.actions:
        lines.append("**Proposed (needs approval):** "
                     + ", ".join(f"`{a.action.value}` **{a.node}**" for a in plan.actions))
        lines.append("")
        lines.append(f"Plan hash `{plan.content_hash()}`")
    else:
        lines.append("**No isolation proposed.**")
    for why in report.plan.blocked:
        lines.append(f"- blocked: {why}")
    lines += ["", "```text", render_text(report).rstrip(), "```"]
    if chart:
        lines += ["", chart]
    return "\n".join(lines) + "\n"


def candidate_rows(report: TriageReport, plan: IsolationPlan | None) -> list[dict[str, Any]]:
    """One row per candidate: rank, host, kind, where it stuck, confidence, planned action."""
    actions = {a.node: a.action.value for a in plan.actions} if plan else {}
    rows = []
    for c in report.candidates:
        rows.append({
            "rank": c.rank, "host": c.host or "", "kind": c.kind.value,
            "process_group": c.process_group or "", "collective_seq_id": c.collective_seq_id,
            "confidence": round(c.confidence, 2),
            "hardware": "; ".join(h.summary for h in c.hardware)[:200],
            "planned_action": actions.get(c.host or "", "none"),
        })
    return rows


def decision_markdown(incident_id: str, outcome: str, reason: str) -> str:
    """Why the plan was or was not carried out."""
    return f"# Incident {incident_id}: {outcome}\n\n{reason}\n"
