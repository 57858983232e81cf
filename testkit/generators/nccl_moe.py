"""NCCL-format reproductions of a Megatron MoE job whose GPUs fail inside an expert all_to_all.

Production MoE jobs run with ``TORCH_NCCL_ENABLE_TIMING`` off (every in-flight entry stays
``scheduled``) and small Flight Recorder rings, so older history has wrapped away. This module
simulates such a job step by step (``nccl_sim``) and writes the dumps torch 2.13 would write
(``nccl_dump``), reusing the 3D-parallel fixtures' machinery with an MoE layer added.

Layout, as Megatron-Core's ``RankGenerator`` orders ranks (tensor parallel fastest)::

    dense : rank = stage * (dp * tp) + dp_index * tp + tp_index            (order tp-dp-pp)
    expert: rank = stage * (dp * tp) + edp_index * (ep * etp) + ep_index * etp + etp_index

Groups, created in ``initialize_model_parallel``'s order: dp, tp, each pp group and its
embedding group, then ep, expert-tp and expert-dp. One-member groups carry no traffic and, with
lazy communicator init, never appear in a dump; they are left out.

One step (Megatron 1F1B over 4 microbatches, 2 transformer layers per stage)::

    dp all_gather_into_tensor_coalesced (+ expert-dp), then per microbatch and layer:
    forward : tp _all_gather_base, tp _reduce_scatter_base,
              CPU sync (the alltoall dispatcher copies the split sizes to the host),
              ep all_to_all (dispatch) [expert-tp _all_gather_base, _reduce_scatter_base],
              ep all_to_all (combine)
    backward: the same collectives in reverse, on the autograd thread, without the CPU sync
    pipeline: batched p2p on the pp group (even steps) or plain isend/irecv on the default
              group (odd steps: Megatron's ``_p2p_ops`` without a group), each followed by a sync
    end     : embedding all_reduce, dp and expert-dp reduce_scatter_tensor_coalesced, CPU sync

Write them for a manual look (``denpex triage OUT/<name>/pickle``)::

    python -m testkit.generators.nccl_moe OUT [--scenario NAME ...] [--no-manifest]

The fault: a rank's GPU stops while the rank issues an expert-parallel ``all_to_all`` (or, for
issue 17's family 1, a tensor-parallel ``_all_gather_base``, which both members of the tp pair then
hold: both entered it, neither finishes). The CPU
enqueued it (the entry is in the ring), the GPU never runs it, and the CPU then stalls in its next
driver call, so the rank enqueues nothing more. The FR dump is written from host memory by the
watchdog thread, so the rank still dumps.
"""

from __future__ import annotations

import argparse
import sys
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from denpex.analysis.models import CandidateKind, Verdict
from denpex.evidence.manifest import JobManifest, ProcessGroupSpec, RankIdentity
from testkit.generators.nccl_dump import DumpFormat, DumpSettings, encode_dump, rank_dump
from testkit.generators.nccl_program import (
    BF16,
    FP32,
    CollectiveCall,
    Compute,
    CpuSync,
    Hang,
    P2PCall,
    P2PMode,
    Phase,
    ProgramItem,
    StepPlan,
    _collective,
    _dp_param_gather,
    _StepBuilder,
)
from testkit.generators.nccl_scenarios import Expected
from testkit.generators.nccl_sim import RankCounters, Simulation, Work, count_step
from testkit.generators.nccl_topology import (
    GroupKind,
    Layout,
    NamingStyle,
    ProcessGroupInfo,
    Topology,
    megatron_desc,
)

__all__ = ["MoELayout", "MoEFault", "MoEScenario", "MOE_SCENARIOS", "BuiltMoE", "build_moe_topology",
           "build_moe_scenario", "write_moe_scenario", "main"]

BASE_STEP = 31_000
WINDOW_START = datetime(2026, 11, 30, 2, 10, 0, tzinfo=UTC)
LAYERS = 2
_HIDDEN = 4096
_MS = 1_000_000
_A2A = "nccl:all_to_all"


@dataclass(frozen=True, slots=True)
class MoELayout:
    """Parallel degrees of the MoE job; ``tp * dp`` ranks per stage, split ``edp * ep * etp``."""

    tp: int
    pp: int
    dp: int
    ep: int
    etp: int
    ranks_per_host: int = 8

    def __post_init__(self) -> None:
        if (self.tp * self.dp) % (self.ep * self.etp):
            raise ValueError("ep * etp must divide the ranks of a stage (tp * dp)")

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def edp(self) -> int:
        return self.tp * self.dp // (self.ep * self.etp)

    def dense(self) -> Layout:
        return Layout(tp=self.tp, pp=self.pp, dp=self.dp, ranks_per_host=self.ranks_per_host,
                      naming=NamingStyle.MEGATRON)

    def expert_rank(self, stage: int, edp_index: int, ep_index: int, etp_index: int) -> int:
        return stage * self.tp * self.dp + (edp_index * self.ep + ep_index) * self.etp + etp_index


def build_moe_topology(layout: MoELayout) -> Topology:
    """Every group of the MoE job, named by ``new_group``'s global counter in creation order."""
    dense = layout.dense()
    r = dense.rank_of
    planned: list[tuple[GroupKind, tuple[int, ...]]] = []
    planned += [(GroupKind.DP, tuple(r(s, d, t) for d in range(layout.dp)))
                for s in range(layout.pp) for t in range(layout.tp)]
    planned += [(GroupKind.TP, tuple(r(s, d, t) for t in range(layout.tp)))
                for s in range(layout.pp) for d in range(layout.dp)]
    for d in range(layout.dp):
        for t in range(layout.tp):
            pp = tuple(r(s, d, t) for s in range(layout.pp))
            planned.append((GroupKind.PP, pp))
            planned.append((GroupKind.EMBEDDING, (pp[0], pp[-1])))
    e = layout.expert_rank
    stages, edp, ep, etp = range(layout.pp), range(layout.edp), range(layout.ep), range(layout.etp)
    planned += [(GroupKind.EP, tuple(e(s, d, x, t) for x in ep)) for s in stages for d in edp for t in etp]
    planned += [(GroupKind.EXPERT_TP, tuple(e(s, d, x, t) for t in etp)) for s in stages for d in edp for x in ep]
    planned += [(GroupKind.EXPERT_DP, tuple(e(s, d, x, t) for d in edp)) for s in stages for x in ep for t in etp]
    groups = {"0": ProcessGroupInfo("0", "default_pg", GroupKind.DEFAULT, tuple(range(layout.world_size)))}
    for counter, (kind, ranks) in enumerate(planned, start=1):
        if len(set(ranks)) > 1:  # a one-member group never talks, and NCCL never builds its comm
            groups[str(counter)] = ProcessGroupInfo(str(counter), megatron_desc(kind), kind, tuple(sorted(ranks)))
    order = {rank: tuple(n for n, g in groups.items() if rank in g.ranks) for rank in range(layout.world_size)}
    return Topology(layout=dense, groups=groups, creation_order=order)


@dataclass(frozen=True, slots=True)
class MoEFault:
    """Rank ``rank``'s GPU stops in the call tagged ``tag`` (an ep ``all_to_all`` or a tp op)."""

    rank: int
    tag: str


@dataclass(frozen=True, slots=True)
class MoEScenario:
    """One reproduction: the job's layout, the faults, and what a correct triage says."""

    name: str
    description: str
    layout: MoELayout
    faults: tuple[MoEFault, ...]
    ring_size: int = 20
    only_active: bool = False
    """Dumped with ``onlyActive=True``: completed entries left out (issue 29's pilots' dumps)."""
    verdict: Verdict = Verdict.AMBIGUOUS
    unseparated: tuple[int, ...] = ()
    """Healthy ranks a correct triage names too: the tied partner of a failed rank that nothing
    in the dumps separates from it (both members of a tp pair stopped at the same place)."""

    def expected(self) -> Expected:
        # Timing off: a CPU that stopped in the all_to_all is also what a sync right after it
        # looks like, so such a failed rank leads an ambiguous verdict. A failed rank in a tp
        # pair that is also behind its ep peers (its partner went past it) is proven: localized.
        culprits = {r: CandidateKind.STALLED for r in sorted({f.rank for f in self.faults} | set(self.unseparated))}
        return Expected(scenario=self.name, verdict=self.verdict, culprits=culprits,
                        description=self.description, timing_enabled=False,
                        naming=NamingStyle.MEGATRON, fault_step_p2p=P2PMode.PLAIN)


def _active(name: str, description: str, layout: MoELayout, faults: tuple[MoEFault, ...],
            verdict: Verdict = Verdict.AMBIGUOUS) -> MoEScenario:
    """A reproduction dumped as the pilots' GPU jobs dump (issue 29): ``onlyActive=True``, so only
    the entries still in flight, from rings of 60 (gaps in ``record_id`` show what was left out)."""
    return MoEScenario(name, f"onlyActive dumps, {description}", layout, faults, ring_size=60,
                       only_active=True, verdict=verdict)


_L16 = MoELayout(tp=2, pp=2, dp=4, ep=4, etp=1)
_L32 = MoELayout(tp=2, pp=2, dp=8, ep=4, etp=2)

MOE_SCENARIOS: dict[str, MoEScenario] = {s.name: s for s in (
    MoEScenario("moe16_one_gpu", "16 ranks (tp2 pp2 dp4 ep4 etp1): rank 5's GPU stops in the "
                "dispatch all_to_all of microbatch 1, layer 0 (ep group [4, 5, 6, 7], stage 0).",
                _L16, (MoEFault(5, "fwd1.l0.dispatch"),)),
    MoEScenario("moe16_two_gpus", "16 ranks (tp2 pp2 dp4 ep4 etp1): rank 2's GPU stops in the "
                "dispatch of microbatch 1, layer 0 (ep [0-3], stage 0) and rank 13's in the "
                "dispatch of microbatch 0, layer 1 (ep [12-15], stage 1).",
                _L16, (MoEFault(2, "fwd1.l0.dispatch"), MoEFault(13, "fwd0.l1.dispatch"))),
    MoEScenario("moe32_one_gpu", "32 ranks (tp2 pp2 dp8 ep4 etp2): rank 21's GPU stops in the "
                "dispatch of microbatch 0, layer 1 (ep [17, 19, 21, 23], stage 1).",
                _L32, (MoEFault(21, "fwd0.l1.dispatch"),)),
    MoEScenario("moe32_two_gpus", "32 ranks (tp2 pp2 dp8 ep4 etp2): rank 6's GPU stops in the "
                "dispatch of microbatch 1, layer 0 (ep [0, 2, 4, 6], stage 0) and rank 27's in the "
                "combine of microbatch 0, layer 0 (ep [25, 27, 29, 31], stage 1).",
                _L32, (MoEFault(6, "fwd1.l0.dispatch"), MoEFault(27, "fwd0.l0.combine"))),
    MoEScenario("moe32_two_gpus_crossed", "32 ranks (tp2 pp2 dp8 ep4 etp2): rank 5's GPU stops in "
                "the backward dispatch of microbatch 0, layer 0 (ep [1, 3, 5, 7], stage 0) and rank "
                "20's in the forward dispatch of microbatch 1, layer 1 (ep [16, 18, 20, 22], stage 1). "
                "Rank 20's ep peers have later recvs from stage 0 queued behind their stuck all_to_all; "
                "those recvs wait on rank 5's chain and must not hide rank 20.",
                _L32, (MoEFault(5, "bwd0.l0.dispatch"), MoEFault(20, "fwd1.l1.dispatch"))),
    # Issue 17, family 1: the GPU fails in a tp collective, so both members of the tp pair hold it.
    MoEScenario("moe16_tp_pair_behind_in_ep", "16 ranks (tp2 pp2 dp4 ep4 etp1): rank 5's GPU stops in "
                "the backward tp _all_gather_base of microbatch 0, layer 1 (tp [4, 5]); its partner 4 "
                "goes on to layer 0's ep all_to_all (ep [4-7]), which rank 5 never enqueues.",
                _L16, (MoEFault(5, "bwd0.l1.tp0"),), verdict=Verdict.LOCALIZED),
    MoEScenario("moe32_tp_pair_behind_in_ep", "32 ranks (tp2 pp2 dp8 ep4 etp2): rank 21's GPU stops in "
                "the backward tp _all_gather_base of microbatch 0, layer 1 (tp [20, 21]); its ep peers "
                "[17, 19, 23] and its partner 20 (in expert-tp [20, 21]) go on, rank 21 does not.",
                _L32, (MoEFault(21, "bwd0.l1.tp0"),), verdict=Verdict.LOCALIZED),
    # The fault in the pair's last op before the router's host sync: both members hold it as
    # their newest tp op and neither enqueued anything the other did not.
    MoEScenario("moe16_tp_pair_unseparated", "16 ranks (tp2 pp2 dp4 ep4 etp1): rank 5's GPU stops in "
                "the forward tp _reduce_scatter_base of microbatch 1, layer 0 (tp [4, 5]); both "
                "members stop there, before the ep dispatch (the router's host sync), so nothing "
                "separates them.",
                _L16, (MoEFault(5, "fwd1.l0.tp1"),), unseparated=(4,)),
    MoEScenario("moe16_two_tp_pairs", "16 ranks (tp2 pp2 dp4 ep4 etp1): rank 5's GPU stops in the "
                "backward tp _all_gather_base of microbatch 0, layer 1 (tp [4, 5], separated by ep "
                "[4-7]) and rank 2's in the forward _reduce_scatter_base of microbatch 1, layer 0 "
                "(tp [2, 3], not separated).",
                _L16, (MoEFault(5, "bwd0.l1.tp0"), MoEFault(2, "fwd1.l0.tp1")), unseparated=(3,)),
    MoEScenario("moe32_two_tp_pairs", "32 ranks (tp2 pp2 dp8 ep4 etp2): rank 21's GPU stops in the "
                "backward tp _all_gather_base of microbatch 0, layer 1 (tp [20, 21], separated) and "
                "rank 6's in the forward _reduce_scatter_base of microbatch 1, layer 0 (tp [6, 7], "
                "not separated).",
                _L32, (MoEFault(21, "bwd0.l1.tp0"), MoEFault(6, "fwd1.l0.tp1")), unseparated=(7,)),
    # Issue 29, section 1: a tp member that went on to enqueue a tp op its partner never reached
    # waits on the partner, so the partner alone is named.
    MoEScenario("moe16_tp_partner_went_on", "16 ranks (tp2 pp2 dp4 ep4 etp1): rank 5's GPU stops in "
                "the forward tp _all_gather_base of microbatch 1, layer 0 (tp [4, 5]); rank 4 enqueues "
                "the pair's _reduce_scatter_base, which rank 5 never reaches, then waits in the "
                "router's host sync.",
                _L16, (MoEFault(5, "fwd1.l0.tp0"),), verdict=Verdict.LOCALIZED),
    # The pilots' dumps (issue 29): only the active entries (onlyActive=True), so completed history
    # is gone and a group a rank finished everything in leaves no entry at all.
    _active("moe16_active_tp_faults", "16 ranks: rank 5's GPU stops in the backward tp _all_gather_base "
            "of microbatch 0, layer 1 (tp [4, 5]; rank 4 goes on to enqueue later tp ops) and rank 2's in "
            "the forward one of microbatch 1, layer 0 (tp [2, 3]; rank 3 enqueues the pair's next op). "
            "Pipeline peers block in p2p behind them.",
            _L16, (MoEFault(5, "bwd0.l1.tp0"), MoEFault(2, "fwd1.l0.tp0")), Verdict.LOCALIZED),
    _active("moe16_active_two_gpus", "16 ranks: rank 2's GPU stops in the dispatch of microbatch 1, "
            "layer 0 (ep [0-3]) and rank 13's in the dispatch of microbatch 0, layer 1 (ep [12-15]).",
            _L16, (MoEFault(2, "fwd1.l0.dispatch"), MoEFault(13, "fwd0.l1.dispatch"))),
    _active("moe32_active_two_gpus", "32 ranks: rank 6's GPU stops in the dispatch of microbatch 1, "
            "layer 0 (ep [0, 2, 4, 6]) and rank 27's in the combine of microbatch 0, layer 0 "
            "(ep [25, 27, 29, 31]).",
            _L32, (MoEFault(6, "fwd1.l0.dispatch"), MoEFault(27, "fwd0.l0.combine"))),
    _active("moe32_active_tp_pairs", "32 ranks: rank 21's GPU stops in the backward tp _all_gather_base "
            "of microbatch 0, layer 1 (tp [20, 21]) and rank 6's in the forward one of microbatch 1, "
            "layer 0 (tp [6, 7]); each partner went on.",
            _L32, (MoEFault(21, "bwd0.l1.tp0"), MoEFault(6, "fwd1.l0.tp0")), Verdict.LOCALIZED),
    # Issue 17, family 7: a stopped-CPU lead (ambiguous) beside a proven culprit in another group.
    MoEScenario("moe32_stopped_lead_and_tp_pair", "32 ranks (tp2 pp2 dp8 ep4 etp2): rank 6's GPU stops "
                "in the dispatch all_to_all of microbatch 1, layer 0 (ep [0, 2, 4, 6]: a stopped-CPU "
                "lead) and rank 21's in the backward tp _all_gather_base of microbatch 0, layer 1 "
                "(tp [20, 21], separated).",
                _L32, (MoEFault(21, "bwd0.l1.tp0"), MoEFault(6, "fwd1.l0.dispatch"))),
)}


# -- the step program ----------------------------------------------------------------------------


class _MoEStepBuilder(_StepBuilder):
    """Megatron's 1F1B step with an MoE layer in each transformer layer (see the module doc)."""

    def __init__(self, topology: Topology, rank: int, plan: StepPlan) -> None:
        super().__init__(topology, rank, plan)
        self.ep = _group(topology, rank, GroupKind.EP)
        self.etp = _group(topology, rank, GroupKind.EXPERT_TP)
        self.edp = _group(topology, rank, GroupKind.EXPERT_DP)

    def build(self) -> None:
        step = self.plan.step
        self.add(_dp_param_gather(self.dp, self.topology.layout.dp, step))
        if self.edp:
            self.add(_collective(self.edp, "nccl:all_gather_into_tensor_coalesced", ((25165824,),), BF16,
                                 20_000, "param_gather", step, "edp.params", output=((50331648,),)))
        self.items.append(Compute(4_000))
        self._one_f_one_b()
        if self.embedding is not None:
            self.add(_collective(self.embedding.name, "nccl:all_reduce", ((12576, _HIDDEN),), FP32,
                                 8_000, "embedding_grad", step, "embedding"))
        self.add(_collective(self.dp, "nccl:reduce_scatter_tensor_coalesced", ((83886080,),), FP32,
                             40_000, "grad_reduce_scatter", step, "dp.grad", output=((20971520,),)))
        if self.edp:
            self.add(_collective(self.edp, "nccl:reduce_scatter_tensor_coalesced", ((50331648,),), FP32,
                                 30_000, "grad_reduce_scatter", step, "edp.grad", output=((25165824,),)))
        self.items.append(CpuSync("grad norm .item()", step))
        self.items.append(Compute(12_000, launch_us=2_000))

    def _forward(self, mb: int) -> None:
        step = self.plan.step
        for layer in range(LAYERS):
            tag = f"fwd{mb}.l{layer}"
            self.items.append(Compute(self.plan.fwd_us // (4 * LAYERS)))
            self.add(_collective(self.tp, "nccl:_all_gather_base", ((1024, 1, _HIDDEN),), BF16, 700,
                                 "sp_gather_fwd", step, f"{tag}.tp0", output=((2048, 1, _HIDDEN),)))
            self.items.append(Compute(self.plan.fwd_us // (4 * LAYERS)))
            self.add(_collective(self.tp, "nccl:_reduce_scatter_base", ((2048, 1, _HIDDEN),), BF16, 700,
                                 "sp_scatter_fwd", step, f"{tag}.tp1", output=((1024, 1, _HIDDEN),)))
            # MoEAlltoAllTokenDispatcher copies the split sizes to the host before the dispatch.
            self.items.append(CpuSync("moe: output_splits .cpu()", step))
            self._moe(tag, Phase.MAIN, ("moe_dispatch", "expert_tp_gather", "expert_tp_scatter",
                                        "moe_combine"), ("dispatch", "combine"))
        if self.stage == self.last_stage:
            for index in range(2):
                self.add(_collective(self.tp, "nccl:all_reduce", ((4096, 1),), FP32, 90,
                                     "vocab_parallel_ce", step, f"fwd{mb}.ce{index}"))

    def _backward(self, mb: int) -> None:
        step = self.plan.step
        for layer in reversed(range(LAYERS)):
            tag = f"bwd{mb}.l{layer}"
            self._moe(tag, Phase.AUTOGRAD, ("moe_combine_bwd", "expert_tp_gather_bwd",
                                            "expert_tp_scatter_bwd", "moe_dispatch_bwd"),
                      ("combine", "dispatch"))
            self.items.append(Compute(self.plan.bwd_us // (2 * LAYERS)))
            self.add(_collective(self.tp, "nccl:_all_gather_base", ((1024, 1, _HIDDEN),), BF16, 700,
                                 "sp_gather_bwd", step, f"{tag}.tp0", output=((2048, 1, _HIDDEN),),
                                 phase=Phase.AUTOGRAD))
            self.items.append(Compute(self.plan.bwd_us // (2 * LAYERS)))
            self.add(_collective(self.tp, "nccl:_reduce_scatter_base", ((2048, 1, _HIDDEN),), BF16, 700,
                                 "sp_scatter_bwd", step, f"{tag}.tp1", output=((1024, 1, _HIDDEN),),
                                 phase=Phase.AUTOGRAD))

    def _moe(self, tag: str, phase: Phase, sites: tuple[str, str, str, str], names: tuple[str, str]) -> None:
        """Dispatch all_to_all, the experts (with their tp collectives), combine all_to_all."""
        step = self.plan.step
        sent, received = _token_split(self.rank, f"{step}/{tag}")
        first, last = (sent, received), (received, sent)
        if self.ep:
            self.add(_a2a(self.ep, *first, sites[0], step, f"{tag}.{names[0]}", phase))
        # The experts' tp collectives move capacity-padded buffers: the same size on every member.
        padded = 5120
        if self.etp:
            self.add(_collective(self.etp, "nccl:_all_gather_base", ((padded, _HIDDEN),), BF16, 400,
                                 sites[1], step, f"{tag}.etp0", output=((2 * padded, _HIDDEN),), phase=phase))
        self.items.append(Compute(3_000))
        if self.etp:
            self.add(_collective(self.etp, "nccl:_reduce_scatter_base", ((2 * padded, _HIDDEN),), BF16,
                                 400, sites[2], step, f"{tag}.etp1", output=((padded, _HIDDEN),), phase=phase))
        if self.ep:
            self.add(_a2a(self.ep, *last, sites[3], step, f"{tag}.{names[1]}", phase))

    def _communicate(self, what: str, *, send_prev: bool = False, recv_prev: bool = False,
                     send_next: bool = False, recv_next: bool = False) -> None:
        """Batched exchanges go on the pp group; plain ones on the default group (old ``_p2p_ops``)."""
        count = len(self.items)
        super()._communicate(what, send_prev=send_prev, recv_prev=recv_prev, send_next=send_next,
                             recv_next=recv_next)
        if self.plan.p2p_mode is P2PMode.PLAIN:
            self.items[count:] = [replace(i, group="0") if isinstance(i, P2PCall) else i
                                  for i in self.items[count:]]


def _group(topology: Topology, rank: int, kind: GroupKind) -> str | None:
    info = topology.group_of(rank, kind)
    return info.name if info is not None else None


def _token_split(rank: int, key: str) -> tuple[int, int]:
    """Tokens this rank sends and receives in one dispatch: uneven, as routing makes them."""
    return (3072 + zlib.crc32(f"{key}/{rank}/s".encode()) % 2048,
            3072 + zlib.crc32(f"{key}/{rank}/r".encode()) % 2048)


def _a2a(group: str, sent: int, received: int, site: str, step: int, tag: str, phase: Phase) -> CollectiveCall:
    """``all_to_all_single`` with split sizes: NCCL records the whole input and output tensors."""
    return CollectiveCall(group, _A2A, ((sent, _HIDDEN),), (BF16,), ((received, _HIDDEN),), (BF16,),
                          900, site, phase, step=step, tag=tag)


def _p2p_mode(step: int) -> P2PMode:
    return P2PMode.BATCHED if step % 2 == 0 else P2PMode.PLAIN


def _programs(topology: Topology, scenario: MoEScenario) -> dict[int, list[ProgramItem]]:
    """Two steps: a healthy one, then the one in which the GPUs fail."""
    faults = {f.rank: f.tag for f in scenario.faults}
    programs = {}
    for rank in range(scenario.layout.world_size):
        items: list[ProgramItem] = []
        for step in (BASE_STEP, BASE_STEP + 1):
            builder = _MoEStepBuilder(topology, rank, StepPlan(step, _p2p_mode(step)))
            builder.build()
            items += builder.items
        if rank in faults:
            items = _stall_after(items, faults[rank], rank, BASE_STEP + 1)
        programs[rank] = items
    return programs


def _stall_after(items: list[ProgramItem], tag: str, rank: int, step: int) -> list[ProgramItem]:
    for index, item in enumerate(items):
        if isinstance(item, CollectiveCall) and item.tag == tag and item.step == step:
            return [*items[:index + 1], Hang(f"GPU lost in {tag}; the next driver call never returns")]
    raise ValueError(f"rank {rank} has no call tagged {tag!r} in step {step}")


# -- the simulation ------------------------------------------------------------------------------


class _GpuFaultSimulation(Simulation):
    """``Simulation`` with failed GPUs: a failed rank's stream never runs the faulty call (nor
    anything after it), and all_to_all members agree on op and dtype only (splits differ)."""

    def __init__(self, topology: Topology, programs: dict[int, list[ProgramItem]],
                 counters: dict[int, RankCounters], cpu_start_ns: dict[int, int],
                 faults: dict[int, str]) -> None:
        super().__init__(topology, programs, counters, cpu_start_ns)
        self.faults = faults
        self.dead: set[int] = set()  # id() of the works the failed GPUs never run

    def _enqueue_collective(self, rank: int, call: CollectiveCall) -> None:
        super()._enqueue_collective(rank, call)
        if self.faults.get(rank) == call.tag and call.step == BASE_STEP + 1:
            self.dead.add(id(self.streams[rank][-1]))

    def _try_collective(self, work: Work) -> bool:
        group = work.group or ""
        works = self._collectives[(group, work.seq)]
        if len(works) < len(self.topology.groups[group].ranks):
            return False
        if any(id(w) in self.dead or w.ready_ns is None for w in works.values()):
            return False
        if len({_agreement(w.signature) for w in works.values()}) > 1:
            return False
        done = max(w.ready_ns or 0 for w in works.values()) + work.duration_ns
        for w in works.values():
            w.complete_ns = done
        return True


def _agreement(signature: tuple[object, ...]) -> tuple[object, ...]:
    """What NCCL needs members to agree on: all_to_all split sizes differ per rank."""
    if signature and signature[0] == _A2A:
        return (signature[0], signature[2], signature[4])
    return signature


def _fast_forward(topology: Topology, steps: int) -> dict[int, RankCounters]:
    """Counters after ``steps`` healthy steps (alternating p2p modes) and the start-up barrier."""
    per_mode = {}
    for mode in P2PMode:
        one = {}
        for rank in range(topology.layout.world_size):
            builder = _MoEStepBuilder(topology, rank, StepPlan(0, mode))
            builder.build()
            one[rank] = builder.items
        per_mode[mode] = count_step(topology, one)
    n_batched, n_plain = (steps + 1) // 2, steps // 2
    result: dict[int, RankCounters] = {}
    for rank in range(topology.layout.world_size):
        b, p = per_mode[P2PMode.BATCHED][rank], per_mode[P2PMode.PLAIN][rank]
        counters = RankCounters(record_id=1 + n_batched * b.record_id + n_plain * p.record_id)
        for info in topology.groups_of(rank):
            g = counters.group(info.name)
            gb, gp = b.group(info.name), p.group(info.name)
            g.coll = n_batched * gb.coll + n_plain * gp.coll
            g.p2p = n_batched * gb.p2p + n_plain * gp.p2p
            g.op = n_batched * gb.op + n_plain * gp.op
            if info.kind is GroupKind.DEFAULT:
                g.coll += 1  # the start-up barrier
                g.op += 1
            # pg_status holds the seq_ of the group's last work: p2p numbers where p2p came last.
            g.last_work_seq = g.p2p if info.kind in (GroupKind.PP, GroupKind.DEFAULT) and g.p2p else g.coll
        result[rank] = counters
    return result


# -- building and writing ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BuiltMoE:
    """A reproduction in memory: one pickle-form dump per rank, the manifest and the truth."""

    scenario: MoEScenario
    topology: Topology
    simulation: Simulation
    dumps: dict[int, dict[str, Any]]
    manifest: JobManifest
    expected: Expected


def build_moe_scenario(name: str) -> BuiltMoE:
    """Simulate ``name`` until nothing can move, then take every rank's dump after the timeout."""
    scenario = MOE_SCENARIOS[name]
    topology = build_moe_topology(scenario.layout)
    programs = _programs(topology, scenario)
    starts = {r: _jitter(f"start/{r}", 0, 3 * _MS) for r in programs}
    faults = {f.rank: f.tag for f in scenario.faults}
    sim = _GpuFaultSimulation(topology, programs, _fast_forward(topology, BASE_STEP), starts, faults)
    sim.run()
    unreached = sorted(set(faults) - set(sim.hung))
    if unreached:
        raise RuntimeError(f"{name}: ranks {unreached} never reached their fault (an earlier fault "
                           "blocked them first); pick other tags")
    stuck = [w for r in programs for w in sim.incomplete(r)]
    first = min(stuck, key=lambda w: (w.created_ns, w.rank))
    timeout_at = first.created_ns + 600_000 * _MS
    # The rank whose op timed out first dumps at once and signals the others (within ~1.5 s).
    dump_at = {r: timeout_at + (5 * _MS if r == first.rank else _jitter(f"dump/{r}", 150 * _MS, 1_500 * _MS))
               for r in programs}
    settings = DumpSettings(epoch_ns=int(WINDOW_START.timestamp()) * 10**9, timing=False,
                            ring_size=scenario.ring_size, only_active=scenario.only_active)
    dumps = {r: rank_dump(sim, r, t, settings) for r, t in sorted(dump_at.items())}
    short = [r for r in dumps if len([x for x in sim.records[r] if x.created_ns <= dump_at[r]]) < scenario.ring_size]
    if short:
        raise RuntimeError(f"{name}: ranks {short} recorded fewer entries than the ring holds")
    manifest = _manifest(scenario, topology, {r: settings.epoch_ns + t for r, t in dump_at.items()})
    return BuiltMoE(scenario, topology, sim, dumps, manifest, scenario.expected())


def write_moe_scenario(built: BuiltMoE, directory: Path, fmt: DumpFormat, *, manifest: bool = True) -> Path:
    """Write ``comm_lib_trace_rank_<r>[.json]``, ``expected.json`` and (optionally) the manifest."""
    directory.mkdir(parents=True, exist_ok=True)
    suffix = ".json" if fmt is DumpFormat.JSON else ""
    for rank, dump in built.dumps.items():
        (directory / f"comm_lib_trace_rank_{rank}{suffix}").write_bytes(encode_dump(dump, fmt))
    if manifest:
        (directory / "manifest.json").write_text(built.manifest.model_dump_json(indent=1, exclude_none=True) + "\n")
    (directory / "expected.json").write_text(built.expected.model_dump_json(indent=1) + "\n")
    return directory


def _jitter(key: str, low: int, high: int) -> int:
    return low + zlib.crc32(key.encode()) % (high - low + 1)


def _manifest(scenario: MoEScenario, topology: Topology, dump_ns: dict[int, int]) -> JobManifest:
    layout = topology.layout
    ranks = {
        rank: RankIdentity(host=layout.host_of(rank), local_rank=layout.local_rank(rank),
                           gpu_index=layout.local_rank(rank),
                           dumped_at=datetime.fromtimestamp(dump_ns[rank] / 1e9, UTC))
        for rank in range(layout.world_size)
    }
    groups = {name: ProcessGroupSpec(desc=info.desc, ranks=info.ranks) for name, info in topology.groups.items()}
    return JobManifest(job_id=f"moe-{scenario.name}", world_size=layout.world_size, ranks=ranks,
                       process_groups=groups)


def main(argv: Sequence[str] | None = None) -> int:
    """Write every (or the named) reproduction as pickle and JSON folders; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m testkit.generators.nccl_moe",
                                     description="Write the MoE NCCL-format reproductions.")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--scenario", action="append", choices=list(MOE_SCENARIOS))
    parser.add_argument("--no-manifest", action="store_true", help="dumps only, as production leaves them")
    args = parser.parse_args(argv)
    for name in args.scenario or list(MOE_SCENARIOS):
        built = build_moe_scenario(name)
        for fmt in DumpFormat:
            path = write_moe_scenario(built, args.out_dir / name / fmt.value, fmt, manifest=not args.no_manifest)
            print(f"{path}: {len(built.dumps)} dumps, expected {built.expected.verdict.value} "
                  f"{ {r: k.value for r, k in built.expected.culprits.items()} }")
    return 0


if __name__ == "__main__":
    sys.exit(main())
