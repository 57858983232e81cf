"""The stacks beside a triage's dumps, joined to its result (issue 19).

    result = attach_stacks(result, store, inventory.dumps, max_dump_bytes=options.max_dump_bytes)

reads what the evidence holds (the collector's and py-spy's files under ``collector/``, torch's
debug-server file nearest the incident, and FR's own call-site frames of the stuck ops for the few
ranks the others leave without a stack), then gives each candidate its ``stack``, the result its
``stack_groups``, the candidates that stand apart in their stuck group a reason, and a note for
each stacks file set aside or trimmed.

A stack never changes the verdict, the candidates or their kinds here: FR progress decides, and
the stacks are evidence beside it. Without any stacks evidence the result is returned unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping

from denpex.analysis.models import Candidate, CandidateKind, TriageResult
from denpex.analysis.stack_findings import StackFindings, stack_findings
from denpex.analysis.stack_groups import SOURCE_PREFERENCE
from denpex.evidence.dump_ref import DumpRef
from denpex.evidence.errors import EvidenceError
from denpex.evidence.stacks import RankStacks, StackEvidence, read_fr_callsites, read_stack_evidence
from denpex.evidence.store import EvidenceStore

__all__ = ["MAX_CALLSITE_DUMPS", "attach_stacks", "stack_notes"]

MAX_CALLSITE_DUMPS = 16
"""Dumps decoded a second time for FR's call-site frames: the candidates and a few waiting peers
of the first stuck ops, never the whole job (the first pass keeps no frames)."""
_CALLSITE_OPS = 4
_PEERS_PER_OP = 3
_NOTES_SHOWN = 8


def attach_stacks(result: TriageResult, store: EvidenceStore, dumps: Mapping[int, DumpRef], *,
                  max_dump_bytes: int) -> TriageResult:
    """A copy of ``result`` with stacks, ``stack_groups``, outlier reasons and stack notes."""
    try:
        evidence = read_stack_evidence(store, at=result.as_of, world_size=result.world_size)
    except EvidenceError as exc:  # the store could not be listed: the triage stands without stacks
        return result.model_copy(update={"notes": [*result.notes, f"stacks could not be read: {exc}"]})
    records = list(evidence.records)
    records += _fr_callsites(result, store, dumps, records, max_dump_bytes)
    if not records and not evidence.refused and not evidence.notes:
        return result
    members: dict[str, set[int]] = {}
    for stuck in result.stuck:
        members.setdefault(stuck.process_group, set()).update(
            (*stuck.waiting_ranks, *stuck.behind_ranks, *stuck.unknown_ranks))
    found = stack_findings(records, stuck_groups={g: sorted(r) for g, r in members.items()},
                           candidates=[c.rank for c in result.candidates])
    # "No stack" is said only where a stacks file was there to name the rank: FR's call sites
    # alone say nothing about a rank that never called the op.
    files = bool(evidence.records or evidence.refused)
    candidates = [_with_stack(c, found, files) for c in result.candidates]
    return result.model_copy(update={"candidates": candidates, "stack_groups": found.stack_groups,
                                     "notes": [*result.notes, *stack_notes(evidence, records)]})


def _with_stack(candidate: Candidate, found: StackFindings, any_stacks: bool) -> Candidate:
    stack = found.candidate_stacks.get(candidate.rank)
    reasons = [*candidate.reasons, *found.outlier_reasons(candidate.rank)]
    if stack is None and any_stacks:
        reasons.append(f"no stack: {_why_no_stack(candidate, found)}")
    return candidate.model_copy(update={"stack": stack, "reasons": reasons})


def _why_no_stack(candidate: Candidate, found: StackFindings) -> str:
    why = found.without_stack.get(candidate.rank)
    if why is not None:
        return why
    if candidate.kind is CandidateKind.STOPPED_REPORTING:
        return ("its process left none (no stacks file of its own, none from py-spy or torch's debug "
                "server): it is likely gone")
    return "no stacks file from any source names this rank"


def _fr_callsites(result: TriageResult, store: EvidenceStore, dumps: Mapping[int, DumpRef],
                  records: list[RankStacks], max_dump_bytes: int) -> list[RankStacks]:
    """FR's call sites of the first stuck ops, for the candidates and a few waiting peers that no
    other source gives a stack."""
    covered = {r.rank for r in records if r.unavailable is None and r.threads}
    candidates = {c.rank for c in result.candidates}
    budget = MAX_CALLSITE_DUMPS
    found: list[RankStacks] = []
    for stuck in result.stuck[:_CALLSITE_OPS]:
        involved = (*stuck.behind_ranks, *stuck.unknown_ranks, *stuck.waiting_ranks)
        wanted = [r for r in involved if r in candidates] + list(stuck.waiting_ranks[:_PEERS_PER_OP])
        refs = [dumps[r] for r in dict.fromkeys(wanted) if r in dumps and r not in covered][:budget]
        if not refs:
            continue
        budget -= len(refs)
        got = read_fr_callsites(refs, group_name=stuck.process_group, seq_id=stuck.collective_seq_id,
                                p2p=stuck.is_p2p, max_bytes=max_dump_bytes, store=store)
        found += got.records
        covered.update(r.rank for r in got.records)
        if budget <= 0:
            break
    return found


def stack_notes(evidence: StackEvidence, records: list[RankStacks]) -> list[str]:
    """What the report says about the stacks read: the debug-server file used, each file set aside,
    what was trimmed to fit the bounds (a few, then a count)."""
    notes = []
    sources = sorted({r.source for r in records}, key=SOURCE_PREFERENCE.index)
    if sources:
        ranks = len({r.rank for r in records})
        notes.append(f"stacks read for {ranks} rank{'s' if ranks != 1 else ''} from "
                     + ", ".join(s.value for s in sources)
                     + (f" (torch's debug server's {evidence.debug_file})" if evidence.debug_file else ""))
    problems = [f"stacks file {name} set aside: {why}" for name, why in sorted(evidence.refused.items())]
    problems += [note if evidence.debug_file is None else f"stacks: {note}" for note in evidence.notes]
    problems += [f"rank {r.rank}'s {r.source.value} stacks: {note}" for r in records for note in r.notes]
    notes += problems[:_NOTES_SHOWN]
    if len(problems) > _NOTES_SHOWN:
        notes.append(f"... and {len(problems) - _NOTES_SHOWN} more notes on stacks files")
    return notes
