"""Who is behind a simulated hang, read from the simulation itself (not from the dumps).

This is an independent check of each scenario's declared culprits: it follows the wait-for graph
the simulation actually produced. Every rank with an op in flight waits on the ranks its head op
needs and that do not have their side at the head of their own stream. A rank that waits on no
one is a root:

- its CPU hung with nothing in flight -> ``not_entered`` (or ``stopped_reporting`` when its
  evidence is missing or stale);
- a collective that every member has started but whose members disagree -> the members outside
  the strict majority signature are ``mismatch``; with no strict majority, all of them are.

Only roots that some waiting rank reaches are culprits; victims never are.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from denpex.analysis.models import CandidateKind
from testkit.generators.nccl_sim import Simulation, Work, WorkKind

__all__ = ["wait_for_graph", "culprits_from_simulation"]


def wait_for_graph(sim: Simulation) -> tuple[dict[int, set[int]], dict[int, CandidateKind]]:
    """Edges ``rank -> ranks it waits on``, and the mismatch culprits found on the way."""
    edges: dict[int, set[int]] = defaultdict(set)
    mismatched: dict[int, CandidateKind] = {}
    for rank in sim.programs:
        stuck = sim.incomplete(rank)
        if not stuck:
            continue
        head = stuck[0]
        if head.kind is WorkKind.COLLECTIVE:
            edges[rank] |= _collective_waits(sim, head, mismatched)
        else:
            edges[rank] |= _p2p_waits(sim, head)
    return dict(edges), mismatched


def culprits_from_simulation(sim: Simulation, no_evidence: set[int]) -> dict[int, CandidateKind]:
    """The roots reachable from every waiting rank, with their kind."""
    edges, mismatched = wait_for_graph(sim)
    culprits = dict(mismatched)
    seen: set[int] = set()
    frontier = [r for r in edges]
    while frontier:
        rank = frontier.pop()
        if rank in seen:
            continue
        seen.add(rank)
        targets = edges.get(rank, set())
        frontier.extend(targets)
        if not targets and rank not in mismatched and rank in sim.hung and not sim.incomplete(rank):
            culprits[rank] = (CandidateKind.STOPPED_REPORTING if rank in no_evidence
                              else CandidateKind.NOT_ENTERED)
    return culprits


def _collective_waits(sim: Simulation, head: Work, mismatched: dict[int, CandidateKind]) -> set[int]:
    group = head.group or ""
    members = sim.topology.groups[group].ranks
    works = sim.collective_works(group, head.seq)
    absent = {m for m in members if m not in works or works[m].ready_ns is None}
    if absent:
        return absent
    votes = Counter(w.signature for w in works.values())
    (top, count), *rest = votes.most_common()
    strict = not rest or count > rest[0][1]
    for rank, work in works.items():
        if not strict or work.signature != top:
            mismatched[rank] = CandidateKind.MISMATCH
    return set()


def _p2p_waits(sim: Simulation, head: Work) -> set[int]:
    waits: set[int] = set()
    for key in head.pairs:
        _, src, dst, _ = key
        peer, peer_sends = (dst, False) if src == head.rank else (src, True)
        side = sim.pair_side(key, peer_sends)
        if side is None or side.ready_ns is None:
            waits.add(peer)
    return waits
