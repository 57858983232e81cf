"""The triage report: the JSON contract of ``denpex triage`` and its text form for people.

The JSON keys ``verdict``, ``world_size``, ``ranks_with_evidence``, ``missing_ranks``,
``candidates`` and ``plan`` are the contract (docs/contracts.md); the rest is extra context.
The text form answers, for an on-call operator: which group, which collective, who waits, who is
behind, and why.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from denpex.analysis.models import Candidate, Membership, StuckCollective, TriageResult, Verdict
from denpex.analysis.stack_groups import StackGroup, StackGrouping, render_stack_groups
from denpex.analysis.wording import ranks_phrase
from denpex.hardware.describe import describe_hardware

__all__ = ["PlanAction", "PlanView", "TriageReport", "majority_stack", "render_text", "stack_side_by_side"]


class PlanAction(BaseModel):
    """One proposed action on one node (``plan.actions[]``)."""

    node: str
    action: str


class PlanView(BaseModel):
    """The isolation proposal as the contract shows it; the full plan lives in ``denpex.isolation``."""

    recommend_isolation: bool = False
    actions: list[PlanAction] = Field(default_factory=list)
    blocked: list[str] = Field(default_factory=list)


NOT_PLANNED = PlanView(blocked=["no isolation was planned: pass --scheduler slurm|kubernetes"])


class TriageReport(TriageResult):
    """TriageResult plus the isolation plan: what ``denpex triage --format json`` prints."""

    plan: PlanView = Field(default_factory=lambda: NOT_PLANNED.model_copy(deep=True))


MAX_STUCK_SHOWN = 8

_HEADLINES = {
    Verdict.LOCALIZED: "HANG LOCALIZED",
    Verdict.AMBIGUOUS: "HANG, CULPRIT AMBIGUOUS",
    Verdict.INCOMPLETE: "EVIDENCE INCOMPLETE",
    Verdict.NO_HANG: "NO HANG FOUND",
}


def render_text(report: TriageReport) -> str:
    """A plain-text report, most important line first."""
    lines = [_headline(report), *_host_lines(report), ""]
    if report.stuck:
        culprits = {c.rank for c in report.candidates}
        direct: list[StuckCollective] = []
        chained: list[StuckCollective] = []
        for stuck in report.stuck:
            (chained if culprits.isdisjoint(stuck.behind_ranks) else direct).append(stuck)
        lines.append("Stuck operations waiting directly on a candidate:" if direct and chained
                     else "Stuck operations:")
        for stuck in (direct or chained)[:MAX_STUCK_SHOWN]:
            where = f"group {stuck.process_group!r}" + (f" ({stuck.group_desc})" if stuck.group_desc else "")
            what = f"p2p_seq_id {stuck.collective_seq_id}" if stuck.is_p2p else f"collective #{stuck.collective_seq_id}"
            lines.append(f"  - {where}, {what} {stuck.op}")
            lines.append(f"      waiting: {ranks_phrase(stuck.waiting_ranks)}")
            lines.append(f"      why:     {stuck.detail}")
        hidden = len(report.stuck) - min(len(direct or chained), MAX_STUCK_SHOWN)
        if hidden:
            lines.append(f"  ... and {hidden} more stuck op{'s' if hidden != 1 else ''} whose ranks wait on the victims above "
                         "(all of them: --format json)")
        lines.append("")
    lines += _group_lines(report)
    if report.candidates:
        lines.append("Candidates (culprits, not the victims that waited on them):")
        lines += [line for c in report.candidates for line in _candidate_lines(c)]
        lines.append("")
    lines += _stack_lines(report)
    lines += _evidence_lines(report)
    lines += _plan_lines(report)
    return "\n".join(lines).rstrip() + "\n"


MAX_GROUPS_SHOWN = 12


def _group_lines(report: TriageReport) -> list[str]:
    """One verdict per stuck group: a proven culprit in one group stands beside a guess in another."""
    if not report.groups:
        return []
    descs = {s.process_group: s.group_desc for s in report.stuck if s.group_desc}
    lines = ["Verdict per stuck group:"]
    for group in report.groups[:MAX_GROUPS_SHOWN]:
        desc = descs.get(group.process_group)
        where = f"group {group.process_group!r}" + (f" ({desc})" if desc else "")
        what = (f"collective #{group.collective_seq_id}" if group.collective_seq_id is not None
                else f"p2p_seq_id {group.p2p_seq_id}")
        lines.append(f"  - {where} {what}: {group.verdict.value}: {ranks_phrase(group.candidates)}")
    if len(report.groups) > MAX_GROUPS_SHOWN:
        lines.append(f"  ... and {len(report.groups) - MAX_GROUPS_SHOWN} more (all of them: --format json)")
    return lines + [""]


def _headline(report: TriageReport) -> str:
    head = _HEADLINES[report.verdict]
    if report.verdict is Verdict.NO_HANG:
        return f"{head}: every rank reported and no process group is stuck."
    who = ", ".join(f"rank {c.rank} ({c.kind.value})" for c in report.candidates[:6])
    more = f" and {len(report.candidates) - 6} more" if len(report.candidates) > 6 else ""
    why = f" (why: {report.incomplete_reason.value})" if report.incomplete_reason is not None else ""
    return f"{head}: {who}{more}{why}" if who else f"{head}{why}"


def _host_lines(report: TriageReport) -> list[str]:
    """Several candidates on one node point at the node rather than at a rank: say so first."""
    by_host: dict[str, list[Candidate]] = {}
    for c in report.candidates:
        if c.host:
            by_host.setdefault(c.host, []).append(c)
    lines = []
    for host, cands in sorted(by_host.items()):
        if len(cands) < 2:
            continue
        kinds = ", ".join(sorted({c.kind.value for c in cands}))
        lines.append(f"  {len(cands)} candidates on {host}: "
                     f"{ranks_phrase([c.rank for c in cands])} ({kinds})")
    return lines


def _candidate_lines(c: Candidate) -> list[str]:
    host = f" on {c.host}" if c.host else ""
    where = f", group {c.process_group!r} #{c.collective_seq_id}" if c.process_group is not None else ""
    # A guessed membership is said on the candidate's own line: its kind holds only if the guess does.
    guess = (", membership of the group is a guess (no manifest)"
             if c.membership is Membership.INFERRED else "")
    lines = [f"  * rank {c.rank}{host}: {c.kind.value}{where}, confidence {c.confidence:.2f}{guess}"]
    lines += [f"      - {reason}" for reason in c.reasons]
    lines += [f"      hardware: {describe_hardware(event)}" for event in c.hardware]
    if c.stack is not None:
        lines.append(f"      stack ({c.stack.source.value}, thread {c.stack.thread or '?'}): {c.stack.summary}")
    return lines


MAX_STACKS_BESIDE = 3
STACK_FRAMES_SHOWN = 4
_COLUMN = 56


def majority_stack(report: TriageResult, rank: int) -> StackGroup | None:
    """The stack most ranks share, other than ``rank``'s own: what its peers were doing."""
    return next((g for g in report.stack_groups if rank not in g.ranks), None)


def stack_side_by_side(report: TriageResult, c: Candidate) -> list[str]:
    """The candidate's short stack (innermost first) in one column, the majority's in the other."""
    if c.stack is None:
        return []
    majority = majority_stack(report, c.rank)
    left = [f"rank {c.rank} ({c.stack.source.value})"] + [f"  {f.short()}" for f in c.stack.frames[:STACK_FRAMES_SHOWN]]
    if majority is None:
        return left
    right = [f"{ranks_phrase(majority.ranks)} ({', '.join(s.value for s in majority.sources)})"]
    right += [f"  {f.short()}" for f in majority.frames[:STACK_FRAMES_SHOWN]]
    width = min(_COLUMN, max(len(line) for line in left))
    rows = max(len(left), len(right))
    return [f"{_cut(a, width):<{width}} | {b}".rstrip()
            for a, b in zip(left + [""] * (rows - len(left)), right + [""] * (rows - len(right)), strict=True)]


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _stack_lines(report: TriageReport) -> list[str]:
    """Ranks grouped by stack, then each culprit's stack beside the majority's (all frames: the JSON)."""
    if not report.stack_groups:
        return []
    lines = ["Stacks (innermost user frames of the thread that issues collectives; all frames: --format json):"]
    lines += [f"  {line}" for line in render_stack_groups(StackGrouping(groups=report.stack_groups))]
    for c in [c for c in report.candidates if c.stack is not None][:MAX_STACKS_BESIDE]:
        lines.append("")
        lines += [f"  {line}" for line in stack_side_by_side(report, c)]
    return lines + [""]


def _evidence_lines(report: TriageReport) -> list[str]:
    lines = [f"Evidence: {len(report.ranks_with_evidence)} of {report.world_size} ranks reported"
             + (f" (as of {report.as_of.isoformat()})" if report.as_of else "")]
    if report.missing_ranks:
        lines.append(f"  no usable dump: {ranks_phrase(report.missing_ranks, limit=32)}")
    if report.stale_ranks:
        lines.append(f"  stale dump: {ranks_phrase(report.stale_ranks, limit=32)}")
    copies = [s for s in report.skipped_files if s.copy_of]
    problems = [s for s in report.skipped_files if not s.copy_of]
    if copies:
        lines.append(f"  {len(copies)} JSON copies of pickled dumps set aside; the pickles are used")
    for skipped in problems[:20]:
        lines.append(f"  skipped {skipped.path}: {skipped.reason}")
    if len(problems) > 20:
        lines.append(f"  ... and {len(problems) - 20} more skipped files")
    lines += [f"  telemetry read: {source}" for source in report.telemetry_files[:20]]
    if len(report.telemetry_files) > 20:
        lines.append(f"  ... and {len(report.telemetry_files) - 20} more telemetry files")
    if report.other_hardware:
        lines.append("  hardware signals on ranks that are not candidates (the culprit may be elsewhere):")
        lines += [f"    - {describe_hardware(event)}" for event in report.other_hardware[:20]]
    lines += [f"  note: {note}" for note in report.notes]
    return lines + [""]


def _plan_lines(report: TriageReport) -> list[str]:
    plan = report.plan
    if plan.recommend_isolation:
        lines = ["Isolation proposed (needs approval):"]
        lines += [f"  - {a.action} {a.node}" for a in plan.actions]
    else:
        lines = ["No isolation recommended."]
    lines += [f"  blocked: {why}" for why in plan.blocked]
    return lines
