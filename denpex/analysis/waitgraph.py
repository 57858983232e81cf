"""The wait-for graph: ranks point at blockages, blockages point at the ranks they wait for.

Culprits are the ranks in *terminal* strongly connected components: they wait on no one outside
their component. A single rank there is pinned down; several ranks in one component (a 1-vs-1
mismatch, an all-in collective that timed out, a cross-group deadlock) cannot be told apart.

A cycle of waits explains nothing by itself. When a terminal component holds several ranks, it
is condensed again without its *ties* (all-in ops where every member waits on every other: they
carry no direction) and the culprits are the ranks of the *source* sub-components, the ones that
directed waits inside the cycle end on: the members that never got past a group's op while the
others did, or a peer that never posted its side. Only when no directed wait picks anyone out
(a 1-vs-1 mismatch, a timed-out op everyone is in) does the whole component stay ambiguous.

Blockages are nodes rather than rank-to-rank edges so that a group of 32,768 ranks waiting on a
few laggards costs linear, not quadratic, edges. Both condensations are linear in the graph.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from denpex.analysis.blockage import Blockage, BlockageKind

__all__ = ["Culprit", "analyze", "find_culprits"]


@dataclass(frozen=True, slots=True)
class Culprit:
    """A rank that ends a wait-for chain, the blockages that wait on it, and its component size."""

    rank: int
    blocking: tuple[Blockage, ...]
    component_size: int


def find_culprits(blockages: Sequence[Blockage], directions: Sequence[Blockage] = ()) -> list[Culprit]:
    """Ranks in terminal components of the wait-for graph, sorted by rank."""
    return analyze(blockages, directions)[0]


def analyze(blockages: Sequence[Blockage], directions: Sequence[Blockage] = ()
            ) -> tuple[list[Culprit], list[frozenset[int]]]:
    """The culprits (as ``find_culprits``) and, per blockage, the culprit ranks its waits end on.

    ``directions`` are waits of ops queued behind their rank's own unfinished op
    (``denpex.analysis.unreached``): they never make a component non-terminal, but inside a
    terminal cycle they are directed waits like any other, and they name the ranks they point at
    among the reasons.

    Tarjan emits a component only after every component it reaches, so one pass in that order
    gives each component the culprits below it (linear in the graph, plus the sets' sizes).
    """
    graph = _build(blockages)
    components = _strongly_connected(graph)
    culprits = _culprits(graph, components, [*blockages, *directions], _inside(graph, directions, len(blockages)))
    named = {c.rank for c in culprits}
    component_of = {node: i for i, component in enumerate(components) for node in component}
    below: list[frozenset[int]] = []
    for i, component in enumerate(components):
        own = frozenset(n for n in component if isinstance(n, int) and n in named)
        parts = {id(below[j]): below[j] for node in component for succ in graph[node]
                 if (j := component_of[succ]) != i}
        below.append(_union(own, list(parts.values())))
    return culprits, [below[component_of[("b", i)]] for i in range(len(blockages))]


def _union(own: frozenset[int], parts: list[frozenset[int]]) -> frozenset[int]:
    """The union, sharing the largest set when it already holds the others: a rank of a large job
    usually waits in the world group and in a small group whose laggards the world group waits on
    too, and copying the world's set once per rank would make this quadratic."""
    if not parts:
        return own
    largest = max(parts, key=len)
    rest = [p for p in parts if p is not largest]
    if own <= largest and all(p <= largest for p in rest):
        return largest
    return own.union(largest, *rest)


_Direction = tuple["_Node", tuple[int, ...], tuple[int, ...]]


def _inside(graph: dict[_Node, list[_Node]], directions: Sequence[Blockage], offset: int) -> list[_Direction]:
    """The directions as (node, waiting ranks, target rank), numbered after the blockages; only
    ranks that are nodes of the graph (a rank that only a direction points at waits in nothing
    and nobody is blocked on it: it stays out).

    Only a direction at one rank is kept: the members that went past an op all their peers hold
    point at the one that never did. Several that never did (three of four members synchronise
    after the op, one does not) are a program's choice as much as a stopped CPU, and say nothing
    about any one of them (the rule ``compare.tie_breaks.stopped_at`` keeps too)."""
    out: list[_Direction] = []
    for index, direction in enumerate(directions, start=offset):
        targets = tuple(t for t in dict.fromkeys(direction.targets) if t in graph)
        waiting = tuple(r for r in direction.waiting if r in graph)
        if len(targets) == 1 and len(set(direction.targets)) == 1 and waiting:
            out.append((("b", index), waiting, targets))
    return out


def _culprits(graph: dict[_Node, list[_Node]], components: list[list[_Node]],
              blockages: Sequence[Blockage], directions: list[_Direction]) -> list[Culprit]:
    # Rank -> the blockages that wait on it, built once: scanning every blockage per culprit is
    # quadratic when a dead host's ranks are the targets of a world-sized group.
    waited_on: dict[int, list[Blockage]] = {}
    for blockage in blockages:
        for rank in dict.fromkeys(blockage.targets):
            waited_on.setdefault(rank, []).append(blockage)
    # Each direction belongs to the component that holds all its targets (one pass, linear).
    component_of = {node: i for i, component in enumerate(components) for node in component}
    within: dict[int, list[_Direction]] = {}
    for node, waiting, targets in directions:
        home = component_of[targets[0]]
        if all(component_of[t] == home for t in targets):
            inside = tuple(r for r in waiting if component_of[r] == home)
            if inside:
                within.setdefault(home, []).append((node, inside, targets))
    culprits = []
    for i, component in enumerate(components):
        members = set(component)
        if any(succ not in members for node in component for succ in graph[node]):
            continue
        groups = (_sources(component, members, graph, blockages, within.get(i, []))
                  if len(component) > 1 else [component])
        refined = groups[0] is not component
        # The directions that ran inside this cycle (others point at its ranks from outside it).
        used = {id(blockages[node[1]]) for node, _, _ in within.get(i, []) if isinstance(node, tuple)}
        for group in groups:
            ranks = sorted(n for n in group if isinstance(n, int))
            for rank in ranks:
                blocking = waited_on.get(rank, [])
                if refined:
                    # The directed waits that picked the rank out of its cycle explain it best.
                    blocking = sorted(blocking, key=lambda b: (
                        b.tie, b.kind not in _DIRECTING, b.kind is BlockageKind.UNREACHED and id(b) not in used))
                culprits.append(Culprit(rank, tuple(blocking), len(ranks)))
    return sorted(culprits, key=lambda c: c.rank)


def _sources(component: list[_Node], members: set[_Node], graph: dict[_Node, list[_Node]],
             blockages: Sequence[Blockage], directions: list[_Direction]) -> list[list[_Node]]:
    """The source sub-components of a terminal component, or the component itself if none.

    Ties are dropped; what is left are directed waits, with the directions between the
    component's ranks. A sub-component that nothing directed leaves and that some
    directed wait ends on is a source: the cycle hangs from it.
    """
    def is_tie(node: _Node) -> bool:
        return isinstance(node, tuple) and blockages[node[1]].tie

    directed = {node: [s for s in graph[node] if s in members and not is_tie(s)]
                for node in component if not is_tie(node)}
    for node, waiting, targets in directions:
        directed[node] = list(targets)
        for rank in waiting:
            directed[rank] = [*directed[rank], node]
    targeted = {s for node, succs in directed.items() if isinstance(node, tuple) for s in succs}
    sources = [sub for sub in _strongly_connected(directed)
               if not any(s not in sub for node in sub for s in directed[node])
               and any(node in targeted for node in sub)]
    has_rank = [sub for sub in sources if any(isinstance(n, int) for n in sub)]
    return has_rank or [component]


_Node = int | tuple[str, int]
# Directed waits found inside an all-in op: they pick a member out of it.
_DIRECTING = frozenset({BlockageKind.STOPPED, BlockageKind.LAGGING, BlockageKind.UNREACHED})


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
