"""The per-rank summary on NCCL semantics: batches, coalesced members, timing, ring wrap."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from denpex.analysis.rank_runs import compress_ranks, expand_ranks, parse_rank_list
from denpex.analysis.summary import OpKind, summarize_dump
from denpex.evidence.fr_dump import decode_dump
from dumps import dump, entry


def _summary(entries: list[dict[str, Any]], **extra: Any):  # noqa: ANN202
    return summarize_dump(decode_dump(pickle.dumps(dump(entries, **extra), protocol=2), source="r"), rank=0)


def _p2p(name: str, psid: int, record_id: int, *, state: str = "scheduled", retired: bool = False) -> dict[str, Any]:
    return entry("pp", 0, op=name, record_id=record_id, p2p_seq_id=psid, is_p2p=True, state=state,
                 retired=retired)


def test_batch_members_take_the_state_of_their_closing_entry() -> None:
    done = [_p2p("nccl:send 0->1", 1, 0), _p2p("nccl:recv 0<-1", 1, 1),
            entry("pp", 0, op="nccl:coalesced", record_id=2, p2p_seq_id=1, sizes=[], state="completed",
                  retired=True)]
    stuck = [_p2p("nccl:send 0->1", 2, 3), _p2p("nccl:recv 0<-1", 2, 4),
             entry("pp", 0, op="nccl:coalesced", record_id=5, p2p_seq_id=2, sizes=[], retired=False)]
    group = _summary(done + stuck).groups["pp"]
    assert [(op.kind, op.p2p_seq_id, op.in_batch) for op in group.pending] == [
        (OpKind.SEND, 2, True), (OpKind.RECV, 2, True)]
    assert group.last_enqueued == -1, "a p2p batch is not a collective"


def test_slow_path_coalesced_members_are_not_pending_once_closed() -> None:
    members = [entry("tp", 7, op="nccl:_broadcast_oop", record_id=i, retired=False) for i in range(4)]
    closing = entry("tp", 7, op="nccl:ALLGATHER_coalesced", record_id=4, sizes=[], state="completed", retired=True)
    group = _summary(members + [closing]).groups["tp"]
    assert group.pending == [] and group.last_completed == 7


def test_p2p_names_give_group_local_ranks() -> None:
    group = _summary([_p2p("nccl:recv 2<-1", 5, 0)]).groups["pp"]
    [op] = group.pending
    assert (op.kind, op.local_rank, op.peer_local_rank) == (OpKind.RECV, 2, 1)


def test_live_discovery_time_is_the_dump_time_with_timing_on() -> None:
    stuck = entry("tp", 3, retired=False, state="started", record_id=9)
    stuck["time_discovered_started_ns"] = 2_000_000_000_000_000_000
    summary = _summary([entry("tp", 2, record_id=8), stuck])
    assert summary.dumped_at_ns == 2_000_000_000_000_000_000 and summary.timing_enabled


def test_a_wrapped_ring_is_detected_from_record_ids() -> None:
    assert _summary([entry("0", 50, record_id=1200)]).ring_wrapped
    assert not _summary([entry("0", 1, record_id=0)]).ring_wrapped


def test_pg_config_rank_lists_are_kept_as_runs() -> None:
    cfg = {"7": {"name": "7", "desc": "mesh_dp", "ranks": str(list(range(3, 4096, 8)))}}
    summary = _summary([entry("7", 1, record_id=0, op="nccl:all_reduce")], pg_config=cfg)
    assert summary.groups["7"].config_ranks == ((3, 512, 8),)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("[0, 1, 2, 3]", ((0, 4, 1),), id="contiguous"),
        pytest.param("[5]", ((5, 1, 1),), id="single"),
        pytest.param("[]", None, id="empty-says-nothing"),
        pytest.param("[1, 1]", None, id="repeated-rank"),
        pytest.param("[0, -1]", None, id="negative"),
        pytest.param("__import__('os')", None, id="never-evaluated"),
        pytest.param("[0, 1.5]", None, id="not-an-int"),
    ],
)
def test_parse_rank_list(text: str, expected: Any) -> None:
    assert parse_rank_list(text) == expected


@pytest.mark.parametrize("ranks", [[0, 1, 2, 3, 8, 16, 24], [9, 3, 4, 5], [7], [0, 2, 4, 5, 6, 100]])
def test_runs_round_trip_in_order(ranks: list[int]) -> None:
    assert list(expand_ranks(compress_ranks(ranks))) == ranks
