"""Recovery before action: did the job move past the collective it was stuck in?

Evidence that arrives while the flow waits for approval is read again before anything runs. A
rank that was stopped (SIGSTOP) and continued completes its collective; its HangDumper then dumps
again, and the new dumps show the group past the sequence id it was stuck at. Draining that
rank's node now would take a healthy node out, so the plan is withdrawn instead::

    before: rank 2 not_entered, group '2' #3 stuck        after: no group stuck at '2' #<=3
    -> RecoveryCheck(recovered=True, reason="group '2' moved past collective #3 ...")
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from denpex.analysis.models import TriageResult, Verdict
from denpex.analysis.triage import EvidenceInventory
from denpex.evidence.dump_ref import DumpRef

__all__ = ["RecoveryCheck", "check_recovery", "newer_dumps"]


class RecoveryCheck(BaseModel):
    """Whether the hang that the plan answers is over, and why we think so."""

    model_config = ConfigDict(frozen=True)

    recovered: bool
    reason: str


def _stuck_points(result: TriageResult) -> set[tuple[str, int]]:
    points = {(s.process_group, s.collective_seq_id) for s in result.stuck}
    points |= {(c.process_group, c.collective_seq_id) for c in result.candidates
               if c.process_group is not None and c.collective_seq_id is not None}
    return points


def newer_dumps(before: EvidenceInventory, after: EvidenceInventory) -> list[int]:
    """Ranks whose dump is new, or was written again, since ``before`` was taken.

    Judged on the store's own record of each object (name, size, modification time and version),
    not on the times inside the dumps: a rank blocked since before the alert keeps its old entry
    times. The version (S3 ETag, a file's inode and nanosecond mtime) tells apart a re-dump that
    lands within the same second at the same size, as a rank whose op completes just after its
    first dump writes: S3 keeps whole seconds, and an FR dump's size barely depends on its state.
    """
    return sorted(rank for rank, ref in after.dumps.items() if _written_again(before.dumps.get(rank), ref))


def _written_again(old: DumpRef | None, new: DumpRef) -> bool:
    return old is None or (old.name, old.size, old.modified, old.version) != (
        new.name, new.size, new.modified, new.version)


def check_recovery(before: TriageResult, after: TriageResult, *, newer_ranks: list[int]) -> RecoveryCheck:
    """Compare the triage the plan was made from with a triage of the evidence read again now.

    Recovered only when some dump was written again (``newer_ranks``), every candidate rank has
    reported, and no group is still stuck at (or before) a collective that was stuck before.
    """
    if not newer_ranks:
        return RecoveryCheck(recovered=False, reason="no newer evidence arrived since triage")
    culprits = sorted(c.rank for c in before.candidates)
    silent = [r for r in culprits if r not in after.ranks_with_evidence]
    if silent:
        return RecoveryCheck(recovered=False,
                             reason=f"rank(s) {silent} have not reported since triage")
    points = _stuck_points(before)
    if not points:
        return RecoveryCheck(recovered=False, reason="the triage named no stuck collective to compare")
    still = sorted(
        f"group {group!r} #{seq}" for group, seq in points
        if any(s.process_group == group and s.collective_seq_id <= seq for s in after.stuck)
    )
    if still:
        return RecoveryCheck(recovered=False, reason=f"still stuck: {', '.join(still)}")
    moved = ", ".join(f"group {g!r} past collective #{s}" for g, s in sorted(points))
    state = "no hang" if after.verdict is Verdict.NO_HANG else f"verdict {after.verdict.value}"
    return RecoveryCheck(
        recovered=True,
        reason=f"the job recovered: newer dumps of ranks {newer_ranks} show {moved}; "
               f"ranks {culprits} reported ({state})",
    )
