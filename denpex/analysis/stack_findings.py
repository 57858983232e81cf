"""What the stacks add to a triage, in the shape the triage JSON and the reports take.

The wiring into :mod:`denpex.analysis.triage` is meant to be a few lines::

    evidence = read_stack_evidence(store, at=as_of)             # the triage's PATH, S3 included
    callsites = read_fr_callsites(candidate_refs, group_name="0", seq_id=16, max_bytes=cap)
    found = stack_findings([*evidence.records, *callsites.records], stuck_groups={"0": [0, 1, 2, 3]},
                           candidates=[c.rank for c in candidates])
    # each candidate:   "stack": found.candidate_stacks.get(rank)   (CandidateStack | None)
    # the object:       "stack_groups": found.stack_groups
    # reasons:          found.outlier_reasons(rank)                 (evidence, never a verdict)

A stack never overrides Flight Recorder progress: the findings only say where each rank is, and
which members of a stuck group stand apart; the verdict rules decide what that proves.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from denpex.analysis.stack_groups import (
    CandidateStack,
    StackGroup,
    StackGrouping,
    StackOutlier,
    best_stacks,
    candidate_stack,
    group_by_stack,
    render_outlier,
    render_stack_groups,
    stack_outliers,
)
from denpex.evidence.stacks import RankStacks
from denpex.markdown_text import code_block

__all__ = ["StackFindings", "render_stack_findings", "stack_findings", "stack_findings_markdown"]


class StackFindings(BaseModel):
    """Stack groups for the whole job, stacks for the ranks asked about, outliers per stuck group."""

    model_config = ConfigDict(frozen=True)

    stack_groups: list[StackGroup] = Field(default_factory=list)
    candidate_stacks: dict[int, CandidateStack] = Field(default_factory=dict)
    """Only for the ranks asked about (candidates) and the outliers: a job of 4,096 ranks does not
    carry 4,096 stacks."""
    outliers: dict[str, list[StackOutlier]] = Field(default_factory=dict)
    """Stuck group (FR's group name) -> its members whose stacks differ from the reference."""
    without_stack: dict[int, str] = Field(default_factory=dict)

    def outlier_reasons(self, rank: int) -> list[str]:
        """One reason per stuck group in which ``rank`` stands apart, naming the group."""
        return [f"in group {group}, {o.reason}" for group, found in sorted(self.outliers.items())
                for o in found if o.rank == rank]


def stack_findings(records: Iterable[RankStacks], *, stuck_groups: Mapping[str, Sequence[int]],
                   candidates: Iterable[int] = ()) -> StackFindings:
    """Group every rank by stack, take the candidates' stacks, and find each stuck group's outliers.

    ``records`` may hold several sources per rank (the most telling one is used, see
    :func:`~denpex.analysis.stack_groups.best_stacks`); ``stuck_groups`` maps each stuck
    group to its member ranks.
    """
    best = best_stacks(records)
    grouping = group_by_stack(best)
    outliers = {group: found for group, members in stuck_groups.items()
                if (found := stack_outliers(grouping, members))}
    wanted = set(candidates) | {o.rank for found in outliers.values() for o in found}
    stacks = {rank: stack for rank in sorted(wanted)
              if rank in best and (stack := candidate_stack(best[rank])) is not None}
    return StackFindings(stack_groups=grouping.groups, candidate_stacks=stacks, outliers=outliers,
                         without_stack=grouping.without_stack)


def render_stack_findings(findings: StackFindings, *, limit: int = 16) -> list[str]:
    """Plain text for the text report: the groups, then each outlier beside its reference."""
    if not findings.stack_groups and not findings.without_stack:
        return []
    grouping = StackGrouping(groups=findings.stack_groups, without_stack=findings.without_stack)
    lines = ["Stacks (innermost user frames of the thread that issues collectives):"]
    lines += [f"  {line}" for line in render_stack_groups(grouping, limit=limit)]
    for group, found in sorted(findings.outliers.items()):
        for outlier in found[:limit]:
            lines.append(f"  stands apart in group {group}:")
            lines += [f"    {line}" for line in render_outlier(outlier)]
    return lines


def stack_findings_markdown(findings: StackFindings) -> str:
    """The same, for the UI's report artifact and the approval form's description: fenced, since
    the frames come from the job (a fence nothing inside can close)."""
    lines = render_stack_findings(findings)
    return f"### Stacks\n\n{code_block(chr(10).join(lines))}\n" if lines else ""
