"""The synthetic expansion at small scale: 256 ranks (tp=8, pp=4, dp=8), short rings.

Checks that every file is a safe, torch-shaped pickle, that the structure is right (wrapped rings,
contiguous sequence ids per group, NCCL-style pg_config with global ranks, a valid manifest),
that each fault is where its scenario puts it, and that ``triage_path`` finds it.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from denpex.analysis.triage import TriageOptions, triage_path
from denpex.evidence.manifest import load_manifest
from denpex.evidence.safe_pickle import safe_loads
from testkit.generators.expansion import DEFAULT_PREFIX, GeneratedSet, generate_dump_set
from testkit.generators.fr_template import load_template, template_from_dump
from testkit.generators.hang_model import (
    ExpansionError,
    GroupKind,
    ParallelLayout,
    Scenario,
    culprit_rank,
)
from testkit.generators.torch_pickle import encode_torch_style

TEMPLATE = Path(__file__).resolve().parents[2] / "benchmarks" / "templates" / "gloo_rank0_2000.pkl.gz"
WORLD = 256
RING = 300
LAYOUT = ParallelLayout(WORLD)

ALL = [pytest.param(s, id=s.value) for s in Scenario]


@pytest.fixture(scope="module")
def dump_sets(tmp_path_factory: pytest.TempPathFactory) -> dict[Scenario, GeneratedSet]:
    template = load_template(TEMPLATE)
    root = tmp_path_factory.mktemp("expansion")
    return {
        s: generate_dump_set(root / s.value, world_size=WORLD, scenario=s, template=template,
                             ring_size=RING, workers=2)
        for s in Scenario
    }


def _load(made: GeneratedSet, rank: int) -> dict[str, Any]:
    dump = safe_loads((made.path / f"{DEFAULT_PREFIX}{rank}").read_bytes())
    assert isinstance(dump, dict)
    return dump


def _last(made: GeneratedSet, rank: int) -> dict[str, Any]:
    entry: dict[str, Any] = _load(made, rank)["entries"][-1]
    return entry


def _culprit(dump_sets: dict[Scenario, GeneratedSet], scenario: Scenario) -> tuple[GeneratedSet, int]:
    rank = culprit_rank(LAYOUT, scenario)
    assert rank is not None
    return dump_sets[scenario], rank


def _seq(entry: dict[str, Any]) -> int:
    return int(entry["p2p_seq_id"] if entry["is_p2p"] else entry["collective_seq_id"])


def test_writer_reproduces_a_real_dump_byte_for_byte() -> None:
    raw = gzip.decompress(TEMPLATE.read_bytes())
    assert encode_torch_style(safe_loads(raw)) == raw


@pytest.mark.parametrize("scenario", ALL)
def test_every_file_is_a_wrapped_consistent_ring(
    dump_sets: dict[Scenario, GeneratedSet], scenario: Scenario
) -> None:
    made = dump_sets[scenario]
    files = sorted(made.path.glob(f"{DEFAULT_PREFIX}*"))
    assert len(files) == made.files == WORLD - len(made.expected.missing_ranks)
    manifest = load_manifest(made.path / "manifest.json")
    assert manifest.world_size == WORLD
    assert len(manifest.process_groups) == 1 + sum(
        LAYOUT.group_count(k) for k in (GroupKind.TP, GroupKind.DP, GroupKind.PP))
    for path in files:
        rank = int(path.name.removeprefix(DEFAULT_PREFIX))
        raw = path.read_bytes()
        dump = safe_loads(raw)
        assert isinstance(dump, dict)
        assert dump["version"] == "2.10"
        entries = dump["entries"]
        assert len(entries) == RING
        ids = [e["record_id"] for e in entries]
        assert ids[0] > 0 and ids == list(range(ids[0], ids[0] + RING))  # wrapped, contiguous
        config = dump["pg_config"]
        assert sorted(config) == list(config) and len(config) == 4
        for name, group in config.items():
            ranks = json.loads(group["ranks"])
            assert rank in ranks and group["name"] == name
            assert list(manifest.process_groups[name].ranks) == ranks
        by_group: dict[str, list[int]] = defaultdict(list)
        for entry in entries:
            name, desc = entry["process_group"]
            assert config[name]["desc"] == desc
            by_group[name].append(_seq(entry))
        for name, seqs in by_group.items():
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), f"rank {rank} group {name}"
        if rank % 37 == 0:  # the patched bytes equal a from-scratch torch-style encoding
            assert encode_torch_style(dump) == raw


def _tp_peers(rank: int) -> list[int]:
    s, d, _ = LAYOUT.coords(rank)
    return [LAYOUT.rank_of(s, d, t) for t in range(LAYOUT.tp) if LAYOUT.rank_of(s, d, t) != rank]


def test_healthy_set_has_nothing_in_flight(dump_sets: dict[Scenario, GeneratedSet]) -> None:
    made = dump_sets[Scenario.HEALTHY]
    for rank in range(0, WORLD, 17):
        entries = _load(made, rank)["entries"]
        assert all(e["state"] == "completed" and e["retired"] for e in entries)
        assert entries[-1]["profiling_name"] == "nccl:_all_gather_base"


def test_withheld_rank_is_idle_while_its_peers_wait_for_it(
    dump_sets: dict[Scenario, GeneratedSet],
) -> None:
    made, culprit = _culprit(dump_sets, Scenario.WITHHELD)
    mine = _last(made, culprit)
    assert mine["state"] == "completed" and mine["retired"]
    for peer in _tp_peers(culprit):
        theirs = _last(made, peer)
        assert theirs["process_group"][1] == "mesh_tp" and theirs["state"] == "started"
        assert not theirs["retired"]
    # The culprit's own tensor-parallel count stops one short of what its peers entered.
    tp_seqs = [e["collective_seq_id"] for e in _load(made, culprit)["entries"]
               if e["process_group"][1] == "mesh_tp"]
    assert _last(made, _tp_peers(culprit)[0])["collective_seq_id"] == tp_seqs[-1] + 1


def test_mismatched_rank_differs_in_size_at_the_same_seq(
    dump_sets: dict[Scenario, GeneratedSet],
) -> None:
    made, culprit = _culprit(dump_sets, Scenario.MISMATCH)
    s, _, t = LAYOUT.coords(culprit)
    peer = LAYOUT.rank_of(s, 0, t)  # same data-parallel group
    mine, theirs = _last(made, culprit), _last(made, peer)
    assert mine["profiling_name"] == theirs["profiling_name"] == "nccl:_reduce_scatter_base"
    assert mine["collective_seq_id"] == theirs["collective_seq_id"]
    assert mine["state"] == theirs["state"] == "started"
    assert mine["input_sizes"] != theirs["input_sizes"]


def test_missing_rank_has_no_file_and_peers_wait(dump_sets: dict[Scenario, GeneratedSet]) -> None:
    made, culprit = _culprit(dump_sets, Scenario.MISSING)
    assert made.expected.missing_ranks == [culprit]
    assert not (made.path / f"{DEFAULT_PREFIX}{culprit}").exists()
    for peer in _tp_peers(culprit):
        assert _last(made, peer)["state"] == "started"


def test_stalled_rank_is_stuck_in_an_op_its_peers_finished(
    dump_sets: dict[Scenario, GeneratedSet],
) -> None:
    made, culprit = _culprit(dump_sets, Scenario.STALLED)
    mine = _last(made, culprit)
    assert mine["process_group"][1] == "mesh_tp" and mine["state"] == "started"
    for peer in _tp_peers(culprit):
        done = {e["collective_seq_id"]: e for e in _load(made, peer)["entries"]
                if e["process_group"][1] == "mesh_tp"}
        assert done[mine["collective_seq_id"]]["state"] == "completed"


def test_p2p_neighbours_block_in_send_and_recv(dump_sets: dict[Scenario, GeneratedSet]) -> None:
    made, culprit = _culprit(dump_sets, Scenario.P2P)
    s, d, t = LAYOUT.coords(culprit)
    assert _last(made, culprit)["state"] == "completed"
    sender = _last(made, LAYOUT.rank_of(s + 1, d, t))
    receiver = _last(made, LAYOUT.rank_of(s - 1, d, t))
    assert sender["profiling_name"] == f"nccl:send {s + 1}->{s}" and sender["state"] == "started"
    assert receiver["profiling_name"] == f"nccl:recv {s - 1}<-{s}"
    assert receiver["state"] == "started" and receiver["is_p2p"]
    assert sender["collective_seq_id"] == 0 and sender["p2p_seq_id"] > 0


@pytest.mark.parametrize("scenario", ALL)
def test_triage_finds_the_injected_fault(
    dump_sets: dict[Scenario, GeneratedSet], scenario: Scenario
) -> None:
    made = dump_sets[scenario]
    # In this process: the verdict is under test, not the worker pool (test_isolated_workers.py).
    result = triage_path(made.path, options=TriageOptions(workers=1))
    found = {c.rank: c.kind for c in result.candidates}
    assert (result.verdict, found) == (made.expected.verdict, made.expected.culprits)


@pytest.mark.parametrize(
    ("world", "tp", "pp"),
    [pytest.param(100, 8, 4, id="not-a-multiple"), pytest.param(32, 8, 4, id="dp-of-one")],
)
def test_layout_refuses_sizes_that_do_not_split(world: int, tp: int, pp: int) -> None:
    with pytest.raises(ExpansionError, match="does not split"):
        ParallelLayout(world, tp=tp, pp=pp)


def test_template_without_the_needed_ops_is_refused() -> None:
    with pytest.raises(ExpansionError, match="lacks entries"):
        template_from_dump({"entries": [{"profiling_name": "gloo:barrier", "frames": []}]})
