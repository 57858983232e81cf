"""Family 9: tangled waits in Megatron MoE jobs (NCCL-format, timing off, rings of 20).

GPUs stop inside an expert-parallel all_to_all; the other ranks end blocked in p2p ops and
collectives whose waits point at each other. The triage must name exactly the failed ranks.
The second half checks the reproductions themselves (layout, format, what each rank enqueued).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from denpex.analysis.models import CandidateKind, Verdict
from denpex.analysis.triage import triage_path
from testkit.generators.nccl_dump import DumpFormat, encode_dump
from testkit.generators.nccl_moe import MOE_SCENARIOS, BuiltMoE, build_moe_scenario, write_moe_scenario
from testkit.generators.nccl_topology import GroupKind

NAMES = list(MOE_SCENARIOS)
FORMATS = [DumpFormat.PICKLE, DumpFormat.JSON]


@cache
def built(name: str) -> BuiltMoE:
    """Each reproduction is simulated once per session; tests must not mutate it."""
    return build_moe_scenario(name)


@pytest.mark.parametrize("manifest", [True, False], ids=["manifest", "no-manifest"])
@pytest.mark.parametrize("fmt", FORMATS, ids=[f.value for f in FORMATS])
@pytest.mark.parametrize("name", NAMES)
def test_the_failed_gpus_lead_and_only_their_ep_peers_follow(name: str, fmt: DumpFormat, manifest: bool,
                                                             tmp_path: Path) -> None:
    """Of 16 or 32 blocked ranks, the failed ones lead; the only others named are the members of
    the all_to_all each stopped in (their GPU or link may hold it if the failed rank only synced).
    With timing off nothing tells a lost GPU from a sync, so the verdict is ambiguous."""
    scenario = built(name)
    result = triage_path(write_moe_scenario(scenario, tmp_path / name, fmt, manifest=manifest))
    faulty = {f.rank for f in scenario.scenario.faults}
    assert result.verdict is Verdict.AMBIGUOUS is scenario.expected.verdict, scenario.scenario.description
    leads = result.candidates[:len(faulty)]
    assert {c.rank for c in leads} == faulty
    peers = {r for f in faulty for r in scenario.topology.group_of(f, GroupKind.EP).ranks} - faulty
    assert {c.rank for c in result.candidates[len(faulty):]} == peers
    assert min(c.confidence for c in leads) > max(c.confidence for c in result.candidates[len(faulty):])
    assert all(c.kind is CandidateKind.STALLED for c in result.candidates)
    for candidate in result.candidates:
        # Each points at the expert all_to_all, not at a victim's op.
        assert candidate.process_group is not None
        assert scenario.topology.groups[candidate.process_group].kind is GroupKind.EP
    for candidate in leads:
        assert any("its CPU stopped there" in reason for reason in candidate.reasons)
    if manifest:
        assert {c.host for c in leads} == {scenario.manifest.host_of(r) for r in faulty}


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
    for dump in scenario.dumps.values():
        entries = dump["entries"]
        assert len(entries) == 20 and entries[0]["record_id"] > 0
        assert all(e["state"] in ("scheduled", "completed") for e in entries)
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


@pytest.mark.parametrize("name", NAMES)
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
