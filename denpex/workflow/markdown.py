"""The report as the Prefect UI shows it: markdown for the verdict and plan, rows for the table.

Pure text: the flow publishes it as artifacts and as the description beside the approval form.
"""

from __future__ import annotations

from typing import Any

from denpex.isolation.plan import IsolationPlan
from denpex.markdown_text import code_block, inline
from denpex.report import TriageReport, render_text

__all__ = ["report_markdown", "candidate_rows", "decision_markdown", "group_lines"]


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
    lines += group_lines(report)
    # The text report quotes evidence strings (hosts, group descriptions, reasons) as they came:
    # a fence they cannot close keeps them literal.
    lines += ["", code_block(render_text(report).rstrip())]
    if chart:
        lines += ["", chart]
    return "\n".join(lines) + "\n"


MAX_GROUPS_SHOWN = 12


def group_lines(report: TriageReport) -> list[str]:
    """One verdict per stuck group, as markdown; group names and descriptions come from the
    dumps, so they are escaped."""
    if not report.groups:
        return []
    descs = {s.process_group: s.group_desc for s in report.stuck if s.group_desc}
    lines = ["", "**Verdict per stuck group:**", ""]
    for group in report.groups[:MAX_GROUPS_SHOWN]:
        desc = descs.get(group.process_group)
        name = inline(group.process_group, limit=200) + (f" ({inline(desc, limit=200)})" if desc else "")
        at = (f"collective #{group.collective_seq_id}" if group.collective_seq_id is not None
              else f"p2p\\_seq\\_id {group.p2p_seq_id}")
        ranks = ", ".join(str(r) for r in group.candidates[:16]) + (" …" if len(group.candidates) > 16 else "")
        lines.append(f"- group {name}, {at}: **{group.verdict.value}**, ranks {ranks}")
    if len(report.groups) > MAX_GROUPS_SHOWN:
        lines.append(f"- … and {len(report.groups) - MAX_GROUPS_SHOWN} more")
    return lines


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
