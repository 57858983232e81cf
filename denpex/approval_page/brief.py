"""What the approval page shows for one paused run, saved by the flow's worker in the state
directory before it pauses (never read back from Prefect artifacts, which any API user can
rewrite)::

    brief = build_brief(plan, Operation.ISOLATE, report=report, charts=charts)
    brief.nodes[0]   # BriefNode(node="gpu-node-003", action="drain", why="rank 3 waits ...: rank 2 never
                     #           enqueued it", hardware="Xid 79 (GPU has fallen off the bus) ...")
    save_brief(brief, state_dir / "approvals" / run_id / "brief.json")

Text here is kept as it came (hosts, reasons and stack frames come from the job's evidence); the
page escapes everything it renders.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from denpex.analysis.models import HardwareBearing
from denpex.charts import Chart
from denpex.evidence.files import write_atomic
from denpex.evidence.loading import FileKind, read_model
from denpex.isolation.plan import IsolationPlan, Operation
from denpex.report import TriageReport

__all__ = ["BriefNode", "BriefChart", "ApprovalBrief", "build_brief", "save_brief", "load_brief"]

_MAX_BRIEF_BYTES = 64 * 1024 * 1024
_BRIEF_FILE = FileKind("brief")


class BriefNode(BaseModel):
    """One node the decision is about, and the two lines an approver needs right above it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    node: str
    action: str
    why: str
    hardware: str = ""
    host_note: str = ""
    """Set when the node is a guess (derived from the scheduler's job record)."""


class BriefChart(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    title: str
    png_base64: str


class ApprovalBrief(BaseModel):
    """The page's whole view of one paused run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    incident_id: str
    cluster: str
    tenant: str | None
    operation: Operation
    plan_hash: str
    headline: str
    nodes: list[BriefNode]
    target: str = ""
    """Where the approved commands go (the target block's host and port), e.g. "Slurm commands
    over SSH to root@10.0.0.5:22"; empty in briefs saved before it was shown."""
    summary: list[str] = []
    """Short lines of context (a follow-up operation says what it undoes or restarts)."""
    report: TriageReport | None = None
    charts: list[BriefChart] = []


def build_brief(plan: IsolationPlan, operation: Operation, *, report: TriageReport | None = None,
                charts: Sequence[Chart] = (), summary: Sequence[str] = (), target: str = "") -> ApprovalBrief:
    """The brief for ``operation`` on ``plan``: per node the action, why (the culprit's first
    reason) and the hardware signal on it; the report and charts when the run triaged."""
    nodes = []
    for action in plan.actions:
        why, hardware, host_note = _evidence_for(report, action.node)
        verb = action.rollback.value if operation is Operation.ROLLBACK else action.action.value
        nodes.append(BriefNode(node=action.node, action=verb, why=why or action.reason, hardware=hardware,
                               host_note=host_note))
    verdict = f": {report.verdict.value}" if report is not None else ""
    return ApprovalBrief(
        incident_id=plan.incident_id, cluster=plan.cluster or "", tenant=plan.tenant, operation=operation,
        plan_hash=plan.content_hash(), headline=f"Incident {plan.incident_id} on {plan.cluster or '?'}{verdict}",
        nodes=nodes, target=target, summary=list(summary), report=report,
        charts=[BriefChart(name=c.name, title=c.title, png_base64=base64.b64encode(c.png).decode("ascii"))
                for c in charts])


def _evidence_for(report: TriageReport | None, node: str) -> tuple[str, str, str]:
    """The first culprit on ``node``: its first reason, its first signal that bears on a fault,
    and the note that its host is a guess, if it is."""
    if report is None:
        return "", "", ""
    for candidate in report.candidates:
        if candidate.host != node:
            continue
        why = candidate.reasons[0] if candidate.reasons else f"rank {candidate.rank} ({candidate.kind.value})"
        signals = [h.summary for h in candidate.hardware if h.bearing is not HardwareBearing.UNRELATED]
        derived = next((r for r in candidate.reasons if r.startswith(f"host {node} is derived")), "")
        return f"rank {candidate.rank}: {why}", signals[0] if signals else "no signal on its node", derived
    return "", "", ""


def save_brief(brief: ApprovalBrief, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_atomic(path, brief.model_dump_json().encode())


def load_brief(path: Path) -> ApprovalBrief:
    """The brief at ``path`` (ValueError when it is missing, oversized or does not parse)."""
    return read_model(path, ApprovalBrief, max_bytes=_MAX_BRIEF_BYTES, kind=_BRIEF_FILE, error=ValueError)
