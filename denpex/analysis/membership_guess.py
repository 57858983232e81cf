"""A rank named only through a guessed membership is a low-confidence suspect, never a culprit.

Without a manifest a group's members are the ranks whose dumps mention it
(``denpex.analysis.membership``). When every one of them waits in the same collective, the
group has members nobody can see, and the comparison names the ranks that could be them
(``BlockageKind.UNKNOWN_MEMBERS``): idle ranks, ranks that left no dump, and on Gloo the ranks
whose ``pg_config`` shows they built a subgroup backend. None of these is shown to be in *this*
group. c10d: every rank must call ``new_group`` for every group, members or not (unless
``use_local_synchronization=True``), and only members build a backend; Gloo's ``pg_config`` keeps
the last backend a rank built, so ``"[]"`` proves the rank is in *a* subgroup, not which one. A
healthy job dumped while a pair's op is in flight names the other pair's ranks this way
(``tests/fixtures/gloo_cases/pairs_on_demand``).

So such a candidate says ``"membership": "inferred"``, carries at most
:data:`GUESSED_CONFIDENCE`, and a reason that says the membership is a guess; a verdict that
names one is at most ``incomplete``. A rank that another blockage names as well keeps what that
blockage proves.
"""

from __future__ import annotations

from denpex.analysis.compare import Blockage, BlockageKind
from denpex.analysis.models import Membership, Verdict
from denpex.analysis.verdict import Decision

__all__ = ["GUESSED_CONFIDENCE", "mark_guessed_members"]

GUESSED_CONFIDENCE = 0.15


def mark_guessed_members(decision: Decision, blockages: list[Blockage]) -> Decision:
    """``decision`` with the candidates named only through a guessed membership marked so."""
    guessed: dict[int, list[str]] = {}
    proven: set[int] = set()
    for blockage in blockages:
        for rank in blockage.targets:
            if blockage.kind is BlockageKind.UNKNOWN_MEMBERS:
                guessed.setdefault(rank, []).append(blockage.group)
            else:
                proven.add(rank)
    marked = []
    for candidate in decision.candidates:
        groups = guessed.get(candidate.rank)
        if not groups or candidate.rank in proven:
            marked.append(candidate)
            continue
        names = ", ".join(repr(g) for g in sorted(set(groups)))
        marked.append(candidate.model_copy(update={
            "membership": Membership.INFERRED,
            "confidence": min(candidate.confidence, GUESSED_CONFIDENCE),
            "reasons": [*candidate.reasons,
                        f"its membership of process group {names} is a guess, not a fact: without a "
                        "manifest only the ranks that mention a group are known members, and every rank "
                        "calls new_group for every group, members or not, so building a subgroup (or "
                        "being idle) does not put a rank in this one; the kind says what it would be if "
                        "it were a member. Pass a manifest with process_groups"]}))
    inferred = {c.rank for c in marked if c.membership is Membership.INFERRED}
    verdict = decision.verdict
    if verdict is Verdict.LOCALIZED and inferred:
        verdict = Verdict.INCOMPLETE
    # A stuck group's own verdict is capped the same way: the isolation gates act per group.
    group_verdicts = [g.model_copy(update={"verdict": Verdict.INCOMPLETE})
              if g.verdict is Verdict.LOCALIZED and inferred & set(g.candidates) else g
              for g in decision.groups]
    return Decision(verdict, marked, group_verdicts)
