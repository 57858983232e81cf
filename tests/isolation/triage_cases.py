"""Triage results for isolation tests: the shapes the analysis and hardware layers produce."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from denpex.analysis.models import (
    Candidate,
    CandidateHardware,
    CandidateKind,
    HardwareBearing,
    TriageResult,
    Verdict,
)
from denpex.isolation.facts import ClusterFacts, NodeFacts

NOW = datetime(2026, 11, 29, 18, 50, 0, tzinfo=UTC)


def signal(
    code: int = 79,
    *,
    host: str | None = "gpu-node-002",
    age: timedelta = timedelta(minutes=5),
    bearing: HardwareBearing = HardwareBearing.SUPPORTS_HARDWARE_FAULT,
    kind: str = "xid",
    summary: str = "GPU has fallen off the bus",
    as_of: datetime = NOW,
    dated: bool = True,
) -> CandidateHardware:
    """A kernel-log event as the hardware correlation attaches it to a candidate."""
    return CandidateHardware(
        kind=kind, code=code, time=as_of - age if dated else None, summary=summary,
        bearing=bearing, host=host, gpu="0000:3b:00.0",
    )


def candidate(
    rank: int = 1,
    *,
    host: str | None = "gpu-node-002",
    kind: CandidateKind = CandidateKind.STOPPED_REPORTING,
    hardware: Sequence[CandidateHardware] = (),
) -> Candidate:
    return Candidate(rank=rank, kind=kind, confidence=0.8, host=host, process_group="0",
                     collective_seq_id=16, reasons=["test"], hardware=list(hardware))


def killed_process(
    *,
    hardware: Sequence[CandidateHardware] = (),
    host: str | None = "gpu-node-002",
    as_of: datetime = NOW,
    world_size: int = 4,
) -> TriageResult:
    """Rank 1's process was killed: no dump from it, the others wait in collective 16."""
    return TriageResult(
        verdict=Verdict.INCOMPLETE, world_size=world_size,
        ranks_with_evidence=[r for r in range(world_size) if r != 1], missing_ranks=[1],
        candidates=[candidate(1, host=host, hardware=hardware)], as_of=as_of,
    )


def result_with(verdict: Verdict, candidates: Sequence[Candidate], *, as_of: datetime = NOW) -> TriageResult:
    return TriageResult(verdict=verdict, world_size=8, ranks_with_evidence=list(range(8)),
                        missing_ranks=[], candidates=list(candidates), as_of=as_of)


def cluster(count: int = 16, *, drained: dict[str, str] | None = None, partition: str = "gpu",
            opted_out: Sequence[str] = ()) -> ClusterFacts:
    """``count`` idle nodes gpu-node-001..; ``drained`` maps node -> reason of an existing drain."""
    drained = drained or {}
    nodes = {}
    for i in range(1, count + 1):
        name = f"gpu-node-{i:03d}"
        reason = drained.get(name)
        nodes[name] = NodeFacts(
            name=name, state="IDLE+DRAIN" if reason is not None else "IDLE",
            isolated=reason is not None, reason=reason or None, partitions=(partition,),
            opted_out=name in opted_out,
        )
    return ClusterFacts(nodes=nodes, collected_at=NOW)
