"""The wait-for graph: ranks point at blockages, blockages point at the ranks they wait for.

Culprits are the ranks in *terminal* strongly connected components: they wait on no one outside
their component. A single rank there is pinned down; several ranks in one component (a 1-vs-1
mismatch, an all-in collective that timed out, a cross-group deadlock) cannot be told apart.

Blockages are nodes rather than rank-to-rank edges so that a group of 32,768 ranks waiting on a
few laggards costs linear, not quadratic, edges.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from denpex.analysis.compare import Blockage

__all__ = ["Culprit", "find_culprits"]


@dataclass(frozen=True, slots=True)
class Culprit:
    """A rank that ends a wait-for chain, the blockages that wait on it, and its component size."""

    rank: int
    blocking: tuple[Blockage, ...]
    component_size: int


def find_culprits(blockages: Sequence[Blockage]) -> list[Culprit]:
    """Ranks in terminal components of the wait-for graph, sorted by rank."""
    graph = _build(blockages)
    components = _strongly_connected(graph)
    # Rank -> the blockages that wait on it, built once: scanning every blockage per culprit is
    # quadratic when a dead host's ranks are the targets of a world-sized group.
    waited_on: dict[int, list[Blockage]] = {}
    for blockage in blockages:
        for rank in dict.fromkeys(blockage.targets):
            waited_on.setdefault(rank, []).append(blockage)
    culprits = []
    for component in components:
        members = set(component)
        if any(succ not in members for node in component for succ in graph[node]):
            continue
        ranks = sorted(n for n in component if isinstance(n, int))
        for rank in ranks:
            culprits.append(Culprit(rank, tuple(waited_on.get(rank, ())), len(ranks)))
    return sorted(culprits, key=lambda c: c.rank)


_Node = int | tuple[str, int]


def _build(blockages: Sequence[Blockage]) -> dict[_Node, list[_Node]]:
    graph: dict[_Node, list[_Node]] = {}
    for index, blockage in enumerate(blockages):
        node: _Node = ("b", index)
        graph[node] = list(dict.fromkeys(blockage.targets))
        for rank in blockage.waiting:
            graph.setdefault(rank, []).append(node)
        for rank in blockage.targets:
            graph.setdefault(rank, [])
    return graph


def _strongly_connected(graph: dict[_Node, list[_Node]]) -> list[list[_Node]]:
    """Tarjan's algorithm, iterative so that long wait-for chains cannot hit the recursion limit."""
    index: dict[_Node, int] = {}
    low: dict[_Node, int] = {}
    on_stack: set[_Node] = set()
    stack: list[_Node] = []
    components: list[list[_Node]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work: list[tuple[_Node, Iterable[_Node]]] = [(root, iter(graph[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            advanced = False
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = counter
                    counter += 1
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(graph[succ])))
                    advanced = True
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(component)
    return components
