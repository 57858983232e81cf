"""The NCCL incident scenarios: what goes wrong, where, and the verdict a correct triage gives.

All scenarios run the same job (``Layout()``: tp=4 x pp=4 x dp=4, 64 ranks, 8 per host) for five
steps after ~52,000 earlier ones; the fault, if any, is in the last step. Global ranks::

    rank = 16 * stage + 4 * dp_index + tp_index          host = gpu-node-{rank // 8 + 1:03d}

Ground truth is fixed by construction (the fault injected) and cross-checked against the
simulation's wait-for graph by the tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from denpex.analysis.models import CandidateKind, Verdict
from testkit.generators.nccl_program import Mutation, P2PMode
from testkit.generators.nccl_topology import Layout, NamingStyle

__all__ = [
    "FaultKind",
    "Fault",
    "DumpTrigger",
    "ScenarioSpec",
    "Expected",
    "SCENARIOS",
    "scenario_names",
]


class FaultKind(StrEnum):
    """What happens to a rank at the tagged call of the last step."""

    WITHHOLD = "withhold"
    """Its CPU hangs just before the call (data loader, deadlock): it never enqueues it. It dumps."""
    DIE = "die"
    """The process dies just before the call: no dump."""
    STALE = "stale"
    """Like WITHHOLD, but the only file for the rank is an on-demand dump from an hour earlier."""
    MISMATCH = "mismatch"
    """It issues the call with other sizes or dtypes than its peers; the collective never finishes."""


@dataclass(frozen=True, slots=True)
class Fault:
    """One injected fault."""

    kind: FaultKind
    ranks: tuple[int, ...]
    tag: str
    mutation: Mutation | None = None


class DumpTrigger(StrEnum):
    """Why and when the ranks dumped."""

    TIMEOUT = "timeout"
    """The first op to exceed ``timeout_ms`` makes its rank broadcast the dump signal; every live
    rank dumps within about a second and a half."""
    QUIESCENT = "quiescent"
    """On demand while the job writes a checkpoint after its last step: nothing in flight."""
    MID_STEP = "mid_step"
    """On demand in the middle of a step: ops in flight for under a second, groups partly entered."""


class Expected(BaseModel):
    """The verdict and culprits a correct triage returns (``expected.json``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    scenario: str
    verdict: Verdict
    culprits: dict[int, CandidateKind]
    description: str
    timing_enabled: bool
    naming: NamingStyle
    fault_step_p2p: P2PMode


@dataclass(frozen=True, slots=True)
class ScenarioSpec:
    """Everything that makes one scenario."""

    name: str
    description: str
    verdict: Verdict
    culprits: dict[int, CandidateKind]
    naming: NamingStyle
    timing: bool
    trigger: DumpTrigger = DumpTrigger.TIMEOUT
    faults: tuple[Fault, ...] = ()
    fault_step_p2p: P2PMode = P2PMode.PLAIN
    layout_tp: int = 4
    layout_pp: int = 4
    layout_dp: int = 4
    ring_size: int = 128

    @property
    def layout(self) -> Layout:
        return Layout(tp=self.layout_tp, pp=self.layout_pp, dp=self.layout_dp, naming=self.naming)

    def expected(self) -> Expected:
        return Expected(scenario=self.name, verdict=self.verdict, culprits=dict(self.culprits),
                        description=self.description, timing_enabled=self.timing,
                        naming=self.naming, fault_step_p2p=self.fault_step_p2p)


_NE, _MM, _SR = CandidateKind.NOT_ENTERED, CandidateKind.MISMATCH, CandidateKind.STOPPED_REPORTING
_DEAD_HOST = tuple(range(16, 24))  # gpu-node-003: stage 1, dp 0 and 1, all tp ranks

SCENARIOS: dict[str, ScenarioSpec] = {
    spec.name: spec
    for spec in (
        ScenarioSpec(
            "healthy",
            "Dumped on demand while the job writes a checkpoint after its last step. Every op "
            "completed and retired; nothing is stuck.",
            Verdict.NO_HANG, {}, NamingStyle.MEGATRON, timing=True, trigger=DumpTrigger.QUIESCENT,
        ),
        ScenarioSpec(
            "healthy_inflight",
            "Dumped on demand in the middle of a step (a slow step was reported). Some tp, dp and "
            "pp ops are in flight, some groups only partly entered, none older than a second "
            "against a 600 s timeout, and ranks dumped up to 0.3 s apart. Not a hang.",
            Verdict.NO_HANG, {}, NamingStyle.MESH, timing=False, trigger=DumpTrigger.MID_STEP,
        ),
        ScenarioSpec(
            "withheld_tp",
            "Rank 21 (stage 1, dp 1, tp 1) hangs on its CPU before microbatch 1's first forward "
            "tp collective. Its tp peers 20, 22, 23 wait in it; they and the pipeline neighbours "
            "blocked behind them are victims.",
            Verdict.LOCALIZED, {21: _NE}, NamingStyle.MEGATRON, timing=False,
            faults=(Fault(FaultKind.WITHHOLD, (21,), "fwd1.tp0"),),
        ),
        ScenarioSpec(
            "dp_mismatch",
            "Rank 50 (stage 3, dp 0, tp 2) calls the step-end gradient all_reduce with half the "
            "elements. All four members of dp group (stage 3, tp 2) are in it at the same seq id; "
            "three agree, rank 50 does not. Everyone else stalls behind that group.",
            Verdict.LOCALIZED, {50: _MM}, NamingStyle.MESH, timing=True,
            faults=(Fault(FaultKind.MISMATCH, (50,), "dp.grad", Mutation.SIZES),),
        ),
        ScenarioSpec(
            "pp_p2p_hang",
            "Rank 38 (stage 2, dp 1, tp 2) hangs before posting its first recv_forward. Its "
            "upstream peer 22 is blocked in the batched send to it (a nccl:coalesced that never "
            "completes) and so never enqueues its next tp collective: 22 looks absent from tp "
            "group (stage 1, dp 1) but is only a victim. 38 waits on no one and has nothing in "
            "flight: not_entered.",
            Verdict.LOCALIZED, {38: _NE}, NamingStyle.MEGATRON, timing=True,
            faults=(Fault(FaultKind.WITHHOLD, (38,), "comm0.recv_forward"),),
            fault_step_p2p=P2PMode.BATCHED,
        ),
        ScenarioSpec(
            "pp_batched_cpu_hang",
            "Rank 38 (stage 2, dp 1, tp 2) completes its first batched recv_forward, then hangs on "
            "its CPU before microbatch 0's first tp collective. Its upstream peer 22 blocks in the "
            "next batched send to it. Rank 38's batches all completed, so it waits on no one: "
            "not_entered; 22 and 38's tp peers are victims. Timing off, as in production.",
            Verdict.LOCALIZED, {38: _NE}, NamingStyle.MEGATRON, timing=False,
            faults=(Fault(FaultKind.WITHHOLD, (38,), "fwd0.tp0"),),
            fault_step_p2p=P2PMode.BATCHED, ring_size=20,
        ),
        ScenarioSpec(
            "dead_host",
            "gpu-node-003 (ranks 16-23: stage 1, dp 0 and 1) dies between microbatches: no dumps. "
            "Stage-0 peers block sending to it, stage-2 peers block receiving from it, and the dp "
            "groups of stage 1 wait for its ranks.",
            Verdict.INCOMPLETE, {r: _SR for r in _DEAD_HOST}, NamingStyle.MESH, timing=False,
            faults=(Fault(FaultKind.DIE, _DEAD_HOST, "comm2.recv_forward"),),
            fault_step_p2p=P2PMode.BATCHED,
        ),
        ScenarioSpec(
            "stale_dump",
            "Rank 45 (stage 2, dp 3, tp 1) hangs in the backward of microbatch 0 and writes no "
            "fresh dump; the file for it is an on-demand dump from an hour earlier (manifest "
            "dumped_at and entry times ~70 min before the other dumps, counters ~8,500 steps behind).",
            Verdict.INCOMPLETE, {45: _SR}, NamingStyle.MEGATRON, timing=True,
            faults=(Fault(FaultKind.STALE, (45,), "bwd0.tp1"),),
        ),
        ScenarioSpec(
            "two_faults",
            "Two independent faults in the same step: rank 6 (stage 0, dp 1, tp 2) never enqueues "
            "its first forward tp collective, and rank 41 (stage 2, dp 2, tp 1) calls the "
            "step-start dp parameter all-gather with Float instead of BFloat16.",
            Verdict.LOCALIZED, {6: _NE, 41: _MM}, NamingStyle.MESH, timing=False,
            faults=(Fault(FaultKind.WITHHOLD, (6,), "fwd0.tp0"),
                    Fault(FaultKind.MISMATCH, (41,), "dp.params", Mutation.DTYPE)),
        ),
        ScenarioSpec(
            "ambiguous_pair",
            "The 2-rank embedding group of pipeline (dp 2, tp 3) disagrees: rank 59 calls the "
            "embedding-gradient all_reduce with half the rows of rank 11. With two members there "
            "is no majority: both are candidates.",
            Verdict.AMBIGUOUS, {11: _MM, 59: _MM}, NamingStyle.MEGATRON, timing=True,
            faults=(Fault(FaultKind.MISMATCH, (59,), "embedding", Mutation.SIZES),),
        ),
    )
}


def scenario_names() -> list[str]:
    """Scenario names in a stable order."""
    return list(SCENARIOS)
