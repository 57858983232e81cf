"""What a triage concludes: verdicts, candidates and the reasons behind them.

These models are the JSON contract of ``denpex triage --format json`` (docs/contracts.md).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from denpex.analysis.stack_groups import CandidateStack, StackGroup
from denpex.evidence.skipped import SkippedFile

__all__ = [
    "Verdict",
    "IncompleteReason",
    "CandidateKind",
    "Membership",
    "HardwareBearing",
    "CandidateHardware",
    "Candidate",
    "StuckCollective",
    "GroupVerdict",
    "TriageResult",
]


class Verdict(StrEnum):
    """The overall answer of one triage."""

    LOCALIZED = "localized"
    """Every stuck process group is explained by named ranks, and the evidence separates them."""
    AMBIGUOUS = "ambiguous"
    """The ranks behind the hang are among the candidates, but the evidence cannot say which."""
    INCOMPLETE = "incomplete"
    """Ranks that could explain the hang have no usable (or only stale) evidence."""
    NO_HANG = "no_hang"
    """Every rank has evidence and no process group is stuck."""


class IncompleteReason(StrEnum):
    """Why a verdict is ``incomplete`` (``incomplete_reason``; null for the other verdicts)."""

    RANKS_MISSING = "ranks_missing"
    """Ranks that could explain the hang left no usable or fresh dump."""
    WORLD_SIZE_UNKNOWN = "world_size_unknown"
    """One dump, no manifest and no ``--world-size``: how many ranks the job has is a guess."""
    EVIDENCE_PREDATES_ALERT = "evidence_predates_alert"
    """An alert (``--as-of``, the flow's alert time) says an op timed out, yet every op in flight
    was young at that time: the dumps predate the hang, or the alert's time is wrong."""
    MEMBERSHIP_UNKNOWN = "membership_unknown"
    """A stuck group's members cannot all be seen (no manifest): the rank it waits on is a guess."""
    UNDECIDED = "undecided"
    """The dumps leave a wait open: a ring wrapped past the group, a tied mismatch, Gloo's retire."""
    AGE_UNKNOWN = "age_unknown"
    """Ops are in flight and nothing records how long they waited: slow and hung look the same."""


class CandidateKind(StrEnum):
    """Why a rank is suspected of causing the hang. Victims that waited are never candidates."""

    NOT_ENTERED = "not_entered"
    """The rank is alive and reported, but never enqueued the collective its peers wait in."""
    STALLED = "stalled"
    """The rank is blocked in another op (another group's, or an earlier one) that waits on no one."""
    STOPPED_REPORTING = "stopped_reporting"
    """No dump from the rank, or a dump older than the incident."""
    MISMATCH = "mismatch"
    """The rank called a different op, size or dtype at the same sequence id than the majority."""


class Membership(StrEnum):
    """How the candidate's membership of the group it is named in is known (``candidates[].membership``)."""

    KNOWN = "known"
    """From the manifest, NCCL's ``pg_config``, the default group, or the rank's own entries in the group."""
    INFERRED = "inferred"
    """A guess: no manifest, and the rank is named only because it could be one of the group's
    unseen members (idle, built some subgroup, or left no dump). Its kind then says what the
    rank would be if it were a member; it is a low-confidence suspect, never a proven culprit."""


class HardwareBearing(StrEnum):
    """What a hardware or host event means for the isolation decision. It informs, never proves."""

    SUPPORTS_HARDWARE_FAULT = "supports_hardware_fault"
    """Consistent with a hardware fault on the candidate's GPU, link or PCIe path."""
    POINTS_AT_APPLICATION = "points_at_application"
    """Consistent with an application error (e.g. Xid 13, 31, 43): not a reason to drain."""
    EXPLAINS_MISSING_DUMP = "explains_missing_dump"
    """The host's OOM killer took the rank's process, which explains why it has no dump."""
    UNRELATED = "unrelated"
    """In the window, but says nothing about this candidate."""


class CandidateHardware(BaseModel):
    """One hardware or host event lined up with a candidate (``candidates[].hardware``)."""

    model_config = ConfigDict(frozen=True)

    kind: str = Field(description="xid | sxid | nvlink | pcie_aer | oom")
    code: int | None = None
    time: datetime | None = None
    summary: str
    bearing: HardwareBearing = HardwareBearing.UNRELATED
    host: str | None = None
    gpu: str | None = None


class Candidate(BaseModel):
    """A rank suspected of being behind the hang, with the evidence for it."""

    rank: int
    kind: CandidateKind
    process_group: str | None = None
    collective_seq_id: int | None = None
    confidence: float = Field(ge=0.0, le=1.0)
    host: str | None = None
    reasons: list[str] = Field(default_factory=list)
    hardware: list[CandidateHardware] = Field(default_factory=list)
    membership: Membership = Membership.KNOWN
    # Where the rank's Python stack says it is (issue 19): evidence beside FR progress, never a
    # verdict by itself. None where no stacks evidence names the rank.
    stack: CandidateStack | None = None


class StuckCollective(BaseModel):
    """One process group's op that did not complete: who waits in it and who is behind."""

    model_config = ConfigDict(frozen=True)

    process_group: str
    group_desc: str | None = None
    collective_seq_id: int
    op: str
    waiting_ranks: tuple[int, ...]
    behind_ranks: tuple[int, ...]
    unknown_ranks: tuple[int, ...] = ()
    is_p2p: bool = False
    detail: str = ""
    # When the earliest waiting rank enqueued the op; the hardware window starts shortly before.
    enqueued_at: datetime | None = None


class GroupVerdict(BaseModel):
    """One stuck op's own verdict (``groups[]``): the culprits its waits end on, judged by the
    same rules as the incident. The isolation gates act per group: a proven culprit in one group
    is not held back by an ambiguous lead in another. Exactly one of the two ids is set."""

    model_config = ConfigDict(frozen=True)

    process_group: str
    collective_seq_id: int | None = None
    p2p_seq_id: int | None = None
    verdict: Verdict
    candidates: list[int]
    tied: bool = False
    """The named ranks each entered the stuck op and none finished, and nothing in the dumps tells
    them apart (an ``ambiguous`` group); a fault on one member's own GPU may (correlation)."""
    hardware_separated: bool = False
    """A tied group that correlation made ``localized`` by a fault on one member's own GPU: its
    culprit rests on hardware evidence, not on the dumps, so the isolation gates ask for a fresh
    supporting signal for it whatever the policy asks for its candidate kind."""

    @model_serializer(mode="wrap")
    def _one_id(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # The contract carries ``collective_seq_id`` or ``p2p_seq_id``, never a null other one,
        # and ``tied``, ``hardware_separated`` only where true (additive: older readers never see them).
        data: dict[str, Any] = handler(self)
        for key in ("collective_seq_id", "p2p_seq_id"):
            if data.get(key, 0) is None:
                del data[key]
        for flag in ("tied", "hardware_separated"):
            if not data.get(flag, True):
                del data[flag]
        return data


class TriageResult(BaseModel):
    """The comparison's answer before hardware correlation and planning."""

    verdict: Verdict
    # Why the verdict is ``incomplete`` (additive; null otherwise). An incomplete verdict names
    # candidates where some rank could explain the hang; the reason says why, also when none can.
    incomplete_reason: IncompleteReason | None = None
    world_size: int
    ranks_with_evidence: list[int]
    missing_ranks: list[int]
    stale_ranks: list[int] = Field(default_factory=list)
    candidates: list[Candidate]
    stuck: list[StuckCollective] = Field(default_factory=list)
    skipped_files: list[SkippedFile] = Field(default_factory=list)
    as_of: datetime | None = None
    notes: list[str] = Field(default_factory=list)
    # One verdict per stuck op; ``verdict`` above stays the whole incident's summary.
    groups: list[GroupVerdict] = Field(default_factory=list)
    # Hardware events in the hang's window on hosts that run no candidate (denpex.hardware).
    other_hardware: list[CandidateHardware] = Field(default_factory=list)
    # The files read as telemetry (kernel logs, collector output): given on the command line, found
    # beside the dumps (denpex.workflow.telemetry_files), or filed by the ingest service.
    telemetry_files: list[str] = Field(default_factory=list)
    # Every rank with a stack, grouped by the innermost frames of the thread that issues
    # collectives, largest group first (denpex.analysis.stack_groups). Empty without stacks.
    stack_groups: list[StackGroup] = Field(default_factory=list)
