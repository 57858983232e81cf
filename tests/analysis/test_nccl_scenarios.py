"""NCCL-format fixtures of a 64-rank 3D-parallel job: the triage gives each scenario's verdict,
from pickle and JSON dumps alike, whatever the file names and order. The second half checks the
fixture builder itself against torch 2.13's NCCL Flight Recorder format (NCCL_FORMAT.md)."""

from __future__ import annotations

import io
import json
import pickle
import random
import re
from collections import defaultdict
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from denpex.analysis.invariants import invariant_violations
from denpex.analysis.models import CandidateKind, TriageResult
from denpex.evidence.manifest import load_manifest
from testkit.generators.nccl_dump import DumpFormat, encode_dump
from testkit.generators.nccl_fixtures import BuiltScenario, build_scenario, main, write_scenario
from testkit.generators.nccl_program import uneven_lengths
from testkit.generators.nccl_scenarios import SCENARIOS, DumpTrigger, FaultKind, scenario_names
from testkit.generators.nccl_topology import GroupKind, NamingStyle
from testkit.generators.nccl_truth import culprits_from_simulation

NAMES = scenario_names()
HANGS = [n for n in NAMES if SCENARIOS[n].trigger is DumpTrigger.TIMEOUT]
FORMATS = [DumpFormat.PICKLE, DumpFormat.JSON]
_P2P = re.compile(r"^nccl:(send|recv) (\d+)(->|<-)(\d+)$")


@cache
def built(name: str) -> BuiltScenario:
    """Each scenario is simulated once per test session; tests must not mutate it."""
    return build_scenario(name)


def triage(directory: Path) -> TriageResult:
    """In this process: the verdicts are under test here, not the worker pool
    (tests/analysis/test_isolated_workers.py tests that, and that it gives these same results)."""
    from denpex.analysis.triage import TriageOptions, triage_path

    return triage_path(directory, options=TriageOptions(workers=1))


def outcome(result: TriageResult) -> tuple[str, dict[int, CandidateKind]]:
    return result.verdict.value, {c.rank: c.kind for c in result.candidates}


# -- the triage on every scenario ------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS, ids=[f.value for f in FORMATS])
@pytest.mark.parametrize("name", NAMES, ids=NAMES)
def test_triage_finds_the_ground_truth(name: str, fmt: DumpFormat, tmp_path: Path) -> None:
    scenario = built(name)
    result = triage(write_scenario(scenario, tmp_path / name, fmt))
    expected = scenario.expected
    assert outcome(result) == (expected.verdict.value, expected.culprits), expected.description
    assert set(result.missing_ranks) == set(scenario.missing_ranks)
    assert invariant_violations(result) == []  # issue 29, section 4


def _renamed(rank: int, fmt: DumpFormat) -> str:
    return f"trace-{rank:03d}.json" if fmt is DumpFormat.JSON else f"rank_{rank}.pkl"


def _opaque(rank: int, fmt: DumpFormat) -> str:
    return f"fr-{(rank * 2654435761) % 2**32:08x}-dump.{fmt.value}"


@pytest.mark.parametrize("name", ["withheld_tp", "pp_p2p_hang", "two_faults", "dead_host"])
def test_file_names_and_order_change_nothing(name: str, tmp_path: Path) -> None:
    scenario = built(name)
    shuffled = list(scenario.dumps)
    random.Random(name).shuffle(shuffled)
    results = [
        triage(write_scenario(scenario, tmp_path / "plain", DumpFormat.PICKLE)),
        triage(write_scenario(scenario, tmp_path / "renamed", DumpFormat.PICKLE,
                              file_name=_renamed, order=shuffled)),
        triage(write_scenario(scenario, tmp_path / "renamed-json", DumpFormat.JSON,
                              file_name=_renamed, order=list(reversed(shuffled)))),
        triage(write_scenario(scenario, tmp_path / "opaque", DumpFormat.JSON, file_name=_opaque,
                              order=shuffled, manifest_names_files=True)),
    ]
    first = results[0]
    for other in results[1:]:
        assert outcome(other) == outcome(first)
        assert [(s.process_group, s.collective_seq_id, s.op) for s in other.stuck] == [
            (s.process_group, s.collective_seq_id, s.op) for s in first.stuck]


# -- the builder: ground truth -------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES, ids=NAMES)
def test_declared_culprits_are_the_roots_of_the_simulated_wait_for_graph(name: str) -> None:
    scenario = built(name)
    no_evidence = set(scenario.missing_ranks) | {
        r for f in scenario.spec.faults if f.kind is FaultKind.STALE for r in f.ranks}
    assert culprits_from_simulation(scenario.simulation, no_evidence) == scenario.expected.culprits


def test_healthy_runs_every_op_to_completion() -> None:
    scenario = built("healthy")
    entries = [e for d in scenario.dumps.values() for e in d["entries"]
               if not _member(e, _member_ids(d))]
    assert entries and all(e["state"] == "completed" and e["retired"] for e in entries)


@pytest.mark.parametrize("name", HANGS, ids=HANGS)
def test_hang_dumps_come_after_the_first_timeout_and_close_together(name: str) -> None:
    scenario = built(name)
    fresh = {r: t for r, t in scenario.dump_ns.items() if not _is_stale(scenario, r)}
    ages = []
    for rank, dumped in fresh.items():
        dump = scenario.dumps[rank]
        members = _member_ids(dump)
        pending = [e for e in dump["entries"] if not e["retired"] and not _member(e, members)]
        if pending:
            ages.append(dumped - min(e["time_created_ns"] for e in pending))
    assert max(ages) >= 600_000 * 10**6  # the oldest stuck op outlived its timeout_ms
    assert max(fresh.values()) - min(fresh.values()) < 2 * 10**9


def test_mid_step_dump_shows_young_in_flight_ops_and_partly_entered_groups() -> None:
    scenario = built("healthy_inflight")
    young = []
    for rank, d in scenario.dumps.items():
        members = _member_ids(d)
        for e in d["entries"]:
            if e["state"] != "completed" and not _member(e, members):
                young.append(scenario.dump_ns[rank] - e["time_created_ns"])
    assert young and max(young) < 1_500 * 10**6
    enqueued: dict[tuple[str, int], set[int]] = defaultdict(set)
    for rank, d in scenario.dumps.items():
        for pg, status in d["pg_status"].items():
            enqueued[(_name_of(d, int(pg)), status["last_enqueued_collective"])].add(rank)
    sizes = {name: len(info.ranks) for name, info in scenario.topology.groups.items()}
    partial = sum(1 for (name, _), ranks in enqueued.items() if len(ranks) < sizes[name])
    assert partial > 0


def test_pipeline_victim_looks_absent_from_its_tp_group() -> None:
    """pp_p2p_hang: rank 22 is blocked in a batched send to 38 and never enqueued the tp op its
    tp peers wait in; 38 has nothing in flight."""
    scenario = built("pp_p2p_hang")
    victim, culprit = scenario.dumps[22]["entries"], scenario.dumps[38]["entries"]
    assert [e["profiling_name"] for e in victim[-2:]] == ["nccl:send 1->2", "nccl:coalesced"]
    assert victim[-1]["state"] == "started" and victim[-2]["state"] == "scheduled"
    tp = scenario.topology.group_of(22, GroupKind.TP)
    assert tp is not None
    peer_tp = [e for e in scenario.dumps[20]["entries"] if e["process_group"][0] == tp.name]
    victim_tp = [e for e in victim if e["process_group"][0] == tp.name]
    peer_members = _member_ids(scenario.dumps[20])
    stuck = next(e for e in peer_tp if e["state"] != "completed" and not _member(e, peer_members))
    assert stuck["state"] == "started"
    assert victim_tp[-1]["collective_seq_id"] == stuck["collective_seq_id"] - 1
    members = _member_ids(scenario.dumps[38])
    assert all(e["retired"] or _member(e, members) for e in culprit)


def test_dead_host_leaves_no_files_and_stale_dump_is_an_hour_old(tmp_path: Path) -> None:
    dead = built("dead_host")
    assert dead.missing_ranks == list(range(16, 24))
    assert {dead.manifest.host_of(r) for r in dead.missing_ranks} == {"gpu-node-003"}
    stale = built("stale_dump")
    others = [t for r, t in stale.dump_ns.items() if r != 45]
    assert 3_000 * 10**9 < min(others) - stale.dump_ns[45] < 4_200 * 10**9
    newest = max(e["time_created_ns"] for e in stale.dumps[45]["entries"])
    assert min(others) - newest > 3_000 * 10**9
    mine, peer = stale.dumps[45]["pg_status"], stale.dumps[44]["pg_status"]
    assert int(mine["2"]["last_enqueued_collective"]) < int(peer["2"]["last_enqueued_collective"]) - 10_000
    written = load_manifest(write_scenario(stale, tmp_path, DumpFormat.PICKLE) / "manifest.json")
    assert written.ranks[45].dumped_at is not None
    assert written.ranks[45].dumped_at.timestamp() * 1e9 == pytest.approx(stale.dump_ns[45], abs=1e3)


# -- the builder: format ------------------------------------------------------------------------


class _NoGlobals(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:  # noqa: ARG002 - refuse everything
        raise pickle.UnpicklingError(f"refused {module}.{name}")


@pytest.mark.parametrize("name", NAMES, ids=NAMES)
def test_pickles_hold_plain_containers_only(name: str) -> None:
    scenario = built(name)
    for rank, dump in scenario.dumps.items():
        data = encode_dump(dump, DumpFormat.PICKLE)
        assert data[:2] == b"\x80\x02"
        assert _NoGlobals(io.BytesIO(data)).load() == dump, rank


@pytest.mark.parametrize("name", NAMES, ids=NAMES)
def test_pg_config_and_pg_status_describe_the_ranks_own_groups(name: str) -> None:
    scenario = built(name)
    topology = scenario.topology
    for rank, dump in scenario.dumps.items():
        mine = {g.name: g for g in topology.groups_of(rank)}
        assert dump["version"] == "2.10" and dump["comm_lib_version"] == "2.27.5"
        assert set(dump["pg_config"]) == set(mine)
        for name_, cfg in dump["pg_config"].items():
            assert cfg == {"name": name_, "desc": mine[name_].desc,
                           "ranks": "[" + ", ".join(map(str, mine[name_].ranks)) + "]"}
            assert rank in json.loads(cfg["ranks"])
        assert set(dump["pg_status"]) == {str(topology.pg_id(rank, g)) for g in mine}
        pg_ids: dict[str, set[int]] = defaultdict(set)
        for e in dump["entries"]:
            assert e["process_group"] == (e["process_group"][0], mine[e["process_group"][0]].desc)
            pg_ids[e["process_group"][0]].add(e["pg_id"])
        assert all(len(ids) == 1 for ids in pg_ids.values())  # pg_id is fixed within a process


def test_mesh_naming_gives_one_group_different_pg_ids_on_different_ranks() -> None:
    scenario = built("dp_mismatch")
    assert scenario.spec.naming is NamingStyle.MESH
    topology = scenario.topology
    pp = topology.group_of(0, GroupKind.PP)
    assert pp is not None and re.fullmatch(r"[0-9a-f]{40}", pp.name) and pp.desc == "mesh_pp"
    assert len({topology.pg_id(r, pp.name) for r in pp.ranks}) == 2
    megatron = built("withheld_tp").topology
    assert [g.desc for g in megatron.groups_of(0)] == [
        "default_pg", "DATA_PARALLEL_GROUP", "TENSOR_MODEL_PARALLEL_GROUP",
        "PIPELINE_MODEL_PARALLEL_GROUP", "EMBEDDING_GROUP"]


@pytest.mark.parametrize("name", NAMES, ids=NAMES)
def test_record_ids_and_sequence_ids_are_contiguous(name: str) -> None:
    scenario = built(name)
    for rank, dump in scenario.dumps.items():
        entries = dump["entries"]
        ids = [e["record_id"] for e in entries]
        assert ids == list(range(ids[0], ids[0] + len(ids))) and ids[0] > 0  # a wrapped ring
        by_group: dict[str, list[dict[str, Any]]] = defaultdict(list)
        members = _member_ids(dump)
        for e in entries:
            by_group[e["process_group"][0]].append(e)
        for group, items in by_group.items():
            kind = scenario.topology.groups[group].kind
            works = [e for e in items if not _member(e, members)]
            key = "p2p_seq_id" if kind is GroupKind.PP else "collective_seq_id"
            seqs = [e[key] for e in works]
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), (rank, group)
            other = "collective_seq_id" if kind is GroupKind.PP else "p2p_seq_id"
            assert {e[other] for e in items} == {0}
            status = dump["pg_status"][str(items[0]["pg_id"])]
            assert status["last_enqueued_collective"] == seqs[-1]


@pytest.mark.parametrize("name", NAMES, ids=NAMES)
def test_coalesced_members_precede_their_closing_entry(name: str) -> None:
    scenario = built(name)
    seen_batch = seen_gather = False
    for dump in scenario.dumps.values():
        entries = dump["entries"]
        members_ids = _member_ids(dump)
        for i, e in enumerate(entries):
            if e["profiling_name"] == "nccl:coalesced":
                members = _members_before(entries, i, "p2p_seq_id")
                assert members or i < 4  # the ring may start inside the batch
                assert all(m["is_p2p"] for m in members)
                assert not e["is_p2p"] and e["input_sizes"] == [] and e["output_dtypes"] == []
                assert not members or e["op_id"] == members[-1]["op_id"]
                seen_batch = True
            elif e["profiling_name"] == "nccl:ALLGATHER_coalesced":
                members = _members_before(entries, i, "collective_seq_id")
                if i >= len(uneven_lengths(scenario.topology.layout.tp)):
                    assert [m["input_sizes"][0][0] for m in members] == list(
                        uneven_lengths(scenario.topology.layout.tp))
                assert all(not m["is_p2p"] and m["profiling_name"] == "nccl:_broadcast_oop" for m in members)
                seen_gather = True
            if _member(e, members_ids):
                assert (e["state"], e["retired"], e["time_discovered_started_ns"],
                        e["time_discovered_completed_ns"]) == ("scheduled", False, None, None)
                assert "duration_ms" not in e
    assert seen_batch and seen_gather


@pytest.mark.parametrize("name", NAMES, ids=NAMES)
def test_p2p_entries_name_group_local_ranks(name: str) -> None:
    scenario = built(name)
    for rank, dump in scenario.dumps.items():
        for e in dump["entries"]:
            match = _P2P.match(e["profiling_name"])
            assert bool(match) == e["is_p2p"]
            if not match:
                continue
            group = scenario.topology.groups[e["process_group"][0]]
            verb, me, arrow, peer = match.groups()
            assert (verb == "send") == (arrow == "->")
            assert int(me) == group.group_rank(rank) and abs(int(peer) - int(me)) == 1
            assert e["input_sizes"] == e["output_sizes"] == [[1024, 1, 4096]]


@pytest.mark.parametrize("name", NAMES, ids=NAMES)
def test_states_follow_the_timing_setting(name: str) -> None:
    scenario = built(name)
    states = {e["state"] for d in scenario.dumps.values() for e in d["entries"]}
    has_duration = any("duration_ms" in e for d in scenario.dumps.values() for e in d["entries"])
    started = {s["last_started_collective"] for d in scenario.dumps.values() for s in d["pg_status"].values()}
    if scenario.spec.timing:
        assert has_duration and (started != {-1})
        if scenario.spec.trigger is DumpTrigger.TIMEOUT:
            assert "started" in states
    else:
        assert "started" not in states and not has_duration and started == {-1}
        assert all(e["time_discovered_started_ns"] is None for d in scenario.dumps.values()
                   for e in d["entries"])


def test_json_variant_follows_dump_json() -> None:
    scenario = built("pp_p2p_hang")
    for rank, dump in scenario.dumps.items():
        text = encode_dump(dump, DumpFormat.JSON).decode()
        data = json.loads(text)
        assert text == json.dumps(data, sort_keys=True, separators=(",", ":"))
        assert data["nccl_comm_state"] == {} and "nccl_comm_state" not in dump
        assert all(isinstance(v, str) for s in data["pg_status"].values() for v in s.values())
        for mine, theirs in zip(dump["entries"], data["entries"], strict=True):
            assert "frames" in mine and "frames" not in theirs
            assert theirs["process_group"] == list(mine["process_group"])
            for key in ("time_discovered_started_ns", "time_discovered_completed_ns"):
                assert theirs[key] == (mine[key] or 0)
            rest = {k: v for k, v in mine.items() if k not in ("frames", "process_group",
                                                                 "time_discovered_started_ns",
                                                                 "time_discovered_completed_ns")}
            assert {k: theirs[k] for k in rest} == rest


def test_builds_are_byte_identical() -> None:
    again = build_scenario("withheld_tp")
    first = built("withheld_tp")
    assert again.dump_ns == first.dump_ns
    for rank in first.dumps:
        for fmt in FORMATS:
            assert encode_dump(again.dumps[rank], fmt) == encode_dump(first.dumps[rank], fmt)


def test_cli_writes_dumps_manifest_and_expected(tmp_path: Path) -> None:
    assert main([str(tmp_path), "--scenario", "dead_host"]) == 0
    for fmt in FORMATS:
        folder = tmp_path / "dead_host" / fmt.value
        names = sorted(p.name for p in folder.iterdir())
        assert len(names) == 56 + 2 and "manifest.json" in names and "expected.json" in names
        manifest = load_manifest(folder / "manifest.json")
        assert manifest.world_size == 64 and len(manifest.ranks) == 64
        assert manifest.ranks[16].dumped_at is None and manifest.ranks[15].dumped_at is not None
        assert sum(1 for i in manifest.ranks.values() if i.host == "gpu-node-003") == 8
        assert set(manifest.process_groups) == set(built("dead_host").topology.groups)
        expected = json.loads((folder / "expected.json").read_text())
        assert expected["verdict"] == "incomplete"
        assert expected["culprits"] == {str(r): "stopped_reporting" for r in range(16, 24)}


# -- helpers ----------------------------------------------------------------------------------


def _member_ids(dump: dict[str, Any]) -> set[int]:
    """record_ids of coalesced members (null events): the entries just before each closing
    ``nccl:coalesced`` / ``nccl:*_coalesced`` entry that share its sequence id."""
    entries = dump["entries"]
    found: set[int] = set()
    for i, e in enumerate(entries):
        name = e["profiling_name"]
        if name == "nccl:coalesced":
            found |= {m["record_id"] for m in _members_before(entries, i, "p2p_seq_id")}
        elif name.endswith("_coalesced") and name[5:].split("_")[0].isupper():
            found |= {m["record_id"] for m in _members_before(entries, i, "collective_seq_id")}
    # A ring that starts inside a group still shows members whose closing entry is in the ring.
    return found


def _member(e: dict[str, Any], members: set[int]) -> bool:
    return e["record_id"] in members


def _members_before(entries: list[dict[str, Any]], index: int, key: str) -> list[dict[str, Any]]:
    closing = entries[index]
    members: list[dict[str, Any]] = []
    for e in reversed(entries[:index]):
        consecutive = e["record_id"] == closing["record_id"] - len(members) - 1
        if not consecutive or e["process_group"] != closing["process_group"] or e[key] != closing[key]:
            break
        members.insert(0, e)
    return members


def _is_stale(scenario: BuiltScenario, rank: int) -> bool:
    return any(f.kind is FaultKind.STALE and rank in f.ranks for f in scenario.spec.faults)


def _name_of(dump: dict[str, Any], pg_id: int) -> str:
    for e in dump["entries"]:
        if e["pg_id"] == pg_id:
            return str(e["process_group"][0])
    return "0"  # the default group only ran the start-up barrier, long out of the ring
