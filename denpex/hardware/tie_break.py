"""A hardware fault on one member's own GPU separates members the dumps cannot tell apart.

When every member of a stuck op entered it and none finished (a tensor-parallel pair whose
members stopped at the same place), Flight Recorder cannot say whose GPU holds the op: the
group is ``ambiguous`` and both members are named. A fault signal on exactly one member's own
GPU is the evidence the dumps lack (issue 17, family 1)::

    group tp[4, 5] ambiguous, candidates 4 and 5 (stalled, tied)
    Xid 79 on rank 5's GPU (0000:5e:00.0), nothing on rank 4's
      -> group localized on rank 5; rank 4 is no longer named: it waits in the op on rank 5

Only signals read as "on this rank's GPU" count: an Xid matched to the rank's GPU (or process)
and a fatal PCIe AER on its own PCIe path. Host-wide signals (an NVSwitch SXid, an OOM) fall on
every member of a pair that shares a node, and an NVLink error sits on the link between the
members, so none of them separates. Two members with such a signal, or one whose peer has any
supporting signal, stay tied. The isolation gates still judge the group (hardware support,
fresh evidence); this only decides who is named.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from denpex.analysis.models import (
    Candidate,
    CandidateHardware,
    CandidateKind,
    GroupVerdict,
    HardwareBearing,
    Membership,
    Verdict,
)
from denpex.analysis.wording import ranks_phrase

__all__ = ["TieBreak", "separate_by_own_gpu"]

# Signals that sit on one GPU (or its own PCIe path) rather than on the host or a shared link.
_OWN_GPU_KINDS = frozenset({"xid", "pcie_aer"})


@dataclass(frozen=True, slots=True)
class TieBreak:
    """The groups and candidates once hardware separated what it could; ``notes`` say what."""

    groups: list[GroupVerdict]
    candidates: list[Candidate]
    verdict: Verdict
    notes: list[str]


def separate_by_own_gpu(groups: Sequence[GroupVerdict], candidates: Sequence[Candidate],
                        verdict: Verdict) -> TieBreak:
    """Name the one member of each tied group whose own GPU shows a fault; the rest unchanged."""
    by_rank = {c.rank: c for c in candidates}
    picked: dict[frozenset[int], int] = {}
    new_groups = []
    for group in groups:
        tied = frozenset(group.candidates)
        if tied not in picked:
            culprit = _separating_member(group, [by_rank[r] for r in group.candidates if r in by_rank])
            if culprit is not None:
                picked[tied] = culprit
        culprit = picked.get(tied)
        if culprit is None or group.verdict is not Verdict.AMBIGUOUS:
            new_groups.append(group)
        else:
            new_groups.append(group.model_copy(update={"verdict": Verdict.LOCALIZED, "candidates": [culprit]}))
    if not picked:
        return TieBreak(list(groups), list(candidates), verdict, [])
    still_named = {r for g in new_groups for r in g.candidates}
    kept = [_as_separated(c, picked) for c in candidates if c.rank in still_named or not _in_a_tie(c.rank, picked)]
    notes = [_note(tied, culprit) for tied, culprit in sorted(picked.items(), key=lambda kv: kv[1])]
    every_group_proven = all(g.verdict is Verdict.LOCALIZED for g in new_groups)
    if verdict is Verdict.AMBIGUOUS and new_groups and every_group_proven and {c.rank for c in kept} <= still_named:
        verdict = Verdict.LOCALIZED
    return TieBreak(new_groups, kept, verdict, notes)


def _separating_member(group: GroupVerdict, members: list[Candidate]) -> int | None:
    """The one member with a fault on its own GPU while no other member has any supporting signal."""
    if group.verdict is not Verdict.AMBIGUOUS or len(members) < 2 or len(members) != len(group.candidates):
        return None
    if any(m.kind is not CandidateKind.STALLED or m.membership is not Membership.KNOWN for m in members):
        return None  # only ranks each proven blocked in the op; a guess or a silent rank stays a guess
    own = [m.rank for m in members if _own_gpu_fault(m.hardware)]
    supported = [m.rank for m in members if any(h.bearing is HardwareBearing.SUPPORTS_HARDWARE_FAULT
                                                for h in m.hardware)]
    return own[0] if len(own) == 1 and supported == own else None


def _own_gpu_fault(hardware: list[CandidateHardware]) -> bool:
    return any(h.bearing is HardwareBearing.SUPPORTS_HARDWARE_FAULT and h.kind in _OWN_GPU_KINDS
               for h in hardware)


def _in_a_tie(rank: int, picked: dict[frozenset[int], int]) -> bool:
    return any(rank in tied for tied in picked)


def _as_separated(candidate: Candidate, picked: dict[frozenset[int], int]) -> Candidate:
    """The named member, with why it alone is named and its confidence no longer split."""
    ties = [tied for tied, culprit in picked.items() if culprit == candidate.rank]
    if not ties:
        return candidate
    peers = sorted(set().union(*ties) - {candidate.rank})
    signal = next(h for h in candidate.hardware if h.bearing is HardwareBearing.SUPPORTS_HARDWARE_FAULT
                  and h.kind in _OWN_GPU_KINDS)
    reason = (f"set apart from {ranks_phrase(peers)}, whom the dumps could not tell from it, by a fault on its "
              f"own GPU ({signal.summary}); no supporting signal on {'theirs' if len(peers) > 1 else 'its peer'}: "
              f"{'they wait' if len(peers) > 1 else 'it waits'} in the op on this rank")
    confidence = min(candidate.confidence * (len(peers) + 1), 1.0)
    return candidate.model_copy(update={"reasons": [*candidate.reasons, reason], "confidence": round(confidence, 4)})


def _note(tied: frozenset[int], culprit: int) -> str:
    others = sorted(tied - {culprit})
    return (f"Ranks {', '.join(map(str, sorted(tied)))} were tied (every one entered the op and none finished); "
            f"a fault on rank {culprit}'s own GPU separates them: rank {culprit} is named, "
            f"{ranks_phrase(others)} no longer (hardware evidence, not a dump fact).")
