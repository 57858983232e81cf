"""A hardware fault on one member's own GPU separates members the dumps cannot tell apart.

When every member of a stuck op entered it and none finished (a tensor-parallel pair whose
members stopped at the same place), Flight Recorder cannot say whose GPU holds the op: the
group is ``ambiguous`` and ``tied``, and every member is named. A fault signal on exactly one
member's own GPU is the evidence the dumps lack (issue 17, family 1)::

    group tp[4, 5] ambiguous, tied: candidates 4 and 5
    Xid 79 on rank 5's GPU (0000:5e:00.0); rank 4's GPU known, its host's telemetry read, nothing
      -> group localized on rank 5; rank 4 is no longer named: it waits in the op on rank 5

What counts (:class:`MemberEvidence`, built by correlation, which holds the events):

- a fault on the member's own GPU: an Xid matched to its GPU by PCI id or UUID (not by pid alone:
  a process may hold a context on its peer's GPU) or a fatal AER on the GPU's own PCI function
  (not on a bridge, which may sit above the peer's GPU too), with a GPU the manifest names (not
  one assumed from ``local_rank``);
- every other member *shown clean*: its GPU named by PCI id or UUID in the manifest, its host's
  kernel log spanning the hang (from the window's start to the dumps: a short NVML session or a
  log that ends early hears nothing), no source marked unavailable there, no supporting signal,
  and no GPU event or fatal AER on its host that could be its GPU's. Missing evidence is never
  read as health.

Host-wide signals (an NVSwitch SXid, an OOM) and NVLink errors (on the link between the members)
fall on both and separate nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from denpex.analysis.models import Candidate, CandidateKind, GroupVerdict, Membership, Verdict
from denpex.analysis.verdict import BASE_CONFIDENCE
from denpex.analysis.wording import ranks_phrase

__all__ = ["MemberEvidence", "TieBreak", "separate_by_own_gpu"]


@dataclass(frozen=True, slots=True)
class MemberEvidence:
    """What the hardware evidence says about one candidate's own GPU."""

    own_fault: str | None = None
    """The summary of a supporting fault on its own GPU, matched by PCI id or UUID; else None."""
    shown_clean: bool = False
    """Whether the evidence covers its GPU and shows no fault there (not merely none seen)."""


@dataclass(frozen=True, slots=True)
class TieBreak:
    """The groups and candidates once hardware separated what it could; ``notes`` say what."""

    groups: list[GroupVerdict]
    candidates: list[Candidate]
    verdict: Verdict
    notes: list[str]


def separate_by_own_gpu(groups: Sequence[GroupVerdict], candidates: Sequence[Candidate], verdict: Verdict,
                        evidence: Mapping[int, MemberEvidence]) -> TieBreak:
    """Name the one member of each tied group whose own GPU shows a fault; the rest unchanged."""
    by_rank = {c.rank: c for c in candidates}
    picked: dict[frozenset[int], int] = {}
    for group in groups:
        tied = frozenset(group.candidates)
        if tied not in picked and (culprit := _separating_member(group, by_rank, evidence)) is not None:
            picked[tied] = culprit
    if not picked:
        return TieBreak(list(groups), list(candidates), verdict, [])
    new_groups = [group.model_copy(update={"verdict": Verdict.LOCALIZED, "candidates": [culprit], "tied": False,
                                           "hardware_separated": True})
                  if group.tied and (culprit := picked.get(frozenset(group.candidates))) is not None else group
                  for group in groups]
    still_named = {r for g in new_groups for r in g.candidates}
    kept = [_as_separated(c, picked, evidence) for c in candidates
            if c.rank in still_named or not any(c.rank in tied for tied in picked)]
    notes = [_note(tied, culprit) for tied, culprit in sorted(picked.items(), key=lambda kv: kv[1])]
    every_group_proven = all(g.verdict is Verdict.LOCALIZED for g in new_groups)
    if verdict is Verdict.AMBIGUOUS and every_group_proven and {c.rank for c in kept} <= still_named:
        verdict = Verdict.LOCALIZED
    return TieBreak(new_groups, kept, verdict, notes)


def _separating_member(group: GroupVerdict, by_rank: Mapping[int, Candidate],
                       evidence: Mapping[int, MemberEvidence]) -> int | None:
    """The one member with a fault on its own GPU while every other member is shown clean."""
    if not group.tied or group.verdict is not Verdict.AMBIGUOUS:
        return None
    members = [by_rank.get(r) for r in group.candidates]
    if any(m is None or m.kind is not CandidateKind.STALLED or m.membership is not Membership.KNOWN
           for m in members):
        return None  # only ranks each proven blocked in the op; a guess or a silent rank stays a guess
    faulty = [r for r in group.candidates if evidence.get(r, MemberEvidence()).own_fault]
    if len(faulty) != 1:
        return None
    others_clean = all(evidence.get(r, MemberEvidence()).shown_clean for r in group.candidates if r != faulty[0])
    return faulty[0] if others_clean else None


def _as_separated(candidate: Candidate, picked: Mapping[frozenset[int], int],
                  evidence: Mapping[int, MemberEvidence]) -> Candidate:
    """The named member, with why it alone is named and its confidence no longer split."""
    ties = [tied for tied, culprit in picked.items() if culprit == candidate.rank]
    if not ties:
        return candidate
    peers = sorted(set().union(*ties) - {candidate.rank})
    reason = (f"set apart from {ranks_phrase(peers)}, whom the dumps could not tell from it, by a fault on its "
              f"own GPU ({evidence[candidate.rank].own_fault}); the telemetry covers "
              f"{'their GPUs' if len(peers) > 1 else 'its peer' + chr(39) + 's GPU'} and shows none there")
    # The tie split the kind's confidence between the members; the separated one takes it back whole.
    confidence = min(candidate.confidence * (len(peers) + 1), BASE_CONFIDENCE[CandidateKind.STALLED])
    # First: the approval form shows a candidate's first reason, and this is why it alone is named.
    return candidate.model_copy(update={"reasons": [reason, *candidate.reasons], "confidence": round(confidence, 4)})


def _note(tied: frozenset[int], culprit: int) -> str:
    others = sorted(tied - {culprit})
    return (f"Ranks {', '.join(map(str, sorted(tied)))} were tied (every one entered the op and none finished); "
            f"a fault on rank {culprit}'s own GPU, with none on the others', separates them: rank {culprit} is "
            f"named, {ranks_phrase(others)} no longer (hardware evidence, not a dump fact).")
