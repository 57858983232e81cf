"""Family 9: tangled waits in Megatron MoE jobs (NCCL-format, timing off, rings of 20).

GPUs stop inside an expert-parallel all_to_all (or a tensor-parallel collective); the other ranks
end blocked in p2p ops and collectives whose waits point at each other. The triage must name
exactly the failed ranks, and the tp partner of one only when nothing separates the two.
The second half checks the reproductions themselves (layout, format, what each rank enqueued).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from denpex.analysis.invariants import invariant_violations
from denpex.analysis.models import CandidateKind, Verdict
from denpex.analysis.triage import triage_path
from testkit.generators.nccl_dump import DumpFormat, encode_dump
from testkit.generators.nccl_moe import MOE_SCENARIOS, BuiltMoE, build_moe_scenario, write_moe_scenario
from testkit.generators.nccl_topology import GroupKind

NAMES = list(MOE_SCENARIOS)
# GPUs that fail in an ep all_to_all, and (issue 17, family 1) in a tp collective.
TP_NAMES = [n for n, s in MOE_SCENARIOS.items() if any(".tp" in f.tag for f in s.faults)]
A2A_NAMES = [n for n in NAMES if n not in TP_NAMES]
FORMATS = [DumpFormat.PICKLE, DumpFormat.JSON]


@cache
def built(name: str) -> BuiltMoE:
    """Each reproduction is simulated once per session; tests must not mutate it."""
    return build_moe_scenario(name)


@pytest.mark.parametrize("manifest", [True, False], ids=["manifest", "no-manifest"])
@pytest.mark.parametrize("fmt", FORMATS, ids=[f.value for f in FORMATS])
@pytest.mark.parametrize("name", A2A_NAMES)
def test_the_failed_gpus_lead_and_their_ep_peers_are_not_named(name: str, fmt: DumpFormat, manifest: bool,
                                                               tmp_path: Path) -> None:
    """Of 16 or 32 blocked ranks, only the failed ones are named. With timing off nothing tells a
    lost GPU from a sync right after the all_to_all, so the verdict is ambiguous; the ep peers
    that entered it and went on are mentioned in the lead's reasons, never named (issue 17,
    family 1: a candidate is a rank proven to explain a stuck group)."""
    scenario = built(name)
    result = triage_path(write_moe_scenario(scenario, tmp_path / name, fmt, manifest=manifest))
    assert invariant_violations(result) == []  # issue 29, section 4
    faulty = {f.rank for f in scenario.scenario.faults}
    assert result.verdict is Verdict.AMBIGUOUS is scenario.expected.verdict, scenario.scenario.description
    assert {c.rank for c in result.candidates} == faulty
    assert all(c.kind is CandidateKind.STALLED for c in result.candidates)
    for candidate in result.candidates:
        # Each points at the expert all_to_all, not at a victim's op.
        assert candidate.process_group is not None
        assert scenario.topology.groups[candidate.process_group].kind is GroupKind.EP
        assert any("its CPU stopped there" in reason for reason in candidate.reasons)
        peers = [r for r in scenario.topology.group_of(candidate.rank, GroupKind.EP).ranks if r != candidate.rank]
        assert any(f"merely synchronised after collective #{candidate.collective_seq_id}, the GPU of "
                   f"ranks {', '.join(map(str, peers))}" in reason for reason in candidate.reasons)
    if manifest:
        assert {c.host for c in result.candidates} == {scenario.manifest.host_of(r) for r in faulty}


@pytest.mark.parametrize("manifest", [True, False], ids=["manifest", "no-manifest"])
@pytest.mark.parametrize("fmt", FORMATS, ids=[f.value for f in FORMATS])
@pytest.mark.parametrize("name", TP_NAMES)
def test_a_tp_pair_is_separated_only_by_a_member_behind_its_ep_peers(name: str, fmt: DumpFormat, manifest: bool,
                                                                     tmp_path: Path) -> None:
    """Issue 17, family 1. A GPU fails in a tp _all_gather_base: both members of the pair entered
    it and neither finished. Where the failed rank is also behind its ep peers and its partner
    went past it, only the failed rank is named (localized when every pair is separated); where
    both stopped at the same place, the pair stays ambiguous, saying what would separate it."""
    scenario = built(name)
    result = triage_path(write_moe_scenario(scenario, tmp_path / name, fmt, manifest=manifest))
    assert invariant_violations(result) == []  # issue 29, section 4
    expected = scenario.expected
    assert result.verdict is expected.verdict, scenario.scenario.description
    assert {c.rank: c.kind for c in result.candidates} == expected.culprits
    tags = {f.rank: f.tag for f in scenario.scenario.faults}
    unseparated = {r for u in scenario.scenario.unseparated for r in scenario.topology.group_of(u, GroupKind.TP).ranks}
    for candidate in result.candidates:
        tp = scenario.topology.group_of(candidate.rank, GroupKind.TP)
        if ".tp" not in tags.get(candidate.rank, ".tp"):
            # A GPU lost in an ep all_to_all beside the tp fault: the stopped-CPU lead, as above.
            assert candidate.process_group == scenario.topology.group_of(candidate.rank, GroupKind.EP).name
            assert any("its CPU stopped there" in r for r in candidate.reasons)
        elif candidate.rank not in unseparated and scenario.scenario.only_active:
            # onlyActive: the peers' ep op it never enqueued is a wait of its own (it holds
            # nothing there), beside the tp op its partner went on to.
            ep = scenario.topology.group_of(candidate.rank, GroupKind.EP)
            assert candidate.process_group in {tp.name, ep.name}
            assert any("never reached" in r or "never enqueued it" in r for r in candidate.reasons)
        elif candidate.rank not in unseparated:
            assert candidate.process_group == tp.name
            # Separated by being behind its ep peers (issue 17), or by a tp op its partner
            # enqueued and it never reached (issue 29): either way its CPU stopped first.
            assert any(("also behind its peers in process group" in r or
                        f"which rank {candidate.rank} never reached" in r) and "its CPU stopped first" in r
                       for r in candidate.reasons), candidate.reasons
        else:
            assert any("What would separate them: a hardware signal" in r for r in candidate.reasons), candidate.reasons


def test_the_victims_wait_in_cycles_through_p2p_and_collectives() -> None:
    """What made every rank a candidate: the stuck ops cross pipeline p2p, tp, dp and ep groups."""
    scenario = built("moe16_one_gpu")
    pending = {r: [e for e in d["entries"] if e["state"] != "completed"] for r, d in scenario.dumps.items()}
    names = {e["profiling_name"].split(" ")[0] for entries in pending.values() for e in entries}
    assert {"nccl:all_to_all", "nccl:recv", "nccl:reduce_scatter_tensor_coalesced"} <= names
    assert sum(1 for entries in pending.values() if entries) >= 12


# -- the reproductions ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_timing_is_off_and_rings_of_20_have_wrapped(name: str) -> None:
    scenario = built(name)
    active = scenario.scenario.only_active
    for dump in scenario.dumps.values():
        entries = dump["entries"]
        # onlyActive leaves the ring's completed entries out (issue 29: the pilots' dumps).
        assert (len(entries) <= 20 if active else len(entries) == 20) and entries[0]["record_id"] > 0
        assert all(e["state"] in (("scheduled",) if active else ("scheduled", "completed")) for e in entries)
        assert all("duration_ms" not in e and e["time_discovered_started_ns"] is None for e in entries)
        assert all(status["last_started_collective"] == -1 for status in dump["pg_status"].values())


@pytest.mark.parametrize("name", NAMES)
def test_megatron_moe_layout(name: str) -> None:
    """Dense ranks tp-dp-pp, expert ranks etp-ep-edp-pp (Megatron-Core's RankGenerator)."""
    scenario = built(name)
    layout, groups = scenario.scenario.layout, scenario.topology.groups
    by_kind: dict[GroupKind, set[tuple[int, ...]]] = {}
    for info in groups.values():
        by_kind.setdefault(info.kind, set()).add(info.ranks)
    per_stage = layout.tp * layout.dp
    assert (tuple(range(layout.tp)) in by_kind[GroupKind.TP]
            and tuple(range(0, per_stage, layout.tp)) in by_kind[GroupKind.DP])
    assert tuple(range(0, layout.world_size, per_stage)) in by_kind[GroupKind.PP]
    assert tuple(range(0, layout.ep * layout.etp, layout.etp)) in by_kind[GroupKind.EP]
    if layout.etp > 1:
        assert tuple(range(layout.etp)) in by_kind[GroupKind.EXPERT_TP]
    assert tuple(range(0, per_stage, layout.ep * layout.etp)) in by_kind[GroupKind.EXPERT_DP]
    for rank, dump in scenario.dumps.items():
        config = {name: cfg["ranks"] for name, cfg in dump["pg_config"].items()}
        assert config == {info.name: info.ranks_str() for info in scenario.topology.groups_of(rank)}


@pytest.mark.parametrize("name", A2A_NAMES)
def test_each_failed_rank_stopped_right_after_enqueuing_its_all_to_all(name: str) -> None:
    scenario = built(name)
    faults = scenario.scenario.faults
    ep_groups = {scenario.topology.group_of(f.rank, GroupKind.EP) for f in faults}
    assert len(ep_groups) == len(faults)  # two faults sit in different ep groups
    assert set(scenario.simulation.hung) == {f.rank for f in faults}
    for fault in faults:
        newest = scenario.dumps[fault.rank]["entries"][-1]
        assert newest["profiling_name"] == "nccl:all_to_all" and newest["state"] == "scheduled"
        group = scenario.topology.group_of(fault.rank, GroupKind.EP)
        assert group is not None and newest["process_group"][0] == group.name
        for peer in group.ranks:
            held = [e for e in scenario.dumps[peer]["entries"] if e["process_group"][0] == group.name
                    and e["collective_seq_id"] == newest["collective_seq_id"]]
            assert held and held[0]["state"] == "scheduled"
            if peer != fault.rank:
                assert scenario.dumps[peer]["entries"][-1]["record_id"] > held[0]["record_id"]


ACTIVE_NAMES = [n for n, s in MOE_SCENARIOS.items() if s.only_active]


@pytest.mark.parametrize("name", ACTIVE_NAMES)
def test_only_active_dumps_skip_the_record_ids_of_completed_entries(name: str) -> None:
    """As ``_dump_fr_trace(onlyActive=True)`` writes them: the ring's completed entries are left
    out, so ``record_id`` skips, and batch members whose closing entry completed stay behind."""
    scenario = built(name)
    gaps = 0
    for dump in scenario.dumps.values():
        ids = [e["record_id"] for e in dump["entries"]]
        assert ids == sorted(ids)
        gaps += any(b - a > 1 for a, b in zip(ids, ids[1:], strict=False))
    assert gaps >= len(scenario.dumps) // 2


def test_reproductions_are_deterministic() -> None:
    again = build_moe_scenario("moe16_two_gpus")
    first = built("moe16_two_gpus")
    for rank, dump in first.dumps.items():
        for fmt in FORMATS:
            assert encode_dump(again.dumps[rank], fmt) == encode_dump(dump, fmt)


def test_a_low_nccl_counter_leaves_wrapped_ranks_unknown(tmp_path: Path) -> None:
    """Ranks 12 and 14 (stage 1) are blocked in a recv; their rings of 20 hold no entry of their dp
    group, whose step-end reduce_scatter ranks 8 and 10 wait in. Their pg_status counter there is
    below the op's seq id, but NCCL's counter holds the last op's seq id, a p2p one after a send or
    recv: it cannot show them behind, so they stay unknown rather than 'never enqueued it'."""
    scenario = built("moe16_one_gpu")
    dp = next(g for g in scenario.topology.groups.values() if g.kind is GroupKind.DP and 12 in g.ranks)
    assert not any(e["process_group"][0] == dp.name for e in scenario.dumps[12]["entries"])
    result = triage_path(write_moe_scenario(scenario, tmp_path, DumpFormat.JSON, manifest=False))
    stuck = next(s for s in result.stuck if s.process_group == dp.name)
    assert (stuck.waiting_ranks, stuck.unknown_ranks) == ((8, 10), (12, 14))
    assert "no usable pg_status" in stuck.detail
