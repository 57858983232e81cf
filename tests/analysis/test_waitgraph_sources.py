"""The wait-for graph's condensation: a cycle of waits names only the ranks it hangs from."""

from __future__ import annotations

from denpex.analysis.compare import Blockage, BlockageKind
from denpex.analysis.waitgraph import find_culprits


def tie(group: str, ranks: tuple[int, ...]) -> Blockage:
    return Blockage(group, 7, BlockageKind.OVERDUE, "nccl:all_to_all", ranks, ranks, tie=True)


def wait(group: str, waiting: tuple[int, ...], targets: tuple[int, ...],
         kind: str = BlockageKind.BEHIND) -> Blockage:
    return Blockage(group, 8, kind, "nccl:all_gather", waiting, targets)


def named(blockages: list[Blockage]) -> dict[int, int]:
    return {c.rank: c.component_size for c in find_culprits(blockages)}


def test_a_tie_alone_stays_ambiguous() -> None:
    assert named([tie("ep", (4, 5, 6, 7))]) == {4: 4, 5: 4, 6: 4, 7: 4}


def test_a_directed_wait_inside_the_tie_names_its_end() -> None:
    blockages = [tie("ep", (4, 5, 6, 7)), wait("ep", (4, 6, 7), (5,), BlockageKind.STOPPED),
                 wait("tp", (4,), (5,)), tie("tp2", (6, 7)), wait("pp", (12,), (4,))]
    culprits = find_culprits(blockages)
    assert [(c.rank, c.component_size) for c in culprits] == [(5, 1)]
    # The wait that singled it out comes first in its reasons, ties last.
    assert culprits[0].blocking[0].kind == BlockageKind.STOPPED and culprits[0].blocking[-1].tie


def test_two_cycles_each_with_a_source() -> None:
    blockages = [tie("ep0", (0, 1, 2, 3)), wait("ep0", (0, 1, 3), (2,), BlockageKind.STOPPED),
                 tie("ep3", (12, 13, 14, 15)), wait("ep3", (12, 14, 15), (13,), BlockageKind.STOPPED),
                 wait("dp", (8, 10), (12, 14)), wait("pp", (9,), (1,))]
    assert named(blockages) == {2: 1, 13: 1}


def test_a_directed_cycle_inside_the_tie_stays_a_pair() -> None:
    blockages = [tie("g", (0, 1, 2)), wait("a", (0,), (1,)), wait("b", (1,), (0,))]
    assert named(blockages) == {0: 2, 1: 2}


def test_a_directed_wait_out_of_a_tie_does_not_pick_the_waiter() -> None:
    """Rank 3 waits on 9 outside the tie: the tie is not terminal, 9 is the culprit."""
    assert named([tie("g", (1, 2, 3)), wait("h", (3,), (9,))]) == {9: 1}


def test_long_chains_and_big_cycles_do_not_recurse() -> None:
    n = 40_000
    chain = [wait(f"c{i}", (i,), (i + 1,)) for i in range(n)]
    assert named(chain) == {n: 1}
    ring = [tie("world", tuple(range(n))), wait("ep", tuple(range(1, n)), (0,), BlockageKind.STOPPED)]
    assert named(ring) == {0: 1}
