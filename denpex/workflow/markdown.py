"""The report as the Prefect UI shows it: markdown for the verdict, the candidates and the plan.

Pure text: the flow publishes it as artifacts and as the description beside the approval form.
"""

from __future__ import annotations

from collections.abc import Sequence

from denpex.analysis.models import Candidate, HardwareBearing
from denpex.evidence.stacks import StackFrame
from denpex.isolation.plan import IsolationPlan
from denpex.markdown_text import code_block, folded, inline
from denpex.report import STACK_FRAMES_SHOWN, TriageReport, majority_stack, render_text

__all__ = ["REPORT_COLUMNS", "report_markdown", "approval_markdown", "candidates_table", "decision_markdown",
           "group_lines"]

# The approval dialog is about 470 px wide: a few short lines, the rest a link away.
MAX_CULPRITS_BESIDE_FORM = 3
_WHY_LIMIT = 160
# Prefect's artifact page shows a code block about 96 columns wide at 1400 px (its panel beside
# the report takes the rest) and cuts longer lines; the report's text is folded to fit.
REPORT_COLUMNS = 88


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
    lines += candidates_table(report, plan)
    # The text report quotes evidence strings (hosts, group descriptions, reasons) as they came:
    # a fence they cannot close keeps them literal.
    lines += ["", code_block(folded(render_text(report).rstrip(), REPORT_COLUMNS))]
    lines += _full_stacks(report)
    if chart:
        lines += ["", chart]
    return "\n".join(lines) + "\n"


MAX_GROUPS_SHOWN = 12
MAX_FULL_STACKS = 3


def _full_stacks(report: TriageReport) -> list[str]:
    """Every frame of the first culprits' stacks (the text report shows the innermost user frames):
    fenced, since the paths and function names come from the job."""
    lines: list[str] = []
    for c in [c for c in report.candidates if c.stack is not None][:MAX_FULL_STACKS]:
        assert c.stack is not None
        frames = c.stack.all_frames or c.stack.frames
        body = "\n".join(f"{f.file}:{f.line} {f.function}()" for f in frames)
        lines += ["", f"**Full stack of rank {c.rank}** ({c.stack.source.value}, thread "
                      f"{inline(c.stack.thread or '?', limit=100)}, innermost first):", "",
                  code_block(folded(body, REPORT_COLUMNS))]
    return lines


def _short_stack(frames: Sequence[StackFrame]) -> str:
    return inline(" ← ".join(f.short() for f in frames[:STACK_FRAMES_SHOWN - 1]), limit=_WHY_LIMIT)


def _stack_brief(report: TriageReport, c: Candidate) -> list[str]:
    """The culprit's short stack and its peers', one line each, escaped (frames come from the job)."""
    if c.stack is None:
        return []
    lines = [f"  - **Stack:** {_short_stack(c.stack.frames)} ({c.stack.source.value})"]
    majority = majority_stack(report, c.rank)
    if majority is not None:
        ranks = ", ".join(str(r) for r in majority.ranks[:8]) + (" …" if len(majority.ranks) > 8 else "")
        lines.append(f"  - **Peers' stack:** {_short_stack(majority.frames)} (ranks {ranks})")
    return lines


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


def approval_markdown(report: TriageReport, *, incident_id: str, cluster: str, plan: IsolationPlan,
                      approvers: Sequence[str], code_needed: bool, report_link: str | None, charts: str = "",
                      on_page: bool = False) -> str:
    """What the approval dialog shows above the form, essentials first and short: the action and
    node, the culprit, the one-line why, the hardware evidence, who may approve; the full report
    a link away; then the charts (``charts``, markdown drawn for the dialog's width)::

        **Incident inc-7 on lab: localized**
        - **Proposed:** `drain` **gpu-node-003**
        - **Culprit:** rank 2 on gpu-node-003 (not_entered, confidence 0.90)
        - **Why:** rank 3 waits in process group '2' ...: rank 2 never enqueued it
        - **Hardware:** Xid 79 (GPU has fallen off the bus) ... consistent with a hardware fault
        - **Who may approve:** alice, carol, each with their authenticator code
        - **Plan:** `7db66f1cdeb4` (the form carries the full hash) · [full report](URL)
    """
    lines = [f"**Incident {inline(incident_id)} on {inline(cluster)}: {report.verdict.value}**", ""]
    lines.append("- **Proposed:** " + ", ".join(f"`{a.action.value}` **{inline(a.node)}**" for a in plan.actions))
    for c in report.candidates[:MAX_CULPRITS_BESIDE_FORM]:
        on = f" on {inline(c.host, limit=100)}" if c.host else ""
        lines.append(f"- **Culprit:** rank {c.rank}{on} ({c.kind.value}, confidence {c.confidence:.2f})")
        if c.reasons:
            lines.append(f"  - **Why:** {inline(c.reasons[0], limit=_WHY_LIMIT)}")
        # What makes the culprit's node a guess belongs beside the form, not only in the report.
        derived = next((r for r in c.reasons if c.host and r.startswith(f"host {c.host} is derived")), None)
        if derived:
            lines.append(f"  - **Host:** {inline(derived, limit=_WHY_LIMIT)}")
        signals = [h.summary for h in c.hardware if h.bearing is not HardwareBearing.UNRELATED]
        lines.append(f"  - **Hardware:** {inline(signals[0], limit=_WHY_LIMIT) if signals else 'no signal on its node'}"
                     + (f" (and {len(signals) - 1} more)" if len(signals) > 1 else ""))
        lines += _stack_brief(report, c)
    more = len(report.candidates) - MAX_CULPRITS_BESIDE_FORM
    if more > 0:
        lines.append(f"- {more} more candidate{'s' if more != 1 else ''} in the full report")
    if approvers:
        who = ", ".join(inline(n, limit=60) for n in approvers)
        who += ", each with their authenticator code" if code_needed else ""
        who += " on the approval page" if on_page else ""
    else:
        who = "nobody: the runbook names no approver for this tenant and cluster, so every answer is refused"
    lines.append(f"- **Who may approve:** {who}")
    link = f" · [full report]({report_link})" if report_link else " · full report: the run's Artifacts tab"
    carried = "the page signs the decision for" if on_page else "the form carries"
    lines.append(f"- **Plan:** `{plan.content_hash()[:12]}` ({carried} the full hash){link}")
    if charts:
        lines += ["", charts]
    return "\n".join(lines) + "\n"


MAX_CANDIDATES_IN_TABLE = 32


def candidates_table(report: TriageReport, plan: IsolationPlan | None) -> list[str]:
    """One row per candidate, narrow enough for the artifact page at 1400 px: rank, host, kind,
    where it stuck, confidence, planned action. Hardware and reasons are in the text below."""
    if not report.candidates:
        return []
    actions = {a.node: a.action.value for a in plan.actions} if plan else {}
    lines = ["", "**Candidates:**", "", "| rank | host | kind | stuck at | confidence | planned action |",
             "|---:|---|---|---|---:|---|"]
    for c in report.candidates[:MAX_CANDIDATES_IN_TABLE]:
        where = (f"group {inline(c.process_group, limit=24)} #{c.collective_seq_id}"
                 if c.process_group and c.collective_seq_id is not None else inline(c.process_group or "", limit=24))
        action = actions.get(c.host or "", "none")
        lines.append(f"| {c.rank} | {inline(c.host or '', limit=40)} | {c.kind.value} | {where} "
                     f"| {c.confidence:.2f} | {action} |")
    more = len(report.candidates) - MAX_CANDIDATES_IN_TABLE
    if more > 0:
        lines.append(f"\n… and {more} more (the run's JSON report lists them all)")
    return lines


def decision_markdown(incident_id: str, outcome: str, reason: str) -> str:
    """Why the plan was or was not carried out."""
    return f"# Incident {inline(incident_id)}: {inline(outcome)}\n\n{inline(reason, limit=4000)}\n"
