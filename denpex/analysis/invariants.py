"""What every triage result must satisfy, whatever the evidence (issue 29, section 4).

The tests check these as properties over every committed fixture and generated scenario; a
violation is a bug in the rules, never something to paper over by downgrading a verdict::

    verdict localized, candidates []                        -> "localized names no rank"
    verdict localized, stuck '1' #4 with no group verdict   -> "stuck op '1' #4 is explained by no candidate"
    verdict incomplete, candidates [], no incomplete_reason -> "incomplete names no rank and gives no reason"

The third invariant, no ``no_hang`` while an op of unknown age is in flight, needs the summaries:
``denpex.analysis.triage`` enforces it (``denpex.analysis.unknown_age``), and the property tests
check it against what they generated.
"""

from __future__ import annotations

from denpex.analysis.models import TriageResult, Verdict

__all__ = ["invariant_violations"]


def invariant_violations(result: TriageResult) -> list[str]:
    """Every invariant the result breaks, described; empty when it keeps them all."""
    found: list[str] = []
    named = {c.rank for c in result.candidates}
    if result.verdict is Verdict.LOCALIZED:
        if not named:
            found.append("localized names no rank")
        explained = {(g.process_group, g.collective_seq_id if g.p2p_seq_id is None else g.p2p_seq_id)
                     for g in result.groups if g.candidates and set(g.candidates) <= named}
        for stuck in result.stuck:
            if (stuck.process_group, stuck.collective_seq_id) not in explained:
                what = "p2p_seq_id" if stuck.is_p2p else "#"
                found.append(f"stuck op {stuck.process_group!r} {what}{stuck.collective_seq_id} is explained "
                             "by no candidate")
    if result.verdict is Verdict.NO_HANG and (named or result.stuck):
        found.append("no_hang names ranks or stuck ops")
    if result.verdict is Verdict.INCOMPLETE and result.incomplete_reason is None:
        found.append("incomplete gives no incomplete_reason" + ("" if named else " and names no rank"))
    if result.verdict is not Verdict.INCOMPLETE and result.incomplete_reason is not None:
        found.append(f"{result.verdict.value} carries incomplete_reason {result.incomplete_reason.value}")
    for group in result.groups:
        if not set(group.candidates) <= named:
            found.append(f"group {group.process_group!r} names ranks that are not candidates")
    return found

