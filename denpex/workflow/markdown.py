"""The report as the Prefect UI shows it: markdown for the verdict and plan, rows for the table.

Pure text: the flow publishes it as artifacts and as the description beside the approval form.
"""

from __future__ import annotations

from typing import Any

from denpex.isolation.plan import IsolationPlan
from denpex.markdown_text import code_block, inline
from denpex.report import TriageReport, render_text

__all__ = ["report_markdown", "candidate_rows", "decision_markdown"]


def report_markdown(report: TriageReport, *, incident_id: str, cluster: str, plan: IsolationPlan | None,
                    chart: str = "") -> str:
    """Verdict and reasons, the proposed actions, and (when given) the chart's markdown."""
    lines = [f"# Incident {inline(incident_id)} on {inline(cluster)}: {report.verdict.value}", ""]
    if plan is not None and plan.actions:
        lines.append("**Proposed (needs approval):** "
                     + ", ".join(f"`{a.action.value}` **{inline(a.node)}**" for a in plan.actions))
        lines.append("")
        lines.append(f"Plan hash `{plan.content_hash()}`")
    else:
        lines.append("**No isolation proposed.**")
    for why in report.plan.blocked:
        lines.append(f"- blocked: {inline(why)}")
    # The text report quotes evidence strings (hosts, group descriptions, reasons) as they came:
    # a fence they cannot close keeps them literal.
    lines += ["", code_block(render_text(report).rstrip())]
    if chart:
        lines += ["", chart]
    return "\n".join(lines) + "\n"


def candidate_rows(report: TriageReport, plan: IsolationPlan | None) -> list[dict[str, Any]]:
    """One row per candidate: rank, host, kind, where it stuck, confidence, planned action."""
    actions = {a.node: a.action.value for a in plan.actions} if plan else {}
    rows = []
    for c in report.candidates:
        rows.append({
            "rank": c.rank, "host": inline(c.host or "", limit=200), "kind": c.kind.value,
            "process_group": inline(c.process_group or "", limit=200), "collective_seq_id": c.collective_seq_id,
            "confidence": round(c.confidence, 2),
            "hardware": inline("; ".join(h.summary for h in c.hardware), limit=200),
            "planned_action": actions.get(c.host or "", "none"),
        })
    return rows


def decision_markdown(incident_id: str, outcome: str, reason: str) -> str:
    """Why the plan was or was not carried out."""
    return f"# Incident {inline(incident_id)}: {inline(outcome)}\n\n{inline(reason, limit=4000)}\n"
